"""Linear layers on the CPU through oneDNN, with their weights packed once at load (float32, and bfloat16 where
oneDNN computes it).

torch computes a float32 ``nn.Linear`` on the CPU with MKL's matrix product on the weight as it lies, and a
bfloat16 one with oneDNN on a weight it reorders at every call. For one token (a matrix-vector product, bound by
reading the weights) MKL is as fast as anything on some CPUs; for the few tokens of a verification forward it is
slow on some, and the reorder at every call costs time on all. oneDNN's matrix product on a weight reordered once
into its own blocked layout (``torch.ops.mkldnn``, the path torch's inductor takes for frozen CPU models) computes
the same product, summed in another order (results differ by rounding: about 1e-6 relative in float32, one
bfloat16 rounding step at most), and is cheaper. Measured with the embedded target and a warm 200-token cache, ms
per forward of M tokens (median of 7 or 15, one run per machine):

| M | 1 | 2 | 4 | 8 | 16 |
| --- | --- | --- | --- | --- | --- |
| AVX2 only (AMD EPYC), float32 as transformers loads it (MKL) | 77.8 | 110.9 | 149.8 | 168.2 | 203.7 |
| AVX2 only (AMD EPYC), float32, packed linears | 78.3 | 89.5 | 95.1 | 111.0 | 150.0 |
| AVX512-BF16 (AMD EPYC), float32 as transformers loads it | 61.3 | 99.5 | 92.7 | 99.0 | 128.0 |
| AVX512-BF16 (AMD EPYC), float32, packed linears | 40.7 | 48.7 | 39.7 | 48.2 | 57.0 |
| AVX512-BF16 (AMD EPYC), bfloat16 as transformers loads it | 41.5 | 44.3 | 48.8 | 51.3 | 59.7 |
| AVX512-BF16 (AMD EPYC), bfloat16, packed linears | 31.5 | 33.4 | 32.7 | 37.2 | 46.9 |

``load_model`` packs a model's linear layers on the CPU by default where ``can_pack`` (``packed_linears``), but not
for compiled forwards (``compile=True``: torch's compiler cannot compile the packed product); the baseline of every
speedup still times plain decoding as transformers loads the model too (``repro.baseline``), so packing can never
make a speedup look larger than plain decoding allows.

oneDNN's packed product has no backward: with gradients enabled a ``PackedLinear`` computes ``F.linear`` on its
weight, so training through it is unchanged. A weight changed in place after packing (``load_state_dict``,
``copy_``) is packed again before its next use.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .devices import dtype_name


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``PackedLinear`` runs for a model on ``device`` in ``dtype``: on a CPU with oneDNN, float32, and
    bfloat16 where oneDNN computes it (CPUs with AVX-512 or AMX; on others torch emulates bfloat16 itself)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose product runs on a oneDNN-packed copy of its weight. The weight and bias stay
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
        if torch.is_grad_enabled() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)  # the packed product has no backward
        if self.weight._version != self._packed_version:
            self._pack()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def linear_on(weight: torch.Tensor, bias: torch.Tensor | None = None, packed: bool = False) -> nn.Module:
    """x -> x @ weight.T (+ bias) as a module on these very tensors (no gradient to them): an ``nn.Linear``, or,
    with ``packed`` (for a model whose linear layers run packed, ``has_packed_linears``), a ``PackedLinear``."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return PackedLinear(linear) if packed else linear


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` (on the CPU, in a dtype ``can_pack``) by a ``PackedLinear``, in
    place; returns how many. Raises, before changing anything, where oneDNN cannot run the model's linears."""
    linears = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children() if type(child) is nn.Linear]
    for _, _, linear in linears:
        if not can_pack(linear.weight.device, linear.weight.dtype):
            raise ValueError(f"packed_linears=True needs oneDNN (torch.backends.mkldnn) and float32 weights, or "
                             f"bfloat16 ones on a CPU where oneDNN computes bfloat16 (AVX-512 or AMX), but a linear "
                             f"layer is {linear.weight.dtype} on "
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


def check_packable(device: torch.device, dtype: torch.dtype, device_map, batch_invariant: bool) -> None:
    """Refuse ``packed_linears=True`` where it cannot run, saying what to load instead."""
    if not can_pack(device, dtype):
        raise ValueError(f"packed_linears=True runs float32 linear layers on a CPU with oneDNN (bfloat16 ones where "
                         f"oneDNN computes bfloat16: AVX-512 or AMX), not "
                         f"{dtype_name(dtype)} on {device}; load with packed_linears=None (the default) or False")
    if device_map is not None or batch_invariant:
        raise ValueError("packed_linears=True goes with neither device_map nor batch_invariant=True (those place or "
                         "replace the linear layers themselves); load with packed_linears=None or False")
