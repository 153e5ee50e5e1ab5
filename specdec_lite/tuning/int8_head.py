"""A draft head's linear layers on 8-bit weights (CPU), for a cheaper drafting round.

On a CPU the head's step is a handful of matrix-vector products, bound by reading their weights: rounding each
weight row to 8 bits with its own scale (w ~ s * q, q in -127..127) reads a quarter of float32's bytes and half of
bfloat16's, computed by torch's weight-only 8-bit kernel (``torch._weight_int8pack_mm``) on bfloat16 activations
(its float32 path was several times slower where measured: docs/SPEED.md). The output, rounded to bfloat16 by the
kernel, is returned in the input's dtype, so the rest of the head runs as before.

Exactness is untouched: a head is a draft, and the verifier reads the distribution q the head computed, whatever
its weights; 8-bit weights can only change how often a draft is accepted. The target is never quantized here. A
row's q may differ at bfloat16's rounding between a batch and that row alone (the product is the same row by row,
but a float32 difference of the head's attention in a batch can move an activation's rounding to bfloat16): each
row's law is still the target's.
"""
from __future__ import annotations

from copy import deepcopy

import torch
from torch import nn

COMPUTE_DTYPE = torch.bfloat16  # the kernel's activations and scales
LEVELS = 127  # symmetric: q in -127..127
# The kernel's vectorized loops read 16 activations at a time (8 on AVX2) from 32-byte-aligned rows, with no
# remainder loop: a row of any other length reads past its end. Linear layers with other input sizes stay float.
IN_FEATURES_MULTIPLE = 16
ALIGNMENT = 64  # bytes: activations start where torch's allocations do (the kernel needs 32)


def supports(in_features: int) -> bool:
    """Whether a linear layer with ``in_features`` inputs can run on the 8-bit kernel."""
    return in_features % IN_FEATURES_MULTIPLE == 0


class Int8Linear(nn.Module):
    """``linear`` (an ``nn.Linear`` or a weight (N, K) and bias) with each output row's weights rounded to 8 bits
    with its own scale."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if not supports(weight.shape[1]):
            raise ValueError(f"the 8-bit kernel needs a multiple of {IN_FEATURES_MULTIPLE} inputs, got "
                             f"{weight.shape[1]}: keep this layer as it is (``supports``)")
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
        if flat.data_ptr() % ALIGNMENT:  # a view into a larger tensor: the kernel's aligned loads need a copy
            flat = flat.clone()
        y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scale).to(x.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def quantized_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with every ``nn.Linear`` inside that the kernel ``supports`` replaced by its
    ``Int8Linear`` (8-bit weights cannot be trained: the module itself stays as it was, for a trainer that still
    holds it)."""
    copy = deepcopy(module)
    replace_linears(copy)
    return copy


def replace_linears(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear:
            if supports(child.in_features):
                setattr(module, name, Int8Linear.of(child))
        else:
            replace_linears(child)
