"""Faithful re-implementations of the source articles' own listings, labelled as such, to test them as
published (claims C3 and C22 of docs/CLAIMS.md). Written for this project from the articles' descriptions of
their code; they keep the articles' logic, including its slips, and are NOT used by the package itself.

- article 000 (see docs/SOURCES.md): a pure-Python verifier and loop on a 7-token two-state toy
  model. The article names the draft p and the target q (the reverse of this package). Its loop hands the
  verifier the target's first gamma distributions only (``q[:-1]``), and the verifier draws the bonus token from
  the last distribution it was given: the bonus comes from the distribution of position gamma, conditioned
  on the wrong prefix, instead of position gamma+1.
- article 004 (see docs/SOURCES.md): a numpy demo on a 5-token Dirichlet Markov model. It emits no
  bonus token after a fully accepted block, and checks losslessness by comparing transition-frequency errors.
"""
from __future__ import annotations

import random

import numpy as np

ARTICLE000_DRAFT = ([0.55, 0.15, 0.10, 0.07, 0.06, 0.04, 0.03], [0.30, 0.20, 0.15, 0.12, 0.10, 0.08, 0.05])
ARTICLE000_TARGET = ([0.50, 0.18, 0.11, 0.08, 0.06, 0.04, 0.03], [0.28, 0.22, 0.16, 0.11, 0.09, 0.08, 0.06])


def _choice(rng: random.Random, dist) -> int:
    """Inverse-CDF draw, as the article's helper does."""
    r, acc = rng.random(), 0.0
    for i, pi in enumerate(dist):
        acc += pi
        if r < acc:
            return i
    return len(dist) - 1


def _article000_dist(table, prev: int):
    return table[0] if prev == 0 else table[1]


def article000_verify(cand, draft_dists, target_dists, rng: random.Random):
    """The article's verifier (its p = draft, q = target). ``target_dists`` is what its loop passes: gamma
    distributions as published (then the bonus reuses position gamma's), gamma+1 when fixed."""
    accepted = []
    for i, tok in enumerate(cand):
        if rng.random() < min(1.0, target_dists[i][tok] / draft_dists[i][tok]):
            accepted.append(tok)
        else:
            residual = [max(t - d, 0.0) for t, d in zip(target_dists[i], draft_dists[i])]
            s = sum(residual)
            if s > 0:
                accepted.append(_choice(rng, [x / s for x in residual]))
            break
    if len(accepted) == len(cand):
        accepted.append(_choice(rng, target_dists[-1]))  # as published: the last of what it was given
    return accepted


def article000_decode(gamma: int = 4, max_len: int = 64, seed: int = 0, fixed: bool = False) -> list:
    """The article's loop. Output starts with the initial token 0, as the article's does."""
    rng, out, prev = random.Random(seed), [0], 0
    while len(out) < max_len:
        cand, d = [], prev
        for _ in range(gamma):
            tok = _choice(rng, _article000_dist(ARTICLE000_DRAFT, d))
            cand.append(tok)
            d = tok
        target = [_article000_dist(ARTICLE000_TARGET, prev)] + [_article000_dist(ARTICLE000_TARGET, t) for t in cand]
        draft = [_article000_dist(ARTICLE000_DRAFT, prev)] + [_article000_dist(ARTICLE000_DRAFT, t) for t in cand]
        given = target if fixed else target[:-1]  # the published loop passes q[:-1]
        out += article000_verify(cand, draft[:-1], given, rng)
        prev = out[-1]
    return out


def article000_tokens_at(n_runs: int, positions, gamma: int = 4, seed: int = 0, fixed: bool = False) -> np.ndarray:
    """(n_runs, len(positions)): tokens at the given output positions (1 = first after the initial 0) of
    independent runs of the listing. The bonus of the first round sits at position gamma + 1."""
    last = max(positions)
    runs = (article000_decode(gamma, last + 1, seed * 10_000_019 + i, fixed) for i in range(n_runs))
    return np.array([[run[j] for j in positions] for run in runs])


def article004_models(seed: int = 42, vocab: int = 5):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(vocab), size=vocab)
    Q = 0.6 * P + 0.4 * np.ones((vocab, vocab)) / vocab
    return rng, P, Q / Q.sum(axis=1, keepdims=True)


def article004_decode(steps: int, gamma: int, rng: np.random.Generator, P: np.ndarray, Q: np.ndarray,
                      leak: float = 0.0) -> list:
    """The article's demo loop: draft gamma from Q, accept with min(1, P/Q), resample from (P - Q)+, no bonus.
    ``leak`` > 0 is NOT the article's: a deliberately biased variant that accepts a draft token unchecked with
    that probability, to measure what the article's check can detect (C22)."""
    N = len(P)
    tokens = [int(rng.choice(N))]
    while len(tokens) < steps:
        prefix = tokens[-1]
        cand, ctx = [], prefix
        for _ in range(gamma):
            x = int(rng.choice(N, p=Q[ctx]))
            cand.append(x)
            ctx = x
        p_list = [P[prefix]] + [P[cand[i]] for i in range(gamma - 1)]
        idx = 0
        while idx < gamma and len(tokens) < steps:
            x = cand[idx]
            prev = cand[idx - 1] if idx > 0 else prefix
            if rng.random() < leak or rng.random() < min(1.0, p_list[idx][x] / Q[prev][x]):
                tokens.append(x)
                idx += 1
            else:
                residual = np.maximum(0.0, p_list[idx] - Q[prev])
                tokens.append(int(rng.choice(N, p=residual / residual.sum())))
                break
    return tokens


def transition_frequencies(seq, N: int) -> np.ndarray:
    T = np.zeros((N, N))
    for a, b in zip(seq, seq[1:]):
        T[a, b] += 1
    return T / T.sum(axis=1, keepdims=True)


def article004_check(steps: int = 20000, gamma: int = 5, seed: int = 42, leak: float = 0.0) -> dict:
    """The article's own check: mean |transition frequency - P| of the speculative sequence against that of a
    directly sampled one; 'lossless' if the first is at most 3 times the second. Also returns the p-value of a
    chi-square test of the speculative sequence's transition counts against P (``stats``)."""
    from .stats import transition_chi_square_pvalue

    rng, P, Q = article004_models(seed)
    seq = article004_decode(steps, gamma, rng, P, Q, leak)
    baseline = [int(rng.choice(len(P)))]
    for _ in range(steps - 1):
        baseline.append(int(rng.choice(len(P), p=P[baseline[-1]])))
    err_sd = np.abs(transition_frequencies(seq, len(P)) - P).mean()
    err_bl = np.abs(transition_frequencies(baseline, len(P)) - P).mean()
    return {"speculative_error": float(err_sd), "direct_error": float(err_bl), "passes": bool(err_sd <= 3 * err_bl),
            "chi_square_pvalue": transition_chi_square_pvalue(seq, P)}
