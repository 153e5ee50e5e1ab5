"""Invariant 1, lossless: exact enumeration and Monte Carlo through the real loop, and the mutation check.

Statistical design (Monte Carlo): N = 200,000 independent runs of ``speculative_generate`` (one batch, the very
loop real models run, on toy Markov models), the joint law of the first 3 emitted tokens (gamma = 2, so the
three tokens span round boundaries), Pearson chi-square against the target's exact law, cells with an expected
count under 5 merged. The test passes at p > 1e-3 (false-alarm rate 0.1%; the seed is fixed, so the outcome
is deterministic). Power: for each broken verifier whose exact law we can enumerate, the noncentral
chi-square power of this very test at N = 200,000 and level 1e-3 is computed and must exceed 0.99; each one
is then run and must be rejected at p < 1e-6.
"""
import importlib

import numpy as np
import pytest
import torch
from scipy import stats

import specdec_lite as sd
from specdec_lite.exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference
from specdec_lite.toy import MarkovLM, article000_pair, article004_pair, random_pair

verify_module = importlib.import_module("specdec_lite.verify")
decode_module = importlib.import_module("specdec_lite.decode")
exact_module = importlib.import_module("specdec_lite.exact")

N_SAMPLES = 200_000
LEVEL = 1e-3
N_TOKENS, GAMMA = 3, 2
PAIRS = {"article000": article000_pair, "article004": article004_pair, "dirichlet": lambda: random_pair(6, 0.5, 0)}
SETTINGS = {
    "plain": sd.SamplingParams(),
    "temperature+top_k+top_p+penalty": sd.SamplingParams(temperature=0.8, top_k=4, top_p=0.9,
                                                         repetition_penalty=1.3),
}


# ---------------------------------------------------------------- exact enumeration
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_exact_law_of_first_tokens_equals_target(pair, setting):
    target, draft = PAIRS[pair]()
    sampling = SETTINGS[setting]
    for gamma, n in [(1, 3), (2, 3), (3, 4)]:
        spec = exact_speculative_distribution(target, draft, [0], gamma, n, sampling)
        ref = exact_target_distribution(target, [0], n, sampling)
        assert max_abs_difference(spec, ref) < 1e-9, (gamma, n)
        assert sum(spec.values()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("pair", PAIRS)
def test_exact_law_with_point_mass_ngram_draft(pair):
    target, _ = PAIRS[pair]()
    prompt = [0, 1, 2, 0, 1]
    spec = exact_speculative_distribution(target, sd.NGramDraft(max_ngram=2), prompt, 3, 4)
    assert max_abs_difference(spec, exact_target_distribution(target, prompt, 4)) < 1e-9


# ---------------------------------------------------------------- Monte Carlo through the loop
def first_tokens(target, draft, n_samples=N_SAMPLES, seed=0, sampling=sd.SamplingParams()):
    prompt = torch.zeros(n_samples, 1, dtype=torch.long)
    gen = sd.speculative_generate(target, draft, prompt, gamma=GAMMA, max_new_tokens=N_TOKENS,
                                  sampling=sampling, seed=seed)
    return torch.stack(gen.sequences).numpy()


def cells(law: dict, min_expected: float, n: int):
    """Keys with expected count >= min_expected, in a fixed order; the rest are merged into one cell."""
    return sorted(k for k, v in law.items() if v * n >= min_expected)


def chi_square(samples: np.ndarray, law: dict):
    n = len(samples)
    keep = cells(law, 5.0, n)
    index = {k: i for i, k in enumerate(keep)}
    counts = np.zeros(len(keep) + 1)
    for row, c in zip(*np.unique(samples, axis=0, return_counts=True)):
        counts[index.get(tuple(row.tolist()), len(keep))] += c
    expected = np.array([law[k] for k in keep] + [1.0 - sum(law[k] for k in keep)]) * n
    if expected[-1] < 1e-9:  # nothing merged
        counts, expected = counts[:-1], expected[:-1]
    return stats.chisquare(counts, expected).pvalue


def power(null_law: dict, alt_law: dict, n: int = N_SAMPLES, level: float = LEVEL) -> float:
    """Noncentral chi-square power of ``chi_square`` against the alternative ``alt_law``."""
    keep = cells(null_law, 5.0, n)
    p0 = np.array([null_law[k] for k in keep] + [1 - sum(null_law[k] for k in keep)])
    p1 = np.array([alt_law.get(k, 0.0) for k in keep] + [1 - sum(alt_law.get(k, 0.0) for k in keep)])
    if p0[-1] < 1e-12:
        p0, p1 = p0[:-1], p1[:-1]
    df = len(p0) - 1
    lam = n * np.sum((p1 - p0) ** 2 / p0)
    return float(stats.ncx2.sf(stats.chi2.isf(level, df), df, lam))


@pytest.mark.parametrize("pair", PAIRS)
def test_monte_carlo_agrees_with_target(pair):
    target, draft = PAIRS[pair]()
    law = exact_target_distribution(target, [0], N_TOKENS)
    assert chi_square(first_tokens(target, draft), law) > LEVEL


def test_monte_carlo_with_sampling_settings_and_ngram():
    target, draft = random_pair(6, 0.5, 0)
    sampling = SETTINGS["temperature+top_k+top_p+penalty"]
    law = exact_target_distribution(target, [0], N_TOKENS, sampling)
    assert chi_square(first_tokens(target, draft, sampling=sampling, seed=1), law) > LEVEL
    prompt = torch.tensor([[0, 1, 2, 0, 1]]).repeat(N_SAMPLES, 1)
    gen = sd.speculative_generate(target, sd.NGramDraft(), prompt, gamma=GAMMA, max_new_tokens=N_TOKENS, seed=2)
    law = exact_target_distribution(target, [0, 1, 2, 0, 1], N_TOKENS)
    assert chi_square(torch.stack(gen.sequences).numpy(), law) > LEVEL


# ---------------------------------------------------------------- mutation check
def wrong_bonus_position(drafts, q, p, generator=None):
    """Bug: the bonus token is drawn from p at position gamma (the last draft's) instead of gamma+1."""
    p = p.clone()
    p[:, -1] = p[:, -2]
    return verify_module.verify(drafts, q, p, generator)


def bonus_after_last_rejection(drafts, q, p, generator=None):
    """Bug: when the last draft is rejected, emit the corrected token and then a bonus from p[:, gamma] too."""
    n, nxt = verify_module.verify(drafts, q, p, generator)
    gamma = drafts.shape[1]
    hit = n == gamma - 1
    if hit.any():
        bonus = torch.multinomial(p[:, gamma].float(), 1, generator=generator).squeeze(-1)
        drafts[hit, gamma - 1] = nxt[hit]  # the corrected token takes the rejected draft's place ...
        n = torch.where(hit, gamma, n)
        nxt = torch.where(hit, bonus, nxt)  # ... and a bonus follows it
    return n, nxt


def residual_from_p(p_row, q_row):
    """Bug: resample from p instead of norm((p - q)+)."""
    return p_row / p_row.sum(-1, keepdim=True)


def inverted_ratio(p_x, q_x):
    """Bug: accept with min(1, q/p)."""
    return torch.where(p_x > 0, (q_x / p_x.clamp_min(1e-38)).clamp(max=1.0), torch.zeros_like(p_x))


def wrong_bonus_outcomes(drafts, q, p):
    p = p.clone()
    p[:, -1] = p[:, -2]
    return verify_module.outcome_distribution(drafts, q, p)


MUTANTS = {  # name: (patches for the loop, patches for the enumeration or None)
    "bonus from wrong position": ([(decode_module, "verify", wrong_bonus_position)],
                                  [(exact_module, "outcome_distribution", wrong_bonus_outcomes)]),
    "residual from p": ([(verify_module, "residual_distribution", residual_from_p)],
                        [(verify_module, "residual_distribution", residual_from_p)]),
    "inverted ratio q/p": ([(verify_module, "acceptance_probability", inverted_ratio)],
                           [(verify_module, "acceptance_probability", inverted_ratio)]),
    "bonus after last-position rejection": ([(decode_module, "verify", bonus_after_last_rejection)], None),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_statistical_tests_reject_broken_verifiers(mutant, monkeypatch):
    target, draft = random_pair(6, 0.5, 0)
    law = exact_target_distribution(target, [0], N_TOKENS)
    loop_patches, exact_patches = MUTANTS[mutant]
    if exact_patches is not None:
        with monkeypatch.context() as m:
            for module, name, fn in exact_patches:
                m.setattr(module, name, fn)
            broken_law = exact_speculative_distribution(target, draft, [0], GAMMA, N_TOKENS)
        # the exact check sees the bug, and the Monte Carlo test has the power to see it
        assert max_abs_difference(broken_law, law) > 1e-3
        assert power(law, broken_law) > 0.99
    for module, name, fn in loop_patches:
        monkeypatch.setattr(module, name, fn)
    assert chi_square(first_tokens(target, draft), law) < 1e-6
