"""llama.cpp's plain decoding of the embedded target's GGUF, in this process, timed as ours is: what a user who
only wants the model fast on a CPU would pick instead (``bench --llama-cpp``).

It runs llama-cpp-python as ``make setup`` builds it (for any x86-64 CPU with AVX2: no AVX-512, no AMX; the
Makefile's ``LLAMA_CMAKE_ARGS``), on the GGUF's own 4-bit blocks, with as many threads as torch uses. A run feeds the
prompt's token ids (the same chat-formatted ids ours gets), then samples ``max_new_tokens`` tokens, end-of-sequence
tokens included, from a fresh context (no prompt cache is reused); its time covers the prompt and every token.
Greedy is llama.cpp's greedy sampler; at T > 0 its sampler at that temperature with top-k, top-p and min-p off:
the same law as ours, drawn by another generator.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..core.sampling import SamplingParams
from ..core.stats import Generation, GenerationStats

CONTEXT = 1024  # tokens: a prompt and its new tokens fit


def llama_cpp_plain(gguf: str | Path, max_new_tokens: int, sampling: SamplingParams, seed: int,
                    threads: int | None = None):
    """A function x (1, T) -> ``Generation``: llama.cpp's plain decoding of ``gguf`` (loaded once, here)."""
    from llama_cpp import Llama

    threads = threads or torch.get_num_threads()
    llm = Llama(model_path=str(gguf), n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads, seed=seed,
                verbose=False)
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
