"""Expected-speedup theory (Leviathan et al. 2023, section 3; article 000 section 4; article 004).

alpha: expected per-token acceptance; gamma: draft tokens per round; c: cost of one draft step over one target
step; v: cost of the target's verification forward over gamma+1 tokens over one ordinary decode step (the
articles take v = 1; on a CPU it is measured larger, see the README).
"""
from __future__ import annotations

import numpy as np


def _check_alpha(alpha):
    a = np.asarray(alpha, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return a


def expected_tokens(alpha, gamma: int):
    """E[N] = (1 - alpha^(gamma+1)) / (1 - alpha): expected tokens one round emits (bonus included).
    The limit alpha -> 1 is gamma + 1."""
    a = _check_alpha(alpha)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(a < 1, (1 - a ** (gamma + 1)) / np.where(a < 1, 1 - a, 1), gamma + 1.0)
    return float(value) if np.ndim(value) == 0 else value


def speedup(alpha, gamma: int, c, v=1.0):
    """Expected walltime improvement E[N] / (gamma * c + v) over one-token-per-target-step decoding."""
    if np.any(np.asarray(c) < 0) or np.any(np.asarray(v) <= 0):
        raise ValueError(f"need c >= 0 and v > 0, got c={c}, v={v}")
    value = expected_tokens(alpha, gamma) / (gamma * np.asarray(c, dtype=float) + np.asarray(v, dtype=float))
    return float(value) if np.ndim(value) == 0 else value


def best_gamma(alpha: float, c: float, v=1.0, max_gamma: int = 16) -> int:
    """The gamma in 1..max_gamma with the largest expected speedup. ``v`` may be a number or a function of
    gamma (measured verification cost). One (alpha, c) pair at a time: an array would be searched as one flat
    list and give a meaningless index."""
    if isinstance(max_gamma, bool) or not isinstance(max_gamma, (int, np.integer)) or max_gamma < 1:
        raise ValueError(f"max_gamma must be an integer >= 1, got {max_gamma!r}")
    if np.ndim(alpha) or np.ndim(c) or (not callable(v) and np.ndim(v)):
        raise ValueError("best_gamma takes one alpha, one c and one v (a number or a function of gamma); for "
                         "several, call it once per value")
    cost = v if callable(v) else (lambda g: v)
    speeds = [speedup(alpha, g, c, cost(g)) for g in range(1, max_gamma + 1)]
    return int(np.argmax(speeds)) + 1


def expected_tokens_limit(alpha: float) -> float:
    """sup over gamma of E[N] = 1 / (1 - alpha) (article 004 states alpha / (1 - alpha), which counts the
    accepted drafts without the bonus token)."""
    a = float(_check_alpha(alpha))
    return float("inf") if a == 1 else 1.0 / (1.0 - a)


# Article 000's table (section 4), as printed: speedup for (alpha, c) rows and gamma 3..6 columns.
ARTICLE000_TABLE = {
    (0.7, 0.10): (1.95, 1.98, 1.96, 1.91),
    (0.8, 0.10): (2.27, 2.40, 2.46, 2.47),
    (0.8, 0.05): (2.57, 2.80, 2.95, 3.04),
    (0.5, 0.10): (1.44, 1.38, 1.24, 1.24),
}
ARTICLE000_GAMMAS = (3, 4, 5, 6)


def article000_comparison():
    """Rows (alpha, c, gamma, article's speedup, recomputed speedup)."""
    return [(a, c, g, printed, speedup(a, g, c))
            for (a, c), values in ARTICLE000_TABLE.items() for g, printed in zip(ARTICLE000_GAMMAS, values)]


def break_even_alpha(c: float, v=1.0, max_gamma: int = 16, resolution: int = 2001) -> float:
    """The smallest alpha at which some gamma in 1..max_gamma gives a speedup above 1 (nan if none does)."""
    cost = v if callable(v) else (lambda g: v)
    for a in np.linspace(0, 1, resolution):
        if any(speedup(a, g, c, cost(g)) > 1 for g in range(1, max_gamma + 1)):
            return float(a)
    return float("nan")


def latency_example(alpha: float, gamma: int = 8, tokens: int = 200, target_ms: float = 10.0,
                    draft_ms: float = 1.0) -> dict:
    """Article 002's latency arithmetic (C9): ``tokens`` tokens, one target step ``target_ms``, one draft step
    ``draft_ms``, gamma drafts per round. A round emits E[N] tokens and costs gamma * draft_ms + target_ms (v = 1);
    plain decoding costs tokens * target_ms. Returns E[N], rounds, latency in ms and the speedup."""
    if tokens < 1 or target_ms <= 0 or draft_ms < 0:
        raise ValueError(f"need tokens >= 1, target_ms > 0, draft_ms >= 0, got {tokens}, {target_ms}, {draft_ms}")
    per_round = expected_tokens(alpha, gamma)
    rounds = tokens / per_round
    latency = rounds * (gamma * draft_ms + target_ms)
    return {"E[N]": per_round, "rounds": rounds, "latency ms": latency, "speedup": tokens * target_ms / latency}


def memory_floor_ms(weight_bytes: float, bandwidth_gbs: float) -> float:
    """The memory-bandwidth floor of one decode step: reading every weight once, weight_bytes / bandwidth, in ms."""
    if weight_bytes < 0 or bandwidth_gbs <= 0:
        raise ValueError(f"need weight_bytes >= 0 and bandwidth_gbs > 0, got {weight_bytes}, {bandwidth_gbs}")
    return weight_bytes / (bandwidth_gbs * 1e9) * 1000


# ------------------------------------------------------------------------ trees and adaptive drafting
# The chain formula generalizes node by node. A round emits 1 + (number of accepted draft nodes) tokens, and a
# node is accepted exactly when its whole root path is, so E[N] = 1 + sum over nodes of P(path to node accepted).
# For a chain with acceptance alpha at every position this is 1 + alpha + ... + alpha^gamma, the formula above.
# The cost of a round, in target steps, is the draft's cost d (gamma * c for a chain) plus v(n), the cost of one
# target forward over the n nodes and the root.


def expected_tokens_tree(node_acceptance, parents) -> float:
    """E[N] = 1 + sum_i prod_{j on the root path of i} a_j, where node_acceptance[i] is P(node i accepted | its
    parent accepted) and parents[i] the parent of node i (node 0 is the root: its entry is ignored)."""
    a = _check_alpha(node_acceptance)
    reach = np.ones(len(parents))
    for i in range(1, len(parents)):
        if parents[i] >= i:
            raise ValueError("every node's parent must come before it (parents[i] < i)")
        reach[i] = reach[parents[i]] * a[i]
    return float(1.0 + reach[1:].sum())


def expected_tokens_by_depth(acceptance_by_depth) -> float:
    """E[N] from the conditional acceptance at each depth of the accepted path (P(depth k accepted | depth k-1
    accepted)): 1 + a_1 + a_1 a_2 + ...; for a chain, the chain formula with per-position alphas."""
    a = _check_alpha(np.nan_to_num(np.asarray(acceptance_by_depth, dtype=float)))
    return float(1.0 + np.cumprod(a).sum())


def tree_speedup(expected: float, draft_cost: float, v: float) -> float:
    """Expected tokens per target step: E[N] / (d + v), with d the draft's cost per round and v the verification
    forward's, both in target steps. For a chain, d = gamma * c and this is ``speedup``."""
    if draft_cost < 0 or v <= 0:
        raise ValueError(f"need draft_cost >= 0 and v > 0, got {draft_cost}, {v}")
    return float(expected / (draft_cost + v))


def geometric_mean(values) -> float:
    """The geometric mean of positive ``values`` (speedups over tasks); nan when there are none."""
    values = np.asarray(values, dtype=float)
    return float(np.exp(np.log(values).mean())) if len(values) else float("nan")
