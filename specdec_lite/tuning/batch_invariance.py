"""Batch-invariant forwards, on request: the logits of a position must not depend on how many tokens one forward
carries.

Greedy identity, token for token (speculative output == the target's own greedy output), needs the verification
forward over k+1 tokens to give each position exactly the logits that a one-token decode step gives it. In
float32 the two differ by about 1e-5 and the argmax practically never moves. In bfloat16 every layer rounds its
output to 8 bits of mantissa, so a different order of a sum can grow into a flipped argmax: unpatched, greedy
speculative and plain output on the embedded target part after some tokens in many runs (docs/SPEED.md has the
measured agreement). The output *law* stays the target's either way: the verifier is exact for the distributions
the verifying forward computes.

Which matrix products are batch-invariant is a property of the CPU's kernels, not of the model: on one AMD EPYC
(AVX512-BF16) bfloat16 products with an inner dimension K <= 1024 were invariant and K = 1536 was not; on an Intel
Xeon with AMX, K = 32, 576 and 1024 were not and 64, 128, 256 and 1536 were. So nothing here assumes a pattern:
``make_batch_invariant`` probes each linear layer's shape at every forward width the loop uses and picks, per
shape, the first way of computing it that passes (``WAYS``): as it is; as a sum over 2 or 4 chunks of K;
in float32 and rounded back; as a sum over smaller chunks. A shape no way makes invariant is refused with an
error that says what to do. Attention is computed in float64 from the model's q, k and v.

This is the CPU counterpart of the batch-invariant kernels of He et al. 2025 ("Defeating Nondeterminism in LLM
Inference", Thinking Machines Lab), done at the level of layers instead of kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PROBE_WIDTHS = tuple(range(2, 34))  # forward widths a row must be invariant across: chains and trees of <= 32 nodes
MIN_CHUNK = 64  # the smallest chunk of K tried
ATTENTION = "specdec_float64"  # the attention implementation registered below


def float64_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention computed in float64 from the model's (bfloat16) q, k, v, then rounded to the model's dtype.

    q (B, H, n, D), k and v (B, Hkv, L, D). A product of two bfloat16 numbers is exact in float64 and so, in
    practice, are the 64-term sums of q.k; softmax and the weighted sum of v differ between forwards of different
    widths by about 1e-16, far below bfloat16's rounding step (4e-3), so the rounded result is the same bits.
    The additive mask (eager format, or the loop's 4-D tree mask) hides the keys a query must not see."""
    groups = query.shape[1] // key.shape[1]
    k = key.double().repeat_interleave(groups, dim=1)  # grouped-query attention: share k/v across heads
    v = value.double().repeat_interleave(groups, dim=1)
    scores = torch.matmul(query.double(), k.transpose(2, 3)) * scaling  # (B, H, n, L)
    if attention_mask is not None:
        scores = scores + attention_mask[..., : k.shape[-2]].double()
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # (B, H, n, D)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Register ``float64_attention`` with transformers (imported here: transformers' modeling utilities are
    heavy, and ``import specdec_lite`` stays light)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION, float64_attention)
    AttentionMaskInterface.register(ATTENTION, eager_mask)  # an additive float mask, always materialized


class SplitKLinear(nn.Module):
    """A linear layer computed as a sum over chunks of its inner dimension, each chunk a batch-invariant
    product; the partial sums are added in float32 and rounded once to the layer's dtype."""

    def __init__(self, linear: nn.Linear, chunk: int):
        super().__init__()
        self.weight, self.bias, self.chunk = linear.weight, linear.bias, chunk
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x):
        total = None
        for start in range(0, self.in_features, self.chunk):
            part = F.linear(x[..., start: start + self.chunk], self.weight[:, start: start + self.chunk]).float()
            total = part if total is None else total + part
        out = total.to(x.dtype)
        return out if self.bias is None else out + self.bias


class Float32Linear(nn.Module):
    """A linear layer computed in float32 (a float32 copy of its weight) and rounded to the input's dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight32 = linear.weight.detach().float()
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x):
        out = F.linear(x.float(), self.weight32).to(x.dtype)
        return out if self.bias is None else out + self.bias


def rows_are_invariant(layer: nn.Module, weight: torch.Tensor, widths=PROBE_WIDTHS, seed: int = 0) -> bool:
    """True when ``layer`` (computing a product with ``weight``) gives each input row the same bits alone as among
    the first m rows, for every m in ``widths``. Inputs are random, in the weight's dtype, on its device."""
    x = torch.randn(max(widths), weight.shape[1], generator=torch.Generator().manual_seed(seed)).to(weight)
    with torch.no_grad():
        alone = torch.cat([layer(x[i: i + 1]) for i in range(len(x))])
        return all(torch.equal(alone[:m], layer(x[:m])) for m in widths)


def ways(linear: nn.Linear) -> dict:
    """{name: function making the layer computed that way} for ``linear``, cheapest expected first: as it is, in 2
    or 4 equal chunks of K, in float32, then in chunks of 1024, 512, ..., 64 (the last chunk takes the rest)."""
    K = linear.in_features
    coarse = [K // n for n in (2, 4) if K % n == 0 and K // n >= MIN_CHUNK]
    fine = [c for c in (1024, 512, 256, 128, MIN_CHUNK) if c < K and c not in coarse]

    def split(chunk):
        return f"{-(-K // chunk)} chunks of {chunk}", lambda: SplitKLinear(linear, chunk)

    return dict([("as is", lambda: linear), *map(split, coarse), ("float32", lambda: Float32Linear(linear)),
                 *map(split, fine)])


def first_invariant_way(linear: nn.Linear, probe=rows_are_invariant) -> str | None:
    """The name of the first of ``ways(linear)`` whose layer ``probe(layer, linear.weight)`` passes, or None.
    ``probe``: the invariance test (another one simulates another CPU's kernels)."""
    for name, make in ways(linear).items():
        if probe(make(), linear.weight.detach()):
            return name
    return None


def make_batch_invariant(model: nn.Module, probe=rows_are_invariant) -> dict:
    """Make every position's logits independent of the forward's width: attention in float64, and each linear
    layer computed the first way that ``probe`` finds invariant (``first_invariant_way``; one probe per
    shape). Changes the model in place; returns {layer name: way} for the layers not kept as they are. Raises,
    before changing anything, when a layer has no invariant way on this machine."""
    chosen: dict = {}  # (out, in) -> way name, or None when no way is invariant
    linears = [(parent, child_name, child) for parent in model.modules()
               for child_name, child in parent.named_children() if type(child) is nn.Linear]
    for _, _, linear in linears:
        shape = tuple(linear.weight.shape)
        if shape not in chosen:
            chosen[shape] = first_invariant_way(linear, probe)
            if chosen[shape] is None:
                raise RuntimeError(
                    f"batch_invariant=True cannot hold here: a {shape} linear layer in {linear.weight.dtype} gives "
                    "different bits for a row alone and among others on this CPU, as it is, in chunks and in "
                    "float32. Load with batch_invariant=False (the output law is still exact; greedy output may "
                    "part from plain decoding after some tokens) or with dtype='float32'")
    names = {id(m): n for n, m in model.named_modules()}
    changed = {}
    for parent, child_name, linear in linears:
        way = chosen[tuple(linear.weight.shape)]
        if way != "as is":
            setattr(parent, child_name, ways(linear)[way]())
            changed[f"{names[id(parent)]}.{child_name}".lstrip(".")] = way
    register_attention()
    model.set_attn_implementation(ATTENTION)
    model._specdec_batch_invariant = True
    return changed


def is_batch_invariant(model: nn.Module) -> bool:
    return bool(getattr(model, "_specdec_batch_invariant", False))
