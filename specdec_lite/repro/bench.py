"""Timing harness: ours against transformers, side by side, in one run.

    python -m specdec_lite.repro.bench [--device cpu] [--max-new-tokens 64] [--repeats 3] [--gamma 4]

Three comparisons on the embedded target, greedy, each on the same prompts in alternating order:
  1. our autoregressive baseline vs transformers' ``generate``;
  2. our speculative decoding with the n-gram draft vs transformers' prompt lookup (``prompt_lookup_num_tokens``);
  3. our speculative decoding with a draft model vs transformers' assisted generation with the same draft
     (the target's first layers as a standalone model: the layer-skip draft's weights, ``num_assistant_tokens``
     constant at gamma).
Outputs are checked identical under greedy. Reports medians of tokens/s over prompts x repeats, the spread
(25th-75th percentile) and the ratio of medians. The machine is noisy: compare ratios, not absolute times.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import pandas as pd
import torch

from ..core.decode import Clock, autoregressive_generate, speculative_generate
from ..core.lm import HFCausalLM
from ..core.models import DTYPE_HELP, EMBEDDED_TARGET, dtype_name, load_model, resolve_device, resolve_dtype
from ..core.sampling import SamplingParams
from ..drafts.layer_skip import LayerSkipDraft
from ..drafts.ngram import NGramDraft
from .tasks import chat_ids

BENCH_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring and two examples.",
    "Repeat the following list in reverse order, one item per line: apple, banana, cherry, date, elderberry, fig.",
    "Explain in three sentences why the sky is blue.",
]
GREEDY = SamplingParams(temperature=0)


def timed(fn, device, clock=None):
    """(result, seconds) with CUDA synchronized around the call. ``clock``: a function returning seconds (tests
    pass a fake one); by default the device's ``Clock``."""
    now = clock or Clock(device).now
    start = now()
    result = fn()
    return result, now() - start


def summarize(times: dict, tokens: dict) -> pd.DataFrame:
    rows = []
    for name, ts in times.items():
        rates = [n / t for n, t in zip(tokens[name], ts)]
        q = statistics.quantiles(rates, n=4) if len(rates) > 1 else [rates[0]] * 3
        rows.append({"method": name, "median tokens/s": statistics.median(rates), "p25": q[0], "p75": q[2],
                     "runs": len(rates)})
    return pd.DataFrame(rows)


def compare(methods: dict, prompts, repeats: int, device) -> tuple[pd.DataFrame, bool]:
    """Run every method on every prompt ``repeats`` times, interleaved; check greedy outputs are identical."""
    times = {name: [] for name in methods}
    tokens = {name: [] for name in methods}
    identical = True
    for x in prompts:
        for name, fn in methods.items():  # warm-up
            fn(x)
        for r in range(repeats):
            order = list(methods) if r % 2 == 0 else list(reversed(methods))
            outputs = {}
            for name in order:
                out, seconds = timed(lambda: methods[name](x), device)
                outputs[name] = out
                times[name].append(seconds)
                tokens[name].append(len(out))
            first = next(iter(outputs.values()))
            identical &= all(torch.equal(first, o) for o in outputs.values())
    return summarize(times, tokens), identical


def run(device="auto", max_new_tokens=64, repeats=3, gamma=4, exit_layer=10, dtype="auto") -> pd.DataFrame:
    device = resolve_device(device)
    model, tokenizer = load_model(EMBEDDED_TARGET, device=device, dtype=dtype)
    eos = tokenizer.eos_token_id
    prompts = [chat_ids(tokenizer, p, device) for p in BENCH_PROMPTS]
    hf_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=eos)

    def hf(x, **kw):
        return model.generate(x, attention_mask=torch.ones_like(x), **hf_kwargs, **kw)[0, x.shape[1]:].cpu()

    ngram = NGramDraft(max_ngram=3)
    layer_skip = LayerSkipDraft(model, exit_layer=exit_layer)
    assistant = copy.copy(layer_skip.lm.model)  # the same weights, as a standalone transformers model
    assistant.generation_config = copy.deepcopy(model.generation_config)
    assistant.generation_config.num_assistant_tokens = gamma
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0

    def ours_ar(x):
        return autoregressive_generate(model, x, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_token_id=eos).tokens

    def ours_spec(draft):
        return lambda x: speculative_generate(model, draft, x, gamma=gamma, max_new_tokens=max_new_tokens,
                                              sampling=GREEDY, eos_token_id=eos).tokens

    groups = {
        "autoregressive": {"ours": ours_ar, "transformers generate": hf},
        "n-gram draft": {"ours": ours_spec(ngram),
                         "transformers prompt lookup": lambda x: hf(x, prompt_lookup_num_tokens=gamma,
                                                                    max_matching_ngram_size=3)},
        f"draft model (target's first {exit_layer} layers)": {
            "ours": ours_spec(layer_skip),
            "transformers assisted": lambda x: hf(x, assistant_model=assistant)},
    }
    frames = []
    for group, methods in groups.items():
        frame, identical = compare(methods, prompts, repeats, device)
        frame.insert(0, "comparison", group)
        frame["ratio to transformers"] = frame["median tokens/s"] / frame["median tokens/s"].iloc[1]
        frame["greedy outputs identical"] = identical
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def forward_seconds(model, context_len: int = 64, new_tokens=(1, 2, 3, 5, 9), repeats: int = 9,
                    vocab_size: int | None = None, batch_size: int = 1, clock=None) -> dict:
    """Median wall time of one forward over k new tokens (per row, ``batch_size`` rows) on a warm KV cache of
    ``context_len`` tokens, for each k: {k: seconds}. The cache is rolled back after each timed forward, so
    every repeat sees the same state. Each k gets one untimed warm-up forward, then ``repeats`` timed ones.
    ``clock``: a function returning seconds (default: the device's clock, CUDA synchronized)."""
    if repeats < 1 or context_len < 1 or batch_size < 1:
        raise ValueError(f"need repeats, context_len and batch_size >= 1, got {repeats}, {context_len}, {batch_size}")
    if not new_tokens or min(new_tokens) < 1:
        raise ValueError(f"new_tokens must be a non-empty list of counts >= 1, got {new_tokens}")

    lm = HFCausalLM(model, vocab_size=vocab_size)
    device = lm.device
    g = torch.Generator().manual_seed(0)
    context = torch.randint(0, lm.vocab_size, (batch_size, context_len), generator=g).to(device)
    lm.reset(batch_size)
    lm.feed(context, num_logits=1)
    keep = torch.full((batch_size,), context_len)
    out = {}
    for k in new_tokens:
        tokens = torch.randint(0, lm.vocab_size, (batch_size, k), generator=g).to(device)
        times = []
        for r in range(repeats + 1):  # the first is a warm-up
            _, seconds = timed(lambda: lm.feed(tokens), device, clock)
            lm.crop(keep)
            if r:
                times.append(seconds)
        out[k] = statistics.median(times)
    return out


def memory_bandwidth_gbs(megabytes: int = 512, repeats: int = 5, clock=None) -> float:
    """Measured copy bandwidth (read + write) of this machine in GB/s: 2 x the tensor's bytes over the median
    time of copying it. ``clock``: a function returning seconds (default ``time.perf_counter``)."""
    if megabytes < 1 or repeats < 1:
        raise ValueError(f"need megabytes >= 1 and repeats >= 1, got {megabytes}, {repeats}")
    now = clock or time.perf_counter
    src = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        start = now()
        dst.copy_(src)
        times.append(now() - start)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--exit-layer", type=int, default=10)
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    table = run(args.device, args.max_new_tokens, args.repeats, args.gamma, args.exit_layer, args.dtype)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 3):
        print(table.to_string(index=False))
    dtype = dtype_name(resolve_dtype(args.dtype, resolve_device(args.device)))
    print(f"\ndtype {dtype}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{time.perf_counter() - start:.0f} s")
    if not table["greedy outputs identical"].all():
        raise SystemExit("greedy outputs differ between ours and transformers: see the table")


if __name__ == "__main__":
    main()
