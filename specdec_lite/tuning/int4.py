"""Linear layers on the 4-bit blocks a GGUF stores (``load_model(..., int4=True)``).

The embedded target ships as a Q4_1 GGUF: 32 weights a block along the input dimension, each weight
w = d * q + m with q in 0..15 and d, m float16 per block. torch's CPU kernel for 4-bit weights
(``_weight_int4pack_mm_for_cpu``) computes x @ W^T with W = fma(q - 8, scale, zero) per group of 32 along the
input dimension, from the 4-bit values packed by ``_convert_weight_to_int4pack_for_cpu``; with scale = d and
zero = m + 8 d it computes the stored weights. A decode step, bound by reading the weights, then reads half a byte
a weight instead of two (bfloat16).

The kernel takes its scales in the activations' dtype, which makes the number format's exactness depend on it:

- float32: d, m and m + 8 d are exact in float32 for every block of the embedded target, so the kernel computes
  with the very weights of the float32 model (``check_weights`` holds every layer to that at load); but the kernel
  is slow in float32, several times plain float32 decoding;
- bfloat16: d rounded to bfloat16 loses bits, so the weights differ from the bfloat16 model's by up to about a
  tenth of a block's step: an int4 model is a model of its own, and speculative decoding keeps *its* output law
  exactly, as it does for any number format (docs/SPEED.md has the measurements).

Like ``packed_linear.PackedLinear``, an ``Int4Linear`` keeps the linear's weight as its parameter (state dicts,
fingerprints, heads and training see the model as before) and computes with it where gradients are enabled.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..names import EMBEDDED_TARGET, embedded_gguf_path, is_embedded_target

GROUP = 32  # Q4_1's block: the kernel's group size along the input dimension
BLOCK_BYTES = 20  # a Q4_1 block: float16 d, float16 m, 16 bytes of 4-bit values
LLAMA_PROJECTIONS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                     "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                     "ffn_down": "mlp.down_proj"}  # GGUF tensor kind -> transformers' module, per layer


def int4_supported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why 4-bit linear layers cannot run a model on ``device`` in ``dtype`` (None: they can)."""
    if device.type != "cpu":
        return f"the 4-bit kernel used here is torch's CPU one, not {device.type}'s"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"the 4-bit kernel takes float32 or bfloat16 activations here, not {str(dtype).removeprefix('torch.')}"
    return None


def int4_source(name: str, device: torch.device, dtype: torch.dtype, device_map, batch_invariant: bool) -> Path:
    """The GGUF whose blocks ``load_model(name, ..., int4=True)`` runs, after refusing, before anything loads, what
    cannot run: a model without a GGUF here, a device or dtype the kernel does not take, and the options that
    replace the linear layers themselves."""
    if not is_embedded_target(name):
        raise ValueError(f"int4=True runs the 4-bit blocks of the GGUF a model was converted from, and only the "
                         f"embedded target ({EMBEDDED_TARGET!r}) ships one here, not {name!r}; load with int4=False")
    why = int4_supported(device, dtype) or (device_map is not None and "device_map places the layers itself") or \
        (batch_invariant and "batch_invariant=True replaces the linear layers itself")
    if why:
        raise ValueError(f"int4=True cannot run here: {why}; load with int4=False")
    return embedded_gguf_path()


def read_q4_1(gguf_path: str | Path) -> dict:
    """{transformers module name: (q (N, K) int32 in 0..15, d (N, K/32) float32, m (N, K/32) float32)} for every
    Q4_1 tensor of a Llama GGUF, rows in transformers' order (its loader un-permutes the rows of the query and key
    projections; whole rows move, so the blocks stay as stored)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    architecture = field_value(reader, "general.architecture")
    if architecture != "llama":
        raise ValueError(f"{Path(gguf_path).name} holds a {architecture!r} model; int4=True reads Llama GGUFs only")
    heads = {"attn_q": int(field_value(reader, "llama.attention.head_count")),
             "attn_k": int(field_value(reader, "llama.attention.head_count_kv"))}
    blocks = {}
    for tensor in reader.tensors:
        if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
            continue
        _, layer, kind, _ = tensor.name.split(".")  # blk.<layer>.<kind>.weight
        q, d, m = unpack_q4_1(np.asarray(tensor.data))
        if kind in heads:
            order = torch.from_numpy(unpermuted_rows(q.shape[0], heads[kind]))
            q, d, m = q[order], d[order], m[order]
        blocks[f"model.layers.{layer}.{LLAMA_PROJECTIONS[kind]}"] = (q, d, m)
    return blocks


def field_value(reader, key: str):
    """A scalar or string field of a GGUF's metadata."""
    field = reader.fields[key]
    value = field.parts[field.data[0]]
    return bytes(value).decode() if value.dtype == np.uint8 else value[0]


def unpack_q4_1(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, d, m) of a Q4_1 tensor's bytes (N, K/32 * 20): in a block, weight j < 16 is the low 4 bits of byte j of
    its values, weight j >= 16 the high 4 bits of byte j - 16."""
    rows = raw.shape[0]
    block = raw.reshape(rows, -1, BLOCK_BYTES)
    d = block[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = block[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    values = block[..., 4:]
    q = np.concatenate([values & 0x0F, values >> 4], axis=-1).reshape(rows, -1).astype(np.int32)
    return torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(m)


def unpermuted_rows(rows: int, heads: int) -> np.ndarray:
    """The row order transformers gives a Llama GGUF's query or key projection (row i is the GGUF's row
    order[i]): llama.cpp interleaves each head's two rotary halves."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(rows)


def dequantized(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The float32 weights (N, K) the blocks store, d * q + m, as transformers dequantizes them."""
    return d.repeat_interleave(GROUP, 1) * q.float() + m.repeat_interleave(GROUP, 1)


class Int4Linear(nn.Module):
    """An ``nn.Linear`` without bias whose product runs on torch's CPU 4-bit kernel, from the blocks (q, d, m)
    of its weight; the weight stays the linear's own parameter."""

    def __init__(self, linear: nn.Linear, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        dtype = linear.weight.dtype  # the kernel's scales come in the activations' dtype
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1),
                             persistent=False)
        scales_and_zeros = torch.stack([d.t(), (m + 8 * d).t()], dim=-1)  # (K/32, N, 2): scale, zero
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(dtype).contiguous(), persistent=False)

    def forward(self, x):
        if torch.is_grad_enabled() or x.dtype != self.scales_and_zeros.dtype:
            return F.linear(x, self.weight)
        flat = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_weight(self) -> torch.Tensor:
        """The weights (N, K) the kernel computes with, in the scales' dtype (its product with the identity)."""
        identity = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(identity, self.packed, GROUP, self.scales_and_zeros).t()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}"


def int4_linears(model: nn.Module, blocks: dict) -> int:
    """Replace, in place, every linear layer of ``model`` named in ``blocks`` ({name: (q, d, m)}, as
    ``read_q4_1`` reads a GGUF) by an ``Int4Linear`` on those blocks, after checking that they are the model's
    weights (``check_weights``); returns how many. Raises, before changing anything, where a layer does not
    match."""
    weight = model.get_input_embeddings().weight
    why = int4_supported(weight.device, weight.dtype)
    if why:
        raise ValueError(f"int4=True cannot run here: {why}; load with int4=False")
    if not blocks:
        raise ValueError("no Q4_1 blocks were given: int4=True has nothing to run")
    for name, (q, d, m) in blocks.items():
        check_weights(model, name, dequantized(q, d, m))
    for name, (q, d, m) in blocks.items():
        parent, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), child, Int4Linear(model.get_submodule(name), q, d, m))
    model._specdec_int4_linears = len(blocks)
    return len(blocks)


def check_weights(model: nn.Module, name: str, weight: torch.Tensor) -> None:
    """Refuse blocks that are not the model's weights (another model's GGUF): the model's layer ``name`` must be a
    linear layer without bias whose weight is ``weight`` (float32) in the model's dtype."""
    try:
        layer = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"the GGUF stores {name}, which this model does not have: give the GGUF it was converted "
                         "from") from None
    if type(layer) is not nn.Linear or layer.bias is not None or layer.weight.shape != weight.shape or \
            not torch.equal(layer.weight.detach(), weight.to(layer.weight.dtype)):
        raise ValueError(f"the GGUF's blocks of {name} are not this model's weights: give the GGUF the model was "
                         "converted from, or load with int4=False")


def has_int4_linears(model: nn.Module) -> bool:
    return bool(getattr(model, "_specdec_int4_linears", 0))
