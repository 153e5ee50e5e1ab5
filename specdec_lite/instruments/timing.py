"""Wall-clock costs on this machine: one timed call, the median forward time of a model over n new tokens on a
warm KV cache, and v(n) = T(n tokens) / T(1 token), the verification cost of n tokens in decode steps, which the
cost model (``repro.theory``) and the dynamic token tree (``drafts.trees``) read.
"""
from __future__ import annotations

import statistics

import numpy as np
import torch

from ..core.stats import Clock
from ..core.lm import HFCausalLM
from ..core.tree import Tree, attention_mask, positions


def timed(fn, device, clock=None):
    """(result, seconds) with CUDA synchronized around the call. ``clock``: a function returning seconds (tests
    pass a fake one); by default the device's ``Clock``."""
    now = clock or Clock(device).now
    start = now()
    result = fn()
    return result, now() - start


def forward_seconds(model, context_len: int = 64, new_tokens=(1, 2, 3, 5, 9), repeats: int = 9,
                    vocab_size: int | None = None, batch_size: int = 1, clock=None, tree: bool = False) -> dict:
    """Median wall time of one forward over k new tokens (per row, ``batch_size`` rows) on a warm KV cache of
    ``context_len`` tokens, for each k: {k: seconds}. The cache is rolled back after each timed forward, so
    every repeat sees the same state. Each k gets one untimed warm-up forward, then ``repeats`` timed ones.
    ``clock``: a function returning seconds (default: the device's clock, CUDA synchronized). ``tree`` (batch 1):
    every k > 1 runs as a token tree's verification does (``feed_tree``, a chain of k tokens under the tree mask),
    which on a compiled static cache pads its rows to a ``TREE_ROWS`` budget; k = 1 stays a decode step."""
    if repeats < 1 or context_len < 1 or batch_size < 1:
        raise ValueError(f"need repeats, context_len and batch_size >= 1, got {repeats}, {context_len}, {batch_size}")
    if not new_tokens or min(new_tokens) < 1:
        raise ValueError(f"new_tokens must be a non-empty list of counts >= 1, got {new_tokens}")
    if tree and batch_size != 1:
        raise ValueError(f"tree forwards run one prompt at a time: batch_size must be 1 with tree=True, got "
                         f"{batch_size}")

    lm = HFCausalLM(model, vocab_size=vocab_size)
    device = lm.device
    g = torch.Generator().manual_seed(0)
    context = torch.randint(0, lm.vocab_size, (batch_size, context_len), generator=g).to(device)
    lm.reset(batch_size)
    lm.feed(context, num_logits=1)
    keep = [context_len] * batch_size
    out = {}
    for k in new_tokens:
        tokens = torch.randint(0, lm.vocab_size, (batch_size, k), generator=g).to(device)
        feed = chain_tree_feed(lm, tokens, context_len) if tree and k > 1 else (lambda: lm.feed(tokens))
        times = []
        for r in range(repeats + 1):  # the first is a warm-up
            _, seconds = timed(feed, device, clock)
            lm.crop(keep)
            if r:
                times.append(seconds)
        out[k] = statistics.median(times)
    return out


def chain_tree_feed(lm: HFCausalLM, tokens: torch.Tensor, cached: int):
    """A call feeding ``tokens`` (1, k) after ``cached`` tokens as one tree forward: the first is the root, the
    others a chain of nodes under it (mask and positions of ``core.tree``)."""
    k = tokens.shape[1]
    chain = Tree(tokens[0].cpu(), torch.arange(-1, k - 1))
    mask = attention_mask(chain, cached, 1, lm.model.dtype, tokens.device)
    position_ids = positions(chain, cached, 1, tokens.device)
    return lambda: lm.feed_tree(tokens, mask, position_ids)


def relative_to_one_token(target_seconds: dict) -> dict:
    """{n: T(n tokens) / T(1 token)} from {tokens: median seconds}."""
    return {n: seconds / target_seconds[1] for n, seconds in target_seconds.items()}


def cost_by_tokens(target_model, tokens, repeats: int = 9, context_len: int = 64, clock=None) -> dict:
    """v(n) = T(n tokens) / T(1 token) of ``target_model`` for each n of ``tokens`` and 1: the verification cost
    of n tokens in one forward, a token tree of n - 1 nodes among them (``v_at`` interpolates).
    ``clock`` as in ``forward_seconds``."""
    seconds = forward_seconds(target_model, context_len=context_len, new_tokens=sorted({1, *tokens}),
                              repeats=repeats, clock=clock)
    return relative_to_one_token(seconds)


def v_at(v_by_tokens: dict, tokens: float) -> float:
    """v(n) interpolated from measured {tokens in one forward: cost over one decode step} (``forward_seconds``),
    linear between measured points and extrapolated from the last two, never downwards: a forward over more
    tokens costs no less, so each point counts at least as much as the largest before it (timing noise on a busy
    machine can make a larger forward measure the faster, which would otherwise pick trees of that size)."""
    xs = np.array(sorted(v_by_tokens), dtype=float)
    ys = np.maximum.accumulate(np.array([v_by_tokens[x] for x in sorted(v_by_tokens)], dtype=float))
    if tokens > xs[-1] and len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])  # >= 0: ys is a running maximum
        return float(ys[-1] + (tokens - xs[-1]) * slope)
    return float(np.interp(tokens, xs, ys))
