"""The cost model's two measured inputs, from forward times on this machine (notebooks 02 and 03).

v(gamma) = T_target(gamma + 1 tokens) / T_target(1 token): the verification forward over gamma+1 tokens against
one decode step; c = T_draft(1 token) / T_target(1 token): one draft step against one target step. Each T is the
median of timed forwards on a warm KV cache (``instruments.timing.forward_seconds``); the target's times for every token
count are taken in one sweep, the draft's just after with the same settings.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..instruments.timing import forward_seconds, relative_to_one_token


def verification_costs(target_seconds: dict, gammas) -> dict:
    """{gamma: v(gamma) = target_seconds[gamma + 1] / target_seconds[1]} from {tokens: median seconds}."""
    missing = [k for k in [1, *(g + 1 for g in gammas)] if k not in target_seconds]
    if missing:
        raise ValueError(f"need the target's forward time for {missing} tokens, have {sorted(target_seconds)}")
    relative = relative_to_one_token(target_seconds)
    return {g: relative[g + 1] for g in gammas}


@dataclass(frozen=True)
class Costs:
    target_seconds: dict  # {tokens: median seconds of one target forward over that many new tokens}
    draft_seconds: float  # median seconds of one draft step (nan when no draft was timed)
    v: dict  # {gamma: T_target(gamma + 1) / T_target(1)}
    c: float  # T_draft(1) / T_target(1) (nan when no draft was timed)

    def v_at(self, gamma: int) -> float:
        """v(gamma), or v at the largest measured gamma beyond it (the cost is taken as flat past the range)."""
        return self.v.get(gamma, self.v[max(self.v)])


def measure(target_model, draft_model=None, gammas=(4,), repeats: int = 9, batch_size: int = 1,
            context_len: int = 64, clock=None) -> Costs:
    """v(gamma) for each gamma and c, from forward times of ``target_model`` (over 1 and gamma+1 tokens) and of
    ``draft_model`` (one token; skipped when None). ``clock`` as in ``instruments.timing.forward_seconds``."""
    gammas = list(gammas)
    if not gammas or min(gammas) < 1:
        raise ValueError(f"gammas must be a non-empty list of integers >= 1, got {gammas}")
    tokens = sorted({1, *(g + 1 for g in gammas)})
    kw = dict(repeats=repeats, batch_size=batch_size, context_len=context_len, clock=clock)
    target_seconds = forward_seconds(target_model, new_tokens=tokens, **kw)
    draft_seconds = float("nan") if draft_model is None else forward_seconds(draft_model, new_tokens=[1], **kw)[1]
    return Costs(target_seconds, draft_seconds, verification_costs(target_seconds, gammas),
                 draft_seconds / target_seconds[1])


def by_batch(target_model, batches, gamma: int, repeats: int = 5) -> pd.DataFrame:
    """v(gamma) of ``target_model`` at each batch size: columns batch, 'v(gamma) = T(gamma+1 tokens)/T(1 token)'."""
    column = f"v({gamma}) = T({gamma + 1} tokens)/T(1 token)"
    return pd.DataFrame([{"batch": b, column: measure(target_model, gammas=[gamma], repeats=repeats, batch_size=b).v[gamma]}
                         for b in batches])
