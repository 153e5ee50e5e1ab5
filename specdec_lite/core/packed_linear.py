"""Float32 linear layers on the CPU through oneDNN, with their weights packed once at load.

torch computes a float32 ``nn.Linear`` on the CPU with MKL's matrix product on the weight as it lies. For one
token (a matrix-vector product, bound by reading the weights) that is as fast as anything here; for the few
tokens of a verification forward it is slow on some CPUs. oneDNN's matrix product on a weight reordered once into
its own blocked layout (``torch.ops.mkldnn``, the path torch's inductor takes for frozen CPU models) computes the
same float32 product, summed in another order (results differ by rounding, about 1e-6 relative), and is much
cheaper per token at 2-32 tokens. Measured on a 2-core AMD EPYC with AVX2 only, the embedded target with a warm
200-token cache, ms per forward of M tokens (median of 7, one run):

| M | 1 | 2 | 4 | 8 | 16 |
| --- | --- | --- | --- | --- | --- |
| float32 as transformers loads it (MKL) | 77.8 | 110.9 | 149.8 | 168.2 | 203.7 |
| float32, packed linears (oneDNN) | 78.3 | 89.5 | 95.1 | 111.0 | 150.0 |

So a tree of 8 tokens costs 1.4 decode steps instead of 2.2. ``load_model`` packs a float32 model's linear layers
on the CPU by default (``packed_linears``); the baseline of every speedup still times float32 as transformers
loads it (``repro.baseline``), so packing can never make a speedup look larger than plain decoding allows.

oneDNN's packed product has no backward: with gradients enabled a ``PackedLinear`` computes ``F.linear`` on its
weight, so training through it is unchanged. A weight changed in place after packing (``load_state_dict``,
``copy_``) is packed again before its next use.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``PackedLinear`` runs for a model on ``device`` in ``dtype``: float32 on a CPU with oneDNN."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose float32 product runs on a oneDNN-packed copy of its weight. The weight and bias stay
    the linear's own parameters (state dicts, tied embeddings and training see them as before)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._pack()

    def _pack(self):
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self._packed_version = self.weight._version

    def forward(self, x):
        if torch.is_grad_enabled() or x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)  # the packed product has no backward
        if self.weight._version != self._packed_version:
            self._pack()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(model: nn.Module) -> int:
    """Replace every float32 ``nn.Linear`` of ``model`` (on the CPU) by a ``PackedLinear``, in place; returns how
    many. Raises, before changing anything, where oneDNN cannot run the model's linears."""
    linears = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if type(child) is nn.Linear]
    for _, _, linear in linears:
        if not can_pack(linear.weight.device, linear.weight.dtype):
            raise ValueError(f"packed_linears=True needs float32 weights on a CPU with oneDNN "
                             f"(torch.backends.mkldnn), but a linear layer is {linear.weight.dtype} on "
                             f"{linear.weight.device}; load with packed_linears=False")
    for parent, name, linear in linears:
        setattr(parent, name, PackedLinear(linear))
    model._specdec_packed_linears = bool(linears)
    return len(linears)


def has_packed_linears(model: nn.Module) -> bool:
    return bool(getattr(model, "_specdec_packed_linears", False))


def packed_bytes(model: nn.Module) -> int:
    """The memory packing would add: one more copy of every ``nn.Linear`` weight."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if type(m) is nn.Linear)


def kept_unpacked(model: nn.Module) -> bool:
    """Whether a model whose linear layers could run packed keeps them as transformers loads them
    (``load_model(..., packed_linears=False)``, or too little memory for the copies)."""
    weight = model.get_input_embeddings().weight
    return can_pack(weight.device, weight.dtype) and not has_packed_linears(model)
