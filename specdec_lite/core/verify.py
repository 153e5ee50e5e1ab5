"""The verifier: exact rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

Notation, never inverted: ``p`` is the TARGET distribution, ``q`` the DRAFT distribution.

For draft tokens x_1..x_gamma (x_i drawn from q_i), the target scores all gamma+1 positions in one forward.
Position i accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)). At the first rejection, position i emits a
token drawn from the residual norm((p_i - q_i)+) and the round ends. If all gamma are accepted, a bonus token
is drawn from p_{gamma+1}. Summed over both branches, every emitted token is distributed exactly as p.

Point-mass drafts (n-gram lookup) pass ``q=None``: q_i is the one-hot of x_i, so the acceptance probability is
p_i(x_i) and the residual is p_i with x_i removed. Everything is vectorized over the batch B and the vocabulary
V; the generator is explicit.

The two pieces of the rule, the acceptance probability and the residual, travel together as a ``Rule``; every
verifier and exact law takes one (the exact ``EXACT_RULE`` by default), so the mutation tests can hand in a broken
piece instead of patching this module (``repro/mutants.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .sampling import at_least_float32, has_weight, refuse_without_weight, sample


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) for the drafted tokens; p_x, q_x (B, gamma). q_x > 0 whenever x was drawn from q."""
    return torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-38)).clamp(max=1.0), torch.ones_like(p_x))


def residual_distribution(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """norm((p - q)+) over the last axis. When p == q (nothing left, only reachable through float rounding) it
    falls back to p, which is then the exact conditional."""
    r = (p_row - q_row).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-38), p_row)


@dataclass(frozen=True)
class Rule:
    """The pieces every verifier is built from: accept(p_x, q_x) and residual(p_row, q_row)."""

    accept: Callable = acceptance_probability
    residual: Callable = residual_distribution


EXACT_RULE = Rule()


def _draft_probs_of(draft_tokens: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """q_i(x_i): (B, gamma). For point-mass drafts this is 1."""
    if q is None:
        return torch.ones(draft_tokens.shape, dtype=torch.float64, device=draft_tokens.device)
    return q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)


def _draft_row_at(draft_tokens: torch.Tensor, q: torch.Tensor | None, index: torch.Tensor, V: int,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q at position index[b] for each row, zeros where index == gamma (the bonus position): (B, V)."""
    B, gamma = draft_tokens.shape
    rows = torch.arange(B, device=draft_tokens.device)
    inside = index < gamma
    safe = index.clamp(max=max(gamma - 1, 0))
    if gamma == 0:
        return torch.zeros(B, V, dtype=dtype, device=draft_tokens.device)
    if q is None:
        row = torch.zeros(B, V, dtype=dtype, device=draft_tokens.device)
        row[rows, draft_tokens[rows, safe]] = 1.0
    else:
        row = q[rows, safe].to(dtype)
    return row * inside.unsqueeze(-1)


def check_tokens(name: str, tokens, shape: tuple | None = None) -> None:
    """Refuse ``tokens`` unless an integer 2-D tensor, of ``shape`` where given; host-side, no device read."""
    ok = isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and not tokens.is_floating_point()
    if not ok or (shape is not None and tuple(tokens.shape) != shape):
        got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        want = "(B, gamma)" if shape is None else f"(B, gamma+1) = {shape}"
        raise ValueError(f"{name} must be an integer tensor {want} of token ids, got {got}")


def check_shapes(draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor) -> None:
    check_tokens("draft_tokens", draft_tokens)
    B, gamma = draft_tokens.shape
    if p.dim() != 3 or p.shape[0] != B or p.shape[1] != gamma + 1:
        raise ValueError(f"p must be (B, gamma+1, V) = ({B}, {gamma + 1}, V), got {tuple(p.shape)}")
    if q is not None and (q.dim() != 3 or q.shape[:2] != (B, gamma) or q.shape[2] != p.shape[2]):
        raise ValueError(f"q must be (B, gamma, V) = ({B}, {gamma}, {p.shape[2]}) or None, got {tuple(q.shape)}")


def verify(draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
           generator: torch.Generator | None = None, rule: Rule = EXACT_RULE) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling for a batch of drafts.

    draft_tokens: (B, gamma) long; q: (B, gamma, V) draft probabilities or None (point-mass draft);
    p: (B, gamma+1, V) target probabilities.
    Returns num_accepted (B,) in 0..gamma and next_token (B,): the corrected token at the first rejection,
    or the bonus token drawn from p[:, gamma] when all gamma are accepted. Reads one flag from the device: that
    q (drawn unchecked, ``sampling.sample``) and the rows the next token is drawn from can be sampled.
    """
    check_shapes(draft_tokens, q, p)
    B, gamma = draft_tokens.shape
    V = p.shape[-1]
    rows = torch.arange(B, device=p.device)
    p = at_least_float32(p)

    # 1) accept x_i with probability min(1, p_i(x_i)/q_i(x_i))
    p_x = p[:, :gamma].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # (B, gamma)
    a = rule.accept(p_x, _draft_probs_of(draft_tokens, q).to(p.dtype))  # (B, gamma)
    u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype)
    accepted = u < a
    # 2) the run of acceptances before the first rejection
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # (B,)

    # 3) the next token: from norm((p - q)+) at the first rejection; from p[:, gamma] (q row = 0) after all
    p_next = p[rows, num_accepted]  # (B, V)
    q_next = _draft_row_at(draft_tokens, q, num_accepted, V, p.dtype)  # (B, V), zeros at the bonus position
    residual = rule.residual(p_next, q_next)
    ok = has_weight(residual) if q is None else has_weight(residual).all() & has_weight(q).all()
    refuse_without_weight(ok)
    next_token = sample(residual, generator, check=False)
    return num_accepted, next_token


def verify_greedy(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept while the draft equals the target's argmax; then emit the target's argmax.

    draft_tokens (B, gamma); target_argmax (B, gamma+1), else refused. Same return convention as ``verify``.
    """
    check_tokens("draft_tokens", draft_tokens)
    B, gamma = draft_tokens.shape
    check_tokens("target_argmax", target_argmax, (B, gamma + 1))
    match = draft_tokens == target_argmax[:, :gamma]
    num_accepted = match.long().cumprod(dim=1).sum(dim=1)
    next_token = target_argmax[torch.arange(B, device=draft_tokens.device), num_accepted]
    return num_accepted, next_token


def outcome_distribution(draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
                         rule: Rule = EXACT_RULE) -> torch.Tensor:
    """The exact law of ``verify``'s output given the drafts: (B, gamma+1, V), entry [b, k, v] is
    P(num_accepted = k, next_token = v). Built from the same ``rule`` as ``verify``, so the exact-enumeration
    tests check the rule ``verify`` samples from.
    """
    check_shapes(draft_tokens, q, p)
    B, gamma = draft_tokens.shape
    V = p.shape[-1]
    p = p.double()
    p_x = p[:, :gamma].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    a = rule.accept(p_x, _draft_probs_of(draft_tokens, q).double())  # (B, gamma)
    ones = torch.ones(B, 1, dtype=a.dtype, device=a.device)
    reach = torch.cat([ones, a.cumprod(dim=1)], dim=1)  # P(first k all accepted), (B, gamma+1)
    stop = torch.cat([1 - a, ones], dim=1)  # P(stop at k | reached k)
    out = []
    for k in range(gamma + 1):
        index = torch.full((B,), k, device=p.device)
        q_row = _draft_row_at(draft_tokens, q, index, V, torch.float64)
        out.append((reach[:, k] * stop[:, k]).unsqueeze(-1) * rule.residual(p[:, k], q_row))
    return torch.stack(out, dim=1)
