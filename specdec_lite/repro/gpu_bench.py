"""The GPU check's benchmark: random-weight Llama models of real shapes, made on the device, eager with a growing
cache against static-cache compiled forwards, side by side in one run.

    python -m specdec_lite.repro.gpu_bench --device cuda        (make gpu-check; about 10 minutes on one GPU)
    python -m specdec_lite.repro.gpu_bench --device cpu --shapes tiny --paths eager-dynamic static-eager

Random weights need no download (a bare GPU machine has only torch and transformers), and speed does not depend
on what the weights say. Acceptance comes from an **oracle drafter**: at each draft position it proposes the
target's own greedy token with probability ``a`` and another token otherwise, while running the real draft
model alongside, so that a round costs what it would with that draft. Per pair and path it reports: the target's
and the draft's ms per token, c, v(gamma) for gamma 1..8, our autoregressive tokens/s against transformers'
``generate``, our speculative tokens/s at a = 0.6, 0.8, 0.9 (gamma 4) against the formula's prediction
E[N] / (gamma c + v(gamma)) from the measured c and v, and transformers' assisted generation with the same two
models. In float32 a speculative output that is not the plain one stops the check; in half precision a forward over
several tokens can round differently from a decode step and the outputs may part (docs/SPEED.md), after which the
oracle's proposals no longer follow the context: the column ``greedy identical a=...`` says whether that happened,
and where it did the row's speed understates the acceptance. Speedups are over the fastest plain decoding of the
target measured in the run (ours on every path, transformers' ``generate``, in the run's dtype and in float32:
column baseline); the speedup over our plain decoding on the same path, which is what the formula predicts, stands
beside it. One CSV, and one figure when matplotlib is installed.

No pandas or seaborn here: the check runs where only torch and transformers are installed.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch

from ..core.decode import autoregressive_generate, speculative_generate
from ..core.drafter import Drafter, ModelDraft
from ..core.lm import use_dynamic_cache, use_static_cache
from ..core.models import DTYPE_HELP, dtype_name, resolve_device, resolve_dtype
from ..core.sampling import SamplingParams
from . import theory
from ..core.timing import timed
from .costs import measure

GREEDY = SamplingParams(temperature=0)
LLAMA3 = dict(num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0)
SHAPES = {  # LlamaConfig fields of the real models (weights random)
    "llama-3.1-8b": dict(LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         tie_word_embeddings=False),
    "llama-3.2-1b": dict(LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         tie_word_embeddings=True),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "smollm2-135m-draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True),
    "tiny-target": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False),
    "tiny-draft": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False),
}
PAIR_SETS = {"gpu": [("llama-3.1-8b", "llama-3.2-1b"), ("smollm2-135m", "smollm2-135m-draft")],
             "tiny": [("tiny-target", "tiny-draft")]}
PATHS = ("eager-dynamic", "static-compiled", "static-eager")
ACCEPTANCES = (0.6, 0.8, 0.9)


def random_llama(shape: str, device, dtype: torch.dtype, seed: int = 0, max_positions: int = 4096):
    """A Llama of a known shape with random weights, made directly on ``device`` in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=max_positions)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


class OracleDraft(Drafter):
    """Proposes the target's own greedy continuation (``reference``, the tokens after the prompt) with
    probability ``a`` per position and a different token otherwise, so that greedy verification accepts each
    position with probability ``a`` until the first miss. The real draft model runs alongside (its tokens are
    discarded), so the round costs what it would with that draft. A point-mass draft: q is None."""

    def __init__(self, draft_model, reference: torch.Tensor, prompt_len: int, a: float, seed: int = 0):
        self.inner = ModelDraft(draft_model)
        self.vocab_size = self.inner.vocab_size
        self.reference, self.prompt_len, self.a, self.seed = reference.cpu(), prompt_len, a, seed

    def begin(self, input_ids: torch.Tensor) -> None:
        self.inner.begin(input_ids)
        self.rng = torch.Generator().manual_seed(self.seed)

    def propose(self, seq, lengths, gamma, sampling, generator):
        self.inner.propose(seq, lengths, gamma, sampling, generator)  # the draft model's cost
        start = int(lengths[0]) - self.prompt_len  # index of the next token in the reference
        tokens = []
        for i in range(gamma):
            right = int(self.reference[start + i]) if start + i < len(self.reference) else 0
            if float(torch.rand((), generator=self.rng)) < self.a:
                tokens.append(right)
            else:  # any other token
                tokens.append((right + 1 + int(torch.randint(self.vocab_size - 1, (), generator=self.rng)))
                              % self.vocab_size)
        return torch.tensor([tokens], device=seq.device), None

    def rollback(self, kept: torch.Tensor) -> None:
        self.inner.rollback(kept)


def tokens_per_second(fn, device, repeats: int) -> tuple[float, object]:
    """Median tokens/s of ``fn()`` (which returns new tokens) over ``repeats`` timed calls after one warm-up
    call (which also compiles); returns (tokens/s, the last output)."""
    out = fn()
    rates = []
    for _ in range(repeats):
        out, seconds = timed(fn, device)
        rates.append(len(out) / seconds)
    return statistics.median(rates), out


def set_path(models, path: str, max_length: int) -> None:
    for model in models:
        if path == "eager-dynamic":
            use_dynamic_cache(model)
        else:
            use_static_cache(model, max_length=max_length, compile=path == "static-compiled")


def measure_pair(target, draft, path: str, *, prompt_len=64, new_tokens=128, gamma=4, repeats=3, seed=0,
                 acceptances=ACCEPTANCES) -> dict:
    """One row of the check: costs, autoregressive and speculative tokens/s, predictions, for one path."""
    device = target.device
    vocab = target.config.vocab_size
    x = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(seed)).to(device)
    set_path([target, draft], path, max_length=prompt_len + new_tokens + 16)
    # compiled forwards compile once per shape: there, only the shapes the loop uses (1 and gamma + 1 tokens)
    gammas = [gamma] if path == "static-compiled" else range(1, 9)
    costs = measure(target, draft, gammas=gammas, repeats=max(3, repeats), context_len=prompt_len)
    ar_tps, reference = tokens_per_second(
        lambda: autoregressive_generate(target, x, max_new_tokens=new_tokens, sampling=GREEDY, ignore_eos=True).tokens,
        device, repeats)
    row = {"path": path, "target ms/token": 1000 * costs.target_seconds[1], "draft ms/token": 1000 * costs.draft_seconds,
           "c": costs.c, **{f"v({g})": costs.v.get(g, float("nan")) for g in range(1, 9)}, "ours autoregressive tokens/s": ar_tps}
    for a in acceptances:
        oracle = OracleDraft(draft, reference, prompt_len, a, seed)
        spec_tps, out = tokens_per_second(lambda: speculative_generate(
            target, oracle, x, gamma=gamma, max_new_tokens=new_tokens, sampling=GREEDY, ignore_eos=True).tokens,
            device, repeats)
        identical = torch.equal(out.cpu(), reference.cpu())
        if not identical and target.dtype == torch.float32:  # promised in float32 only (docs/SPEED.md)
            raise AssertionError(f"greedy identity broken on the {path} path at a = {a}")
        predicted = theory.speedup(a, gamma, costs.c, costs.v[gamma])
        row |= {f"speculative tokens/s a={a}": spec_tps, f"speedup over same path a={a}": spec_tps / ar_tps,
                f"predicted speedup a={a}": predicted, f"greedy identical a={a}": identical}
    set_path([target, draft], "eager-dynamic", 0)
    return row


def plain_float32(target_shape: str, device, *, prompt_len=64, new_tokens=128, repeats=3, seed=0) -> dict:
    """{name: tokens/s} of plain decoding of the target in float32, ours and transformers' (baseline candidates
    beside the run's half precision); empty when a float32 copy does not fit on the device."""
    try:
        target = random_llama(target_shape, device, torch.float32, seed=0)
    except torch.OutOfMemoryError:
        return {}
    x = torch.randint(0, target.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    x = x.to(device)
    ours, _ = tokens_per_second(
        lambda: autoregressive_generate(target, x, max_new_tokens=new_tokens, sampling=GREEDY, ignore_eos=True).tokens,
        device, repeats)
    theirs, _ = tokens_per_second(lambda: target.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=0)[0, prompt_len:], device, repeats)
    return {"ours autoregressive (eager-dynamic, float32)": ours, "transformers generate (float32)": theirs}


def add_baseline(rows: list[dict], float32: dict) -> None:
    """Give one pair's rows (one per path) the baseline of the fastest plain decoding: the highest tokens/s among
    ours autoregressive on every path, transformers' generate, and ``float32`` ({name: tokens/s}); then the
    speedup at each acceptance over it. The speedup over the same path (what the formula predicts) stays."""
    dtype = rows[0]["dtype"]
    candidates = {f"ours autoregressive ({r['path']}, {dtype})": r["ours autoregressive tokens/s"] for r in rows}
    candidates[f"transformers generate ({dtype})"] = rows[0]["transformers generate tokens/s"]
    candidates.update(float32)
    name = max(candidates, key=candidates.get)
    for r in rows:
        r |= {"baseline": name, "baseline tokens/s": candidates[name]}
        r |= {f"speedup a={a}": r[f"speculative tokens/s a={a}"] / candidates[name] for a in ACCEPTANCES}


def transformers_rows(target, draft, *, prompt_len=64, new_tokens=128, gamma=4, repeats=3, seed=0) -> dict:
    """transformers' own generate and assisted generation with the same models (eager, its default cache)."""
    device = target.device
    x = torch.randint(0, target.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    x = x.to(device)
    kwargs = dict(attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                  do_sample=False, pad_token_id=0)
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    hf_tps, _ = tokens_per_second(lambda: target.generate(x, **kwargs)[0, prompt_len:], device, repeats)
    assisted_tps, _ = tokens_per_second(lambda: target.generate(x, assistant_model=draft, **kwargs)[0, prompt_len:],
                                        device, repeats)
    return {"transformers generate tokens/s": hf_tps, "transformers assisted tokens/s": assisted_tps}


def run(device="cuda", shapes="gpu", paths=("eager-dynamic", "static-compiled"), dtype="auto", new_tokens=128,
        repeats=3, log=print) -> list[dict]:
    """Every pair of ``PAIR_SETS[shapes]`` on every path; one row per (pair, path)."""
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        raise ValueError(f"unknown paths {unknown}; choose from {list(PATHS)}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rows = []
    for target_shape, draft_shape in PAIR_SETS[shapes]:
        start = time.perf_counter()
        target = random_llama(target_shape, device, dtype, seed=0)
        draft = random_llama(draft_shape, device, dtype, seed=1)
        common = {"device": name, "dtype": dtype_name(dtype), "target": target_shape, "draft": draft_shape,
                  "new tokens": new_tokens}
        hf = transformers_rows(target, draft, new_tokens=new_tokens, repeats=repeats)
        mine = []
        for path in paths:
            row = common | measure_pair(target, draft, path, new_tokens=new_tokens, repeats=repeats) | hf
            row["ours / transformers generate"] = row["ours autoregressive tokens/s"] / hf["transformers generate tokens/s"]
            mine.append(row)
            log(f"{target_shape} + {draft_shape}, {path}: target {row['target ms/token']:.2f} ms/token, c {row['c']:.3f}, "
                f"autoregressive {row['ours autoregressive tokens/s']:.0f} tokens/s (transformers "
                f"{hf['transformers generate tokens/s']:.0f}), a=0.8 speedup over the same path "
                f"{row['speedup over same path a=0.8']:.2f}x (predicted {row['predicted speedup a=0.8']:.2f}x); "
                f"{time.perf_counter() - start:.0f} s so far")
        del target, draft
        if device.type == "cuda":
            torch.cuda.empty_cache()
        float32 = {} if dtype == torch.float32 else plain_float32(target_shape, device, new_tokens=new_tokens,
                                                                    repeats=repeats)
        add_baseline(mine, float32)
        log(f"{target_shape}: baseline {mine[0]['baseline']} ({mine[0]['baseline tokens/s']:.0f} tokens/s); a=0.8 "
            "speedup over it: " + ", ".join(f"{r['path']} {r['speedup a=0.8']:.2f}x" for r in mine))
        rows += mine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def write_csv(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
    return path


def write_figure(rows: list[dict], path: Path) -> Path | None:
    """Tokens/s per pair and path (``figures.gpu_check``): transformers, ours autoregressive, ours speculative
    (measured, and the formula's prediction as a marker). None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from . import figures
    except ImportError:
        return None
    figures.save(figures.gpu_check(rows, ACCEPTANCES), path, dpi=110, close=True)
    return path


def main(argv=None):
    """python -m specdec_lite.repro.gpu_bench: random-weight Llama pairs, eager-dynamic vs static-compiled."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="gpu", choices=sorted(PAIR_SETS),
                        help="gpu: Llama-3.1-8B + Llama-3.2-1B and SmolLM2-135M shapes; tiny: the CPU smoke test")
    parser.add_argument("--paths", nargs="+", default=["eager-dynamic", "static-compiled"], choices=PATHS)
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="out/gpu_check")
    args = parser.parse_args(argv)
    rows = run(args.device, args.shapes, args.paths, args.dtype, args.new_tokens, args.repeats)
    out = Path(args.out)
    print("wrote", write_csv(rows, out / "gpu_check.csv"))
    figure = write_figure(rows, out / "gpu_check.png")
    print("wrote", figure) if figure else print("no figure: matplotlib is not installed")


if __name__ == "__main__":
    main()
