"""Timing harness: every configuration of the target side by side in one run, against the fastest plain decoding.

    python -m specdec_lite.repro.bench [--prompts-per-task 2] [--max-new-tokens 96] [--temperatures 0 1]
                                       [--drafts auto hybrid-dynamic@smollm2-135m-eagle-deep-ttt eagle-tree] [--head H]
                                       [--skip-per-task 5]  (prompts outside 03's benchmark)
                                       [--no-batch-invariant]  (only the models as they load)
                                       [--static]  (also each native dtype on the static cache)
                                       [--compiled]  (also each native dtype and the 4-bit target on the static
                                                      cache, compiled)
                                       [--llama-cpp]  (also llama.cpp's plain decoding of the embedded GGUF)
                                       [--only LABEL ...]  (time only these configurations)

Configurations: the target loaded as it is in float32 and in each half precision the device runs
(``plain_dtypes``), and in native half precision also made batch-invariant (``load_model(batch_invariant=True)``,
where this CPU allows it). Methods in each: ours autoregressive, and transformers' ``generate`` on the models as
they load; in the dtypes the device computes natively (``native_dtypes``) also ours with each draft of
``--drafts`` (``load_draft``'s names, ``"auto"`` by default) and, on the models as they load, transformers' prompt
lookup. Emulated half precision (a CPU without AVX512-BF16 or AMX) is timed plainly only: it is a candidate for
the baseline, as plain decoding there can beat float32, but not a configuration to draft in; so is float32 as
transformers loads it, beside ours with packed linear layers (``tuning.packed_linear``); so is the embedded
target on its 4-bit blocks (``tuning.int4``), drafted in where the CPU computes bfloat16 natively. With
``--llama-cpp``, llama.cpp's plain decoding of the embedded target's GGUF (``llama_cpp.py``) is timed beside the
first configuration: a row of its own, not a baseline candidate; its v(n) is measured after the runs
(``llama_cpp.llama_cpp_costs``: could speculative decoding pay on its kernels here?). The project's
evaluation prompts, every run exactly ``max_new_tokens`` tokens (EOS ignored), each method warmed up first,
interleaved per prompt (``evaluate.run_prompts``). The table gives, per temperature, the median ms per token,
the median per-prompt speed over the fastest plain decoding of the run (``baseline``), and for greedy runs how
many outputs are token for token those of plain decoding of the same configuration. The machine is noisy:
compare ratios from one run.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from ..names import EMBEDDED_TARGET, embedded_gguf_path
from ..tuning.devices import cpu_flags, cpuinfo, dtype_name, native_dtypes, resolve_device
from ..core.models import load_model
from ..tuning.packed_linear import kept_unpacked
from ..core.sampling import SamplingParams
from ..drafts.heads import runs_compiled
from ..drafts.loading import TREE_DRAFTS, load_draft, tree_draft
from . import baseline
from .llama_cpp import llama_cpp_costs, llama_cpp_plain
from .theory import geometric_mean
from .tasks import TASKS, load_prompts


STATIC = " static cache"  # the label's ending for a configuration on the preallocated cache
COMPILED = " compiled"  # ... and for one on it compiled (``tuning.compiled``)
COMPILED_CACHE = 512  # tokens: one cache size for every prompt, so that no new graph compiles while timing
LLAMA_CPP, LLAMA_CPP_CONFIG = "llama.cpp plain", "Q4_1 GGUF, llama.cpp"  # its row's method and configuration


def configurations(name: str, device, batch_invariant: bool = True, static: bool = False,
                   compiled: bool = False) -> dict:
    """{label: model}: the target in each plain configuration of ``baseline.plain_configurations`` (each dtype of
    ``plain_dtypes`` as it loads, and float32 as transformers loads it where ours packs its linear layers), and
    (``batch_invariant``) each native half precision made batch-invariant (left out, with a line saying why,
    where this CPU's kernels do not allow it), and (``static``) each native dtype on the static cache
    (``load_model(cache="static")``, label ending in ``STATIC``), and (``compiled``) each native dtype on the
    static cache compiled (``COMPILED_CACHE`` tokens, label ending in ``COMPILED``), the 4-bit target too. The
    baseline, the fastest plain decoding, is among the plain configurations (ours on the static cache, compiled or
    not, too), so leaving the others out only leaves out rows."""
    out, native = {}, native_dtypes(device)
    for config in baseline.plain_configurations(device, name):
        dtype = config["dtype"]
        model, _ = load_model(name, device, **config)
        out[baseline.configuration(model)] = model
        if config["int4"]:
            if compiled:
                model, _ = load_model(name, device, dtype, int4=True, cache="static", max_cache_len=COMPILED_CACHE,
                                      compile=True)
                out[dtype_name(dtype) + baseline.INT4 + STATIC + COMPILED] = model
            continue
        if static and dtype in native and drafted_in(model, native):
            model, _ = load_model(name, device, dtype, packed_linears=config["packed_linears"], cache="static")
            out[baseline.configuration(model) + STATIC] = model
        if compiled and dtype in native and drafted_in(model, native):
            model, _ = load_model(name, device, dtype, cache="static", max_cache_len=COMPILED_CACHE, compile=True)
            out[dtype_name(dtype) + STATIC + COMPILED] = model
        if dtype in native and dtype != torch.float32 and batch_invariant and config["packed_linears"] is None:
            try:
                model, _ = load_model(name, device, dtype, batch_invariant=True)
                out[baseline.configuration(model)] = model
            except RuntimeError as err:
                print(f"{dtype_name(dtype)} batch-invariant left out: {err}")
    return out


def drafted_in(model, native: list) -> bool:
    """Whether the bench drafts in this configuration: a dtype the device computes natively (``native``), loaded
    the way ours runs it (float32 with transformers' own linear layers, like emulated half precision, is timed
    plainly: a candidate for the baseline only)."""
    return model.dtype in native and (runs_compiled(model) or not kept_unpacked(model))  # compiled runs unpacked


def run(name=EMBEDDED_TARGET, device="auto", prompts_per_task=2, max_new_tokens=96, temperatures=(0.0, 1.0),
        gamma=4, seed=0, progress=True, drafts=("auto",), head: str | None = None,
        skip_per_task: int = 0, batch_invariant: bool = True, static: bool = False, compiled: bool = False,
        llama_cpp: bool = False, runs_out: str | Path | None = None, only=None) -> pd.DataFrame:
    """Every (configuration, method) on the same prompts, one row per run, with the speed over the fastest plain
    decoding of the whole run (columns baseline, speedup) and, within a configuration, over its own plain
    decoding (speedup_same_config). ``drafts``: the speculative methods, by ``load_draft`` name, a tree draft
    also as ``name@head`` (on that EAGLE head); ``head``: the EAGLE head of the other tree drafts (``tree_draft``;
    by default the recommended one); ``skip_per_task``: leave out the first prompts of each task (5: those of the
    benchmark in 03_task_acceptance, to choose settings on other prompts); ``batch_invariant``: also time the
    batch-invariant configurations, ``static`` those on the static cache and ``compiled`` those compiled
    (``configurations``; compile warm-ups are printed and recorded per method in ``warmup_seconds``); ``runs_out``:
    ``llama_cpp``: also time llama.cpp's plain decoding of the embedded target's GGUF (``LLAMA_CPP``); ``runs_out``:
    a CSV the per-run rows measured so far are written to after each configuration (times and tokens, no
    speedups: the baseline needs every configuration), so that a run cut off by a time limit keeps what it
    measured; ``only``: the configurations' labels to time, the others loaded and left out (a shorter run, whose
    baseline is the fastest of those), an unknown label refused before anything is timed."""
    from .evaluate import time_prompts, transformers_methods

    device = resolve_device(device)
    configs = configurations(name, device, batch_invariant, static, compiled)
    if only:
        unknown = sorted(set(only) - set(configs))
        if unknown:
            raise ValueError(f"--only {unknown}: no such configuration here; this run's are {sorted(configs)}")
        configs = {label: model for label, model in configs.items() if label in only}
    tokenizer = load_model(name, device, "float32")[1]
    prompts = load_prompts(tasks=TASKS, per_task=prompts_per_task, skip_per_task=skip_per_task)
    frames, native = [], native_dtypes(device)
    for t in temperatures:
        for label, model in configs.items():
            drafted = drafted_in(model, native)
            hf = {} if "batch-invariant" in label or STATIC in label or not drafted else {
                "transformers prompt lookup": transformers_methods()["transformers prompt lookup"]}
            speculative = {d: named_draft(d, model, head) for d in drafts} if drafted else {}
            sampling = SamplingParams(temperature=t)
            others = {LLAMA_CPP: llama_cpp_plain(embedded_gguf_path(), max_new_tokens, sampling, seed)} if (
                llama_cpp and label == next(iter(configs))) else {}
            runs = time_prompts(model, tokenizer, speculative, prompts, gamma=gamma,
                                max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, progress=progress,
                                transformers={"transformers generate": {}, **hf}, others=others)
            runs["configuration"] = runs["method"].map(lambda m: LLAMA_CPP_CONFIG if m == LLAMA_CPP else label)
            frames.append(runs)
            if runs_out:
                pd.concat(frames, ignore_index=True).to_csv(runs_out, index=False)
    runs = pd.concat(frames, ignore_index=True)
    runs["method"] = runs["method"].str.replace("autoregressive", "ours autoregressive") + ", " + runs["configuration"]
    runs.loc[runs["kind"] == "llama.cpp", "method"] = LLAMA_CPP
    runs = baseline.over_fastest(runs)
    for (_, config), at in runs.groupby(["temperature", "configuration"]):
        runs.loc[at.index, "speedup_same_config"] = baseline.speedup_over(at, f"ours autoregressive, {config}")
    return runs


def beside(out: str | Path, what: str) -> Path:
    """Where a file of the run's ``what`` goes when its table is written to ``out``: beside it, as
    <name>_<what>.csv (the per-run rows: ``what`` "runs")."""
    out = Path(out)
    return out.with_name(f"{out.stem}_{what}.csv")


def named_draft(name: str, model, head: str | None = None):
    """A draft by ``load_draft`` name; a tree draft (``TREE_DRAFTS``) on ``head``, or on the head after an "@"."""
    name, _, on = name.partition("@")
    if name in TREE_DRAFTS:
        return tree_draft(name, model, on or head)
    if on:
        raise ValueError(f"{name}@{on}: only tree drafts ({', '.join(TREE_DRAFTS)}) take a head after '@'")
    return load_draft(name, model)


def machine() -> str:
    """The CPU's model name, core count and native half-precision flags (or the GPU's name)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    names = cpuinfo("model name") or ["unknown CPU"]
    native = sorted({"avx512_bf16", "amx_bf16", "avx512_fp16"} & cpu_flags()) or ["no native half precision"]
    return f"{names[0]}, {len(names)} cores, {' '.join(native)}"


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (temperature, configuration, method): median ms per token, median speed over the baseline, and (greedy)
    outputs identical to plain decoding of the same configuration, of how many, and the median position where the
    others first differ. For speculative methods also tau (tokens per round, all runs pooled) and the cost model's
    speedup over plain decoding, tau / (d + v), from the run's own per-round drafting and verification costs in
    target steps, beside the measured one. The speed over the baseline is also given per task (the median over
    the task's prompts): their geometric mean and the slowest task."""
    rows = []
    for (t, config, method), g in runs.groupby(["temperature", "configuration", "method"], sort=False):
        speculative = g.kind.iloc[0] == "speculative"
        tau = g.new_tokens.sum() / g.rounds.sum() if speculative else float("nan")
        model = tau / (g.draft_cost_per_round.median() + g.v.median()) if speculative else float("nan")
        rows.append({"temperature": t, "configuration": config, "method": method.rsplit(", ", 1)[0],
                     "ms/token": 1000 * (g.seconds / g.new_tokens).median(), "speed vs baseline": g.speedup.median(),
                     **over_tasks(g),
                     "speed vs same configuration": g.speedup_same_config.median(),
                     "tau": tau, "cost model vs same configuration": model,
                     "warm-up s": g.warmup_seconds.iloc[0],
                     "greedy identical": f"{int(g.same_as_baseline.sum())}/{len(g)}" if t == 0 else "",
                     "first divergence (median)": g.first_divergence.median() if t == 0 else float("nan"),
                     "baseline": g.baseline.iloc[0]})
    return pd.DataFrame(rows)


def over_tasks(runs: pd.DataFrame) -> dict:
    """The geometric mean over tasks of the per-task median speed over the baseline, and the slowest task's."""
    per_task = runs.groupby("task").speedup.median()
    return {"geomean over tasks": geometric_mean(per_task), "slowest task": per_task.min()}


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
    parser.add_argument("--target", default=EMBEDDED_TARGET)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--prompts-per-task", type=int, default=2)
    parser.add_argument("--skip-per-task", type=int, default=0,
                        help="leave out the first prompts of each task (5: those of 03's benchmark)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--drafts", nargs="+", default=["auto"],
                        help="speculative methods, by load_draft name; a tree draft on a given head as name@head")
    parser.add_argument("--head", default=None, help="the EAGLE head of the tree drafts (default: the recommended)")
    parser.add_argument("--no-batch-invariant", action="store_true",
                        help="leave out the batch-invariant configurations (the baseline is among the others)")
    parser.add_argument("--static", action="store_true",
                        help="also time each native dtype on the static cache (ours plain and the drafts)")
    parser.add_argument("--compiled", action="store_true",
                        help="also time each native dtype and the 4-bit target on the static cache compiled (ours "
                        "plain and the drafts)")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="also time llama.cpp's plain decoding of the embedded target's GGUF (a row, not a "
                        "baseline candidate)")
    parser.add_argument("--only", nargs="+", default=None, metavar="LABEL",
                        help="time only these configurations (their labels in the table); the baseline is then the "
                        "fastest plain decoding among them")
    parser.add_argument("--out", default="", help="also write the table (with the machine) to this CSV, and the "
                        "per-run rows, as they are measured, beside it (<name>_runs.csv)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs = run(args.target, args.device, args.prompts_per_task, args.max_new_tokens, args.temperatures, args.gamma,
               drafts=args.drafts, head=args.head, skip_per_task=args.skip_per_task,
               batch_invariant=not args.no_batch_invariant, static=args.static, compiled=args.compiled,
               llama_cpp=args.llama_cpp, runs_out=beside(args.out, "runs") if args.out else None, only=args.only)
    summary, where = table(runs), machine()
    if args.out:
        summary.assign(machine=where, prompts=runs.id.nunique(), new_tokens=args.max_new_tokens).to_csv(
            args.out, index=False)
    with pd.option_context("display.width", 220, "display.max_columns", 20, "display.precision", 2):
        print(summary.to_string(index=False))
    print(where)
    if args.llama_cpp:
        print_llama_cpp_costs(args.out)
    print(f"\n{runs.id.nunique()} prompts, {args.max_new_tokens} tokens a run (EOS ignored); {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}; {time.perf_counter() - start:.0f} s")


def print_llama_cpp_costs(out: str) -> None:
    """llama.cpp's v(n) on this machine, printed, and with ``out`` written ``beside`` it."""
    costs = pd.DataFrame([{"tokens": n, "v": v} for n, v in sorted(llama_cpp_costs(embedded_gguf_path()).items())])
    print("\nllama.cpp, a forward over n tokens with their logits against one decode step: " + ", ".join(
        f"v({row.tokens}) {row.v:.2f}" for row in costs.itertuples()))
    if out:
        costs.assign(machine=machine()).to_csv(beside(out, "llama_cpp_costs"), index=False)


if __name__ == "__main__":
    main()
