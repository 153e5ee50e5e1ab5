"""A draft head's linear layers on 8-bit weights (CPU), for a cheaper drafting round.

On a CPU the head's step is a handful of matrix-vector products, bound by reading their weights: rounding each
weight row to 8 bits with its own scale (w ~ s * q, q in -127..127) reads a quarter of float32's bytes and half of
bfloat16's, computed by torch's weight-only 8-bit kernel (``torch._weight_int8pack_mm``) on bfloat16 activations
(the kernel's vectorized path on every x86 CPU; it is slow in float32). The output is returned in the input's
dtype, so the rest of the head runs as before.

Exactness is untouched: a head is a draft, and the verifier reads the distribution q the head computed, whatever
its weights; 8-bit weights can only change how often a draft is accepted. The target is never quantized here.
"""
from __future__ import annotations

from copy import deepcopy

import torch
from torch import nn

COMPUTE_DTYPE = torch.bfloat16  # the kernel's activations and scales
LEVELS = 127  # symmetric: q in -127..127


class Int8Linear(nn.Module):
    """``linear`` (an ``nn.Linear`` or a weight (N, K) and bias) with each output row's weights rounded to 8 bits
    with its own scale."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / LEVELS
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).clamp(-LEVELS, LEVELS).to(torch.int8))
        self.register_buffer("scale", scale.to(COMPUTE_DTYPE))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def of(cls, linear: nn.Linear) -> "Int8Linear":
        return cls(linear.weight, linear.bias)

    @property
    def in_features(self) -> int:
        return self.weight_int8.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight_int8.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE)
        y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scale).to(x.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def quantized_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with every ``nn.Linear`` inside replaced by its ``Int8Linear`` (8-bit weights cannot be
    trained: the module itself stays as it was, for a trainer that still holds it)."""
    copy = deepcopy(module)
    replace_linears(copy)
    return copy


def replace_linears(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear:
            setattr(module, name, Int8Linear.of(child))
        else:
            replace_linears(child)
