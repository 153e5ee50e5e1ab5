"""Logits -> probabilities under one set of sampling settings.

The same function turns the target's logits into ``p`` and the draft's logits into ``q``. Each position is
processed with its own prefix (the repetition penalty looks at the tokens before that position), which is what
keeps speculative sampling exact with a penalty switched on (claim C16).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen; applied identically to target and draft."""

    temperature: float = 1.0  # 0 means greedy (argmax); > 0 divides the logits
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p (nucleus); 1.0 keeps all
    repetition_penalty: float = 1.0  # HF/CTRL rule: divide positive logits, multiply negative ones, for seen tokens

    def __post_init__(self):
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
                raise TypeError(f"{name} must be a finite number, got {value!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, Integral):
            raise TypeError(f"top_k must be an integer (0 switches it off), got {self.top_k!r}")
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; use 1.0 to switch nucleus sampling off")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 switches it off), got {self.top_k}")
        if not (self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be > 0 (1.0 switches it off), got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def seen_mask(prefix: torch.Tensor, lengths: torch.Tensor, drafts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Which tokens each position has already seen: (B, n+1, V) bool.

    prefix: (B, T) token buffer whose row b is valid up to lengths[b]; drafts: (B, n) tokens appended after it.
    Position i sees the prefix plus drafts[:, :i].
    """
    B, T = prefix.shape
    valid = torch.arange(T, device=prefix.device)[None, :] < lengths[:, None]
    base = torch.zeros(B, vocab_size + 1, dtype=torch.bool, device=prefix.device)
    # invalid slots are sent to an extra column V that is dropped afterwards
    base.scatter_(1, torch.where(valid, prefix, vocab_size).clamp(max=vocab_size), True)
    masks = [base[:, :vocab_size]]
    for i in range(drafts.shape[1]):
        nxt = masks[-1].clone()
        nxt.scatter_(1, drafts[:, i : i + 1], True)
        masks.append(nxt)
    return torch.stack(masks, dim=1)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The CTRL / Hugging Face rule, per position: logits (..., V), seen (..., V) bool."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float64 when it is, else in float32: probabilities are never computed in half precision."""
    return x if x.dtype == torch.float64 else x.float()


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension, taken in float32: widening half precision is exact (the same argmax,
    ties to the first index as before), and on CPUs a bfloat16 argmax over a vocabulary is about three times
    slower than widening and taking it in float32."""
    return at_least_float32(logits).argmax(-1)


def probs_from_logits(logits: torch.Tensor, sampling: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """logits (..., V) -> probabilities (..., V) under ``sampling`` (float32, or float64 for float64 logits).

    Greedy (temperature 0) gives the one-hot of the argmax, so the same verifier handles it.
    ``seen`` (..., V) bool is needed only when a repetition penalty is set.
    """
    logits = at_least_float32(logits)
    if sampling.repetition_penalty != 1.0:
        if seen is None:
            raise ValueError("a repetition penalty needs the tokens each position has seen (seen=...)")
        logits = apply_repetition_penalty(logits, seen, sampling.repetition_penalty)
    if sampling.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p (the top token is always kept)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def has_weight(probs: torch.Tensor) -> torch.Tensor:
    """(...) bool, where it stays: which rows of probs (..., V) can be sampled (a finite, positive total)."""
    totals = probs.double().sum(-1)
    return (totals > 0) & torch.isfinite(totals)


def refuse_without_weight(ok) -> None:
    """Raise unless every entry of ``ok`` is True: a ``has_weight`` tensor (one read of one flag) or a list of
    flags already read."""
    if not (bool(ok.all()) if torch.is_tensor(ok) else all(ok)):
        raise ValueError("cannot sample: a row of probabilities sums to 0 or is not finite (check the logits for "
                         "NaN, or a filter such as top_k/top_p that removed every token)")


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, check: bool = True) -> torch.Tensor:
    """One draw per row from probs (..., V) (weights >= 0, each row's sum > 0; need not sum to 1) -> (...) long.

    Inverse transform sampling in float64: the first token whose cumulative weight exceeds a uniform draw times
    the row's total; a token of weight 0 is never drawn. One uniform a row: over a 49k vocabulary on a 2-core CPU
    about 0.06 ms a row, where ``torch.multinomial`` takes about 1 ms.

    ``check`` refuses rows without weight, which reads one flag (on a GPU, a wait for the device). The loop's
    draft draws skip it and check their q with the round's own read (``verify``); unchecked, a row without weight
    gives some token of the vocabulary."""
    flat = probs.reshape(-1, probs.shape[-1]).double()
    cumulative = flat.cumsum(-1)
    totals = cumulative[:, -1:]
    if check:
        refuse_without_weight(has_weight(flat))
    # u < 1, and a product with a number below 1 never rounds up to the other factor: u < total, so the draw is
    # never past the last token of positive weight
    u = torch.rand(flat.shape[0], 1, generator=generator, device=flat.device, dtype=torch.float64) * totals
    token = torch.searchsorted(cumulative, u, right=True).clamp_(max=flat.shape[-1] - 1)
    return token.reshape(probs.shape[:-1])
