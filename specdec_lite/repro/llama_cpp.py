"""llama.cpp's plain decoding of the embedded target's GGUF, in this process, timed as ours is: what a user who
only wants the model fast on a CPU would pick instead (``bench --llama-cpp``).

It runs llama-cpp-python as ``make setup`` builds it (for any x86-64 CPU with AVX2: no AVX-512, no AMX; the
Makefile's ``LLAMA_CMAKE_ARGS``), on the GGUF's own 4-bit blocks, with as many threads as torch uses. A run feeds the
prompt's token ids (the same chat-formatted ids ours gets), then samples ``max_new_tokens`` tokens, end-of-sequence
tokens included, from a fresh context (no prompt cache is reused); its time covers the prompt and every token.
Greedy is llama.cpp's greedy sampler; at T > 0 its sampler at that temperature with top-k, top-p and min-p off:
the same law as ours, drawn by another generator.

``llama_cpp_costs`` measures llama.cpp's own v(n), a forward over n tokens with their logits against one decode
step, as ``instruments.timing.cost_by_tokens`` does for ours: it says whether speculative decoding could pay on
llama.cpp's kernels on this machine (a round must keep more than v(n) tokens for a verification of n).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ..core.sampling import SamplingParams
from ..core.stats import Generation, GenerationStats
from ..instruments.timing import relative_to_one_token

CONTEXT = 1024  # tokens: a prompt and its new tokens fit


def load_gguf(gguf: str | Path, threads: int | None = None, seed: int = 0, logits_all: bool = False):
    """llama-cpp-python's model over ``gguf`` with as many threads as torch uses (``threads``: another count);
    ``logits_all``: every evaluated token's logits are kept (a verification needs them), not only the last."""
    from llama_cpp import Llama

    threads = threads or torch.get_num_threads()
    return Llama(model_path=str(gguf), n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads, seed=seed,
                 logits_all=logits_all, verbose=False)


def llama_cpp_plain(gguf: str | Path, max_new_tokens: int, sampling: SamplingParams, seed: int,
                    threads: int | None = None):
    """A function x (1, T) -> ``Generation``: llama.cpp's plain decoding of ``gguf`` (loaded once, here)."""
    llm = load_gguf(gguf, threads, seed)
    options = dict(temp=0.0) if sampling.greedy else dict(
        temp=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=0.0)

    def generate(x: torch.Tensor) -> Generation:
        if x.shape[0] != 1:
            raise ValueError(f"llama.cpp's plain decoding here takes one prompt, got {x.shape[0]}")
        llm.reset()  # a fresh context: no prompt cache is reused
        llm.set_seed(seed)
        tokens = []
        start = time.perf_counter()
        for token in llm.generate(x[0].tolist(), repeat_penalty=sampling.repetition_penalty, **options):
            tokens.append(token)
            if len(tokens) == max_new_tokens:
                break
        seconds = time.perf_counter() - start
        stats = GenerationStats(new_tokens=len(tokens), total_seconds=seconds, rounds=len(tokens))
        return Generation([torch.tensor(tokens, dtype=torch.long)], stats)

    return generate


def llama_cpp_costs(gguf: str | Path, tokens=(2, 4, 8, 16), context_len: int = 64, repeats: int = 9,
                    threads: int | None = None) -> dict:
    """v(n) = T(n tokens) / T(1 token) of llama.cpp's forward over ``gguf`` with every token's logits, for each n
    of ``tokens`` and 1: the median of ``repeats`` timed forwards (after one untimed) on a context of
    ``context_len`` random tokens, rolled back after each so that every forward sees the same cache."""
    if repeats < 1 or context_len < 1 or not tokens or min(tokens) < 1:
        raise ValueError(f"need repeats >= 1, context_len >= 1 and token counts >= 1, got {repeats}, "
                         f"{context_len}, {list(tokens)}")
    if context_len + max(tokens) > CONTEXT:
        raise ValueError(f"context_len + max(tokens) must fit llama.cpp's context of {CONTEXT} tokens, got "
                         f"{context_len} + {max(tokens)}")
    llm = load_gguf(gguf, threads, logits_all=True)
    generator = torch.Generator().manual_seed(0)

    def random_ids(n: int) -> list[int]:
        return torch.randint(llm.n_vocab(), (n,), generator=generator).tolist()

    llm.eval(random_ids(context_len))
    seconds = {}
    for n in sorted({1, *tokens}):
        batch, times = random_ids(n), []
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            llm.eval(batch)
            times.append(time.perf_counter() - start)
            llm.n_tokens = context_len  # the next eval drops the cache's entries from here on
        seconds[n] = statistics.median(times[1:])
    return relative_to_one_token(seconds)
