"""Batch-invariant forwards: the logits of a position must not depend on how many tokens one forward carries.

Greedy identity (speculative output == the target's own greedy output) needs the verification forward over
k+1 tokens to give each position exactly the logits that a one-token decode step gives it. In float32 the two
differ by about 1e-5 and the argmax practically never moves. In bfloat16 every layer rounds its output to 8 bits
of mantissa, so any difference in the order of a sum grows into flipped argmaxes: measured on the embedded target
on an AVX-512-BF16 CPU, speculative and plain greedy output differed in 14 of 24 runs.

Where the difference comes from (probed on that CPU, torch 2.13 / oneDNN): a bfloat16 matrix product whose inner
dimension K is at most 1024 gives each row the same bits whatever the number of rows M; above that (the MLP's
down projection, K = 1536) the library splits the sum differently for different M. ``make_batch_invariant``
probes every linear layer's shape and replaces the ones that fail with ``SplitKLinear``: the product summed over
chunks of K small enough to be invariant, accumulated in float32. The model's function changes by a rounding
(the chunks' sum is rounded once more), the same for every forward, so ours-speculative, ours-autoregressive and
transformers' ``generate`` on the patched model agree token for token (``tests/test_faster_drafting.py``).

This is the CPU counterpart of the batch-invariant kernels of He et al. 2025 ("Defeating Nondeterminism in LLM
Inference", Thinking Machines Lab), done at the level of layers instead of kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PROBE_ROWS = (2, 3, 5, 9, 16, 33)  # forward widths probed: decode (1), chains and trees (2..33)
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


def rows_are_invariant(weight: torch.Tensor, rows=PROBE_ROWS, seed: int = 0) -> bool:
    """True when ``F.linear`` with this weight gives each input row the same bits alone or among ``rows`` rows."""
    generator = torch.Generator().manual_seed(seed)
    for m in rows:
        x = torch.randn(m, weight.shape[1], generator=generator).to(weight)
        alone = torch.cat([F.linear(x[i: i + 1], weight) for i in range(m)])
        if not torch.equal(alone, F.linear(x, weight)):
            return False
    return True


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


def invariant_chunk(weight: torch.Tensor) -> int | None:
    """The largest chunk of K (a divisor of K, halving) whose products are batch-invariant; None if none is."""
    K = weight.shape[1]
    chunk = K
    while chunk >= 64:
        if K % chunk == 0 and rows_are_invariant(weight[:, :chunk]):
            return chunk
        chunk //= 2
    return None


def make_batch_invariant(model: nn.Module) -> list[str]:
    """Switch the model's attention to ``float64_attention`` and replace, in place, the linear layers whose products are not batch-invariant on this device by
    ``SplitKLinear``; returns the names of the replaced layers. Shapes are probed once each. Raises when some
    layer cannot be made invariant (then use float32, where the argmax does not move)."""
    verdicts: dict = {}  # (out, in) -> the chunk of K, or "as is"
    replaced = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not nn.Linear:
                continue
            shape = tuple(child.weight.shape)
            if shape not in verdicts:
                weight = child.weight.detach()
                verdicts[shape] = "as is" if rows_are_invariant(weight) else invariant_chunk(weight)
                if verdicts[shape] is None:
                    raise RuntimeError(f"a {shape} linear layer in {weight.dtype} is not batch-invariant here in any "
                                       "chunking; load the model in float32")
            if verdicts[shape] != "as is":
                setattr(module, child_name, SplitKLinear(child, verdicts[shape]))
                replaced.append(f"{name}.{child_name}" if name else child_name)
    register_attention()
    model.set_attn_implementation(ATTENTION)
    model._specdec_batch_invariant = True
    return replaced


def is_batch_invariant(model: nn.Module) -> bool:
    return bool(getattr(model, "_specdec_batch_invariant", False))
