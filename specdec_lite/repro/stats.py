"""Statistical checks of a sampler against an exact law: Pearson chi-square and its power.

Used by the unbiasedness tests and notebook. A law is a dict {outcome tuple: probability}; samples are an
(N, n) integer array of outcomes. Cells whose expected count is below ``min_expected`` are merged into one.
"""
from __future__ import annotations

import numpy as np
from scipy import stats


def _cells(law: dict, n: int, min_expected: float) -> list:
    """Outcomes kept as their own cell (expected count >= min_expected), in a fixed order."""
    return sorted(k for k, v in law.items() if v * n >= min_expected)


def _cell_probs(law: dict, keep: list) -> np.ndarray:
    kept = np.array([law.get(k, 0.0) for k in keep])
    return np.append(kept, max(0.0, 1.0 - kept.sum()))


def counts_by_cell(samples: np.ndarray, keep: list) -> np.ndarray:
    index = {k: i for i, k in enumerate(keep)}
    counts = np.zeros(len(keep) + 1)
    rows, freq = np.unique(np.asarray(samples), axis=0, return_counts=True)
    for row, c in zip(rows, freq):
        counts[index.get(tuple(int(v) for v in row), len(keep))] += c
    return counts


def chi_square_pvalue(samples: np.ndarray, law: dict, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test that ``samples`` were drawn from ``law``."""
    samples = np.asarray(samples).reshape(len(samples), -1)
    n = len(samples)
    if any(law.get(tuple(int(v) for v in row), 0.0) <= 0 for row in np.unique(samples, axis=0)):
        return 0.0  # an outcome the law gives probability 0: certainly not drawn from it
    keep = _cells(law, n, min_expected)
    counts, expected = counts_by_cell(samples, keep), _cell_probs(law, keep) * n
    if expected[-1] < 1e-9:  # nothing was merged: drop the empty "rest" cell
        counts, expected = counts[:-1], expected[:-1]
    return float(stats.chisquare(counts, expected).pvalue)


def chi_square_power(null_law: dict, alternative_law: dict, n: int, level: float = 1e-3,
                     min_expected: float = 5.0) -> float:
    """Power of ``chi_square_pvalue`` at sample size n and the given level against an alternative law
    (noncentral chi-square approximation, noncentrality n * sum (p1 - p0)^2 / p0)."""
    keep = _cells(null_law, n, min_expected)
    p0, p1 = _cell_probs(null_law, keep), _cell_probs(alternative_law, keep)
    if p0[-1] < 1e-12:
        p0, p1 = p0[:-1], p1[:-1]
    df = len(p0) - 1
    noncentrality = n * np.sum((p1 - p0) ** 2 / p0)
    return float(stats.ncx2.sf(stats.chi2.isf(level, df), df, noncentrality))


def empirical_law(samples: np.ndarray) -> dict:
    rows, freq = np.unique(np.asarray(samples).reshape(len(samples), -1), axis=0, return_counts=True)
    return {tuple(int(v) for v in r): c / len(samples) for r, c in zip(rows, freq)}


def kl_divergence(p: dict, q: dict, eps: float = 1e-12) -> float:
    """KL(p || q) over the union of outcomes (q floored at eps)."""
    return float(sum(pv * np.log(pv / max(q.get(k, 0.0), eps)) for k, pv in p.items() if pv > 0))


def transition_chi_square_pvalue(sequence, P: np.ndarray) -> float:
    """Is a long token sequence a Markov chain with transition matrix P? Pearson chi-square on the transition
    counts of each state against its row of P (df = sum over visited states of their support size - 1)."""
    seq = np.asarray(sequence)
    N = len(P)
    counts = np.zeros((N, N))
    np.add.at(counts, (seq[:-1], seq[1:]), 1)
    statistic, df = 0.0, 0
    for a in range(N):
        n_a = counts[a].sum()
        support = P[a] > 0
        if n_a == 0:
            continue
        if counts[a][~support].sum() > 0:
            return 0.0
        expected = n_a * P[a][support]
        statistic += float(((counts[a][support] - expected) ** 2 / expected).sum())
        df += int(support.sum()) - 1
    return float(stats.chi2.sf(statistic, df))
