"""Per-prompt measurements of draft kinds against plain decoding, and their summaries.

For each prompt, plain decoding (ours and transformers', in every native dtype) and every draft run side by side
(interleaved, same prompt, same sampling, same seed, each method warmed up first, every run exactly
``max_new_tokens`` tokens with EOS ignored), so ratios are measured under the same machine load and on equal work.
From those runs:
- acceptance rate (accepted drafts / drafted), mean accepted length (bonus included), acceptance by position;
- c = draft time per drafted token / target time per autoregressive step (both from the same runs);
- speedup = the fastest plain decoding's time per token over the method's, per prompt (``baseline``), with the
  speedup over ours plain in the run's own configuration beside it (``speedup_same_config``);
- greedy identity: whether the output equals ours plain on the same model, and where it first differs.
Summaries are medians over prompts per task, and the geometric mean of the per-task medians.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..generate import autoregressive_generate, speculative_generate
from ..tuning.devices import DTYPE_HELP
from ..names import EMBEDDED_TARGET
from ..core.models import load_model
from ..core.sampling import SamplingParams
from ..core.stats import Clock, Generation, GenerationStats
from ..tuning.batch_invariance import is_batch_invariant
from ..instruments.timing import v_at
from ..drafts.loading import load_draft
from ..paths import prompts_dir
from . import baseline
from .theory import geometric_mean
from ..show import to_markdown
from .tasks import chat_ids, first_per_task, load_prompts


def acceptance_by_position(accepted_lengths, gamma: int, proposed=None) -> np.ndarray:
    """P(draft i accepted | drafts 1..i-1 accepted) for i = 1..gamma, from per-round accepted lengths (bonus
    included) and, for drafters that may propose fewer than gamma, the per-round proposed counts.
    nan where a position was never reached."""
    n = np.asarray(accepted_lengths) - 1  # accepted drafts per round
    k = np.broadcast_to(np.asarray(gamma if proposed is None else proposed), n.shape)
    reached = np.array([((n >= i) & (k > i)).sum() for i in range(gamma)], dtype=float)
    accepted = np.array([(n >= i + 1).sum() for i in range(gamma)], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return accepted / reached


def acceptance_by_output_position(accepted_lengths, proposed, bucket: int = 32) -> dict:
    """Pooled acceptance (as ``alpha_estimate``) of the rounds starting in each bucket of output positions:
    {bucket start: alpha}. Shows whether later parts of an output are harder to predict (claim C18).
    ``proposed``: drafts per round, a number (gamma) or a per-round list (drafters may propose fewer)."""
    accepted_lengths = np.asarray(accepted_lengths)
    proposed = np.broadcast_to(np.asarray(proposed), accepted_lengths.shape)
    starts = np.concatenate([[0], np.cumsum(accepted_lengths)[:-1]])
    out = {}
    for b in np.unique(starts // bucket):
        chosen = starts // bucket == b
        out[int(b * bucket)] = alpha_estimate(accepted_lengths[chosen], proposed[chosen])
    return out


def alpha_estimate(accepted_lengths, proposed) -> float:
    """Pooled per-token acceptance: accepted drafts / drafts the verifier looked at (a round that proposed k
    and accepted n < k looked at n + 1 of them). Equals alpha when every position accepts with probability
    alpha. ``proposed``: drafts per round, a number (gamma) or a per-round list."""
    n = np.asarray(accepted_lengths) - 1
    k = np.broadcast_to(np.asarray(proposed), n.shape)
    looked = np.minimum(n + 1, k).sum()
    return float(n.sum() / looked) if looked else float("nan")


HF_PROMPT_LOOKUP_TOKENS = 10  # transformers' documented example value for prompt_lookup_num_tokens


def transformers_generate(target, x, *, max_new_tokens: int, sampling: SamplingParams, seed: int, eos,
                          **assist) -> Generation:
    """transformers' own ``generate`` (plain, or assisted with ``assistant_model=`` / ``prompt_lookup_num_tokens=``)
    on the same model, timed like ours; returned as a ``Generation`` (tokens, seconds) so it sits in the same
    table. Sampling settings are passed explicitly (top_k=0: transformers' default would be 50)."""
    torch.manual_seed(seed)
    options = dict(do_sample=False) if sampling.greedy else dict(
        do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
    from transformers.utils import logging as hf_logging

    clock = Clock(target.device)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # assisted generation warns about its own internal generation_config use
    try:
        start = clock.now()
        out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, eos_token_id=eos,
                              pad_token_id=eos if eos is not None else target.generation_config.pad_token_id,
                              repetition_penalty=sampling.repetition_penalty, **options, **assist)
        seconds = clock.now() - start
    finally:
        hf_logging.set_verbosity(verbosity)
    tokens = out[0, x.shape[1]:].cpu()
    stats = GenerationStats(new_tokens=len(tokens), total_seconds=seconds, rounds=len(tokens))
    return Generation([tokens], stats)


def transformers_methods(assistant=None) -> dict:
    """Name -> keyword arguments of transformers' generate: plain, prompt lookup, and the draft model as
    assistant (when given; transformers' own schedule for its draft length)."""
    methods = {"transformers generate": {},
               "transformers prompt lookup": {"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_TOKENS}}
    if assistant is not None:
        methods["transformers assisted (trained draft)"] = {"assistant_model": assistant}
    return methods


def plain_methods(target, plain: dict, max_new_tokens: int, sampling: SamplingParams, seed: int) -> dict:
    """{name: function(x) -> Generation} of plain decoding, ours and transformers', for each model of ``plain``
    ({label: model}, ``baseline.plain_candidates``), EOS ignored."""
    methods = {}
    for label, model in plain.items():
        methods[f"autoregressive, {label}"] = lambda x, m=model: autoregressive_generate(
            m, x, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, ignore_eos=True)
        methods[f"transformers generate, {label}"] = lambda x, m=model: transformers_generate(
            m, x, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, eos=None)
    return methods


def first_divergence(tokens: torch.Tensor, reference: torch.Tensor) -> float:
    """The first output position where ``tokens`` and ``reference`` differ; nan when they are the same."""
    n = min(len(tokens), len(reference))
    differs = torch.nonzero(tokens[:n] != reference[:n])
    if len(differs):
        return float(differs[0, 0])
    return float("nan") if len(tokens) == len(reference) else float(n)


def run_prompts(target, tokenizer, drafts: dict, prompts, *, gamma=4, max_new_tokens=128,
                sampling=SamplingParams(temperature=0), seed=0, progress=True, transformers: dict | None = None,
                plain: dict | None = None) -> pd.DataFrame:
    """One row per (prompt, method): ours plain on ``target`` ('autoregressive'), each named draft,
    transformers' methods on ``target`` (``transformers``: ``transformers_methods(...)``), and plain decoding
    of the other models in ``plain`` ({label: model}, ``baseline.plain_candidates``), all side by side.

    Equal work: every run generates exactly ``max_new_tokens`` tokens (EOS is ignored while timing) at every
    temperature, and every method is warmed up once before anything is timed. Speedups are against the fastest
    plain decoding timed here (``baseline.add_speedups``: columns baseline, speedup, speedup_same_config)."""
    runs = time_prompts(target, tokenizer, drafts, prompts, gamma=gamma, max_new_tokens=max_new_tokens,
                        sampling=sampling, seed=seed, progress=progress, transformers=transformers, plain=plain)
    return baseline.add_speedups(runs, baseline.configuration(target))


def time_prompts(target, tokenizer, drafts: dict, prompts, *, gamma=4, max_new_tokens=128,
                 sampling=SamplingParams(temperature=0), seed=0, progress=True, transformers: dict | None = None,
                 plain: dict | None = None, others: dict | None = None) -> pd.DataFrame:
    """``run_prompts``' rows before any speedup is computed (column plain marks the baseline candidates);
    ``others``: {name: function(x) -> Generation} timed beside them, not candidates (llama.cpp's decoding)."""
    from ..show import progress_bar

    runs = {"autoregressive": lambda x: autoregressive_generate(
        target, x, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, ignore_eos=True)}
    for name, draft in drafts.items():
        runs[name] = lambda x, d=draft: speculative_generate(
            target, d, x, gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, ignore_eos=True)
    for name, assist in (transformers or {}).items():
        runs[name] = lambda x, a=assist: transformers_generate(
            target, x, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, eos=None, **a)
    plain_runs = plain_methods(target, plain or {}, max_new_tokens, sampling, seed)
    runs.update(plain_runs)
    runs.update(others or {})
    candidates = set(plain_runs) | (set(baseline.OWN_PLAIN) if not is_batch_invariant(target) else set())
    warmup = warm(runs, chat_ids(tokenizer, prompts[0]["prompt"], target.device))  # one untimed call each
    rows = []
    for i, p in enumerate(progress_bar(prompts, desc="prompts", disable=not progress)):
        x = chat_ids(tokenizer, p["prompt"], target.device)
        order = list(runs) if i % 2 == 0 else list(reversed(runs))  # alternate to share drift fairly
        results = {name: runs[name](x) for name in order}
        for name, gen in results.items():
            row = run_row(p, name, gen, results["autoregressive"], plain=name in candidates,
                          speculative=name in drafts, sampling=sampling, gamma=gamma)
            rows.append({**row, "warmup_seconds": warmup[name]})
    return pd.DataFrame(rows)


def kind_of(name: str, speculative: bool) -> str:
    """'speculative' (ours), 'plain' (ours or transformers' generate, any configuration), 'llama.cpp' or
    'transformers assisted' (prompt lookup, assisted generation)."""
    if speculative:
        return "speculative"
    if name.startswith("llama.cpp"):
        return "llama.cpp"
    return "plain" if name.startswith(("autoregressive", "transformers generate")) else "transformers assisted"


def warm(runs: dict, x) -> dict:
    """Call every method once on the same prompt, so that first-call costs (a compile, above all) are not in the
    timed runs; returns each one's seconds."""
    seconds = {}
    for name, fn in runs.items():
        start = time.perf_counter()
        fn(x)
        seconds[name] = time.perf_counter() - start
    return seconds


def run_row(p: dict, name: str, gen: Generation, reference: Generation, *, plain: bool, speculative: bool,
            sampling: SamplingParams, gamma: int) -> dict:
    """The table row of one run: times and token counts; acceptance, costs and identity for speculative runs."""
    s = gen.stats
    row = {"id": p["id"], "task": p["task"], "method": name, "temperature": sampling.temperature,
           "gamma": gamma, "new_tokens": s.new_tokens, "seconds": s.total_seconds,
           "tokens_per_second": s.tokens_per_second, "rounds": s.rounds, "kind": kind_of(name, speculative),
           "plain": plain,  # a candidate for the baseline: plain decoding of a model as it loads
           "same_as_baseline": bool(torch.equal(gen.tokens, reference.tokens)),
           "first_divergence": first_divergence(gen.tokens, reference.tokens)}
    if not speculative:
        return row
    ref = reference.stats
    step = ref.target_seconds / max(ref.rounds, 1)
    depths = s.tree_depths or s.proposed_lengths  # a tree's depth plays the chain's length
    pos = acceptance_by_position(s.accepted_lengths, gamma, depths)
    row.update({"acceptance_rate": s.acceptance_rate,
                "alpha": alpha_estimate(s.accepted_lengths, depths),
                "mean_accepted_length": s.mean_accepted_length,
                "c": (s.draft_seconds / s.drafted) / step if s.drafted else float("nan"),
                "nodes_per_round": s.drafted / s.rounds,
                "draft_cost_per_round": (s.draft_seconds / s.rounds) / step,  # in target steps
                "v": (s.target_seconds / s.rounds) / step})  # verification forward, in target steps
    row.update({f"accept_pos{j + 1}": v for j, v in enumerate(pos)})
    row["accepted_lengths"] = " ".join(map(str, s.accepted_lengths))  # per round, for later analysis
    row["proposed_lengths"] = " ".join(map(str, s.proposed_lengths))
    row["tree_depths"] = " ".join(map(str, s.tree_depths))  # empty for chains
    return row


def predicted_accepted_length(accepted_lengths, depths, gamma: int) -> float:
    """The cost model's E[N] for one prompt's rounds: 1 + sum_i P(depth >= i) * prod_{j <= i} a_j, with a_j the
    measured conditional acceptance at depth j (``acceptance_by_position``) and P(depth >= i) the share of rounds
    whose proposal reached depth i (adaptive drafts vary it). For a fixed chain it is ``theory.expected_tokens``
    with per-position alphas."""
    a = np.nan_to_num(acceptance_by_position(accepted_lengths, gamma, depths))
    reach = np.array([(np.asarray(depths) >= i + 1).mean() for i in range(gamma)])
    return float(1.0 + (reach * np.cumprod(a)).sum())


def cost_model(runs: pd.DataFrame, v_by_tokens: dict) -> pd.DataFrame:
    """Per (method, task), medians over prompts: measured mean accepted length beside the cost model's E[N]
    (``predicted_accepted_length``); draft cost d and verification cost v per round (in target steps) as
    measured, and v(nodes + 1) from the separate forward timings ``v_by_tokens`` (``instruments.timing.cost_by_tokens``);
    the predicted speedup E[N] / (d + v(nodes + 1)) (``theory.tree_speedup``) beside the measured one."""
    from . import theory

    spec = runs[runs["method"].ne("autoregressive") & runs["proposed_lengths"].notna()].copy()
    rows = []
    for _, r in spec.iterrows():
        accepted, depths = _ints(r["accepted_lengths"]), round_depths(r.get("tree_depths"), r["proposed_lengths"])
        expected = predicted_accepted_length(accepted, depths, int(max(depths + [r["gamma"]])))
        v_model = v_at(v_by_tokens, r["nodes_per_round"] + 1)
        rows.append({"method": r["method"], "task": r["task"], "temperature": r["temperature"],
                     "mean accepted length": r["mean_accepted_length"], "predicted E[N]": expected,
                     "nodes per round": r["nodes_per_round"], "d (draft, steps)": r["draft_cost_per_round"],
                     "v measured": r["v"], "v(nodes+1) model": v_model,
                     "speedup": r["speedup"],
                     "predicted speedup": theory.tree_speedup(expected, r["draft_cost_per_round"], v_model)})
    table = pd.DataFrame(rows)
    return table.groupby(["method", "task", "temperature"]).median(numeric_only=True).reset_index()


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Medians per (method, task), an 'overall' row per method (median over all prompts), and the geometric
    mean over tasks of the per-task median speedup; ``baseline`` names the plain decoding the speedups are over."""
    spec = df[df["method"] != baseline.SAME_CONFIG]
    cols = [c for c in ["alpha", "acceptance_rate", "mean_accepted_length", "c", "speedup", "speedup_same_config"]
            if c in spec]
    per_task = spec.groupby(["method", "kind", "task"])[cols].median().reset_index()
    overall = spec.groupby(["method", "kind"])[cols].median().reset_index().assign(task="overall (median)")
    geo = per_task.groupby("method")["speedup"].apply(geometric_mean)
    overall["speedup_geomean_tasks"] = overall["method"].map(geo)
    return pd.concat([per_task, overall], ignore_index=True).assign(baseline=", ".join(df["baseline"].unique()))


def run_over_gammas(target, tokenizer, drafts: dict, prompts, gammas, **kwargs) -> pd.DataFrame:
    """``run_prompts`` once per gamma (same prompts, same other settings), rows stacked; column gamma says which."""
    return pd.concat([run_prompts(target, tokenizer, drafts, prompts, gamma=g, **kwargs).assign(gamma=g)
                      for g in gammas], ignore_index=True)


# Article 003's table (A100, pair unstated): acceptance and speedup per task.
ARTICLE_003 = pd.DataFrame({"task": ["code", "summarization", "dialogue", "translation"],
                            "article acceptance": [0.85, 0.75, 0.55, 0.80], "article speedup": [2.8, 2.2, 1.6, 2.5]})


def speculative_rows(runs: pd.DataFrame, temperature: float | None = None) -> pd.DataFrame:
    """The rows of ``run_prompts`` for our drafts (not plain decoding, not transformers'), at one temperature if
    given."""
    spec = ours(runs)
    return spec if temperature is None else spec[spec["temperature"] == temperature]


def article003_side_by_side(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the greedy per-task rows of ``summary`` for the article's tasks, one row per task with every method's
    alpha and speedup beside the article's). ``summary``: ``summarize`` with a temperature column."""
    greedy = summary[(summary.temperature == 0) & summary.task.isin(ARTICLE_003.task)]
    side = greedy.pivot(index="task", columns="method", values="alpha").add_prefix("alpha: ").join(
        greedy.pivot(index="task", columns="method", values="speedup").add_prefix("speedup: "))
    return greedy, side.reset_index().merge(ARTICLE_003, on="task")


def ours(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of this package's speculative methods (column kind, from ``run_prompts`` or ``summarize``)."""
    return frame[frame["kind"] == "speculative"]


def best_method(greedy: pd.DataFrame) -> str:
    """Our method with the highest median speedup over the given rows."""
    return ours(greedy).groupby("method").speedup.median().idxmax()


def recommended(methods) -> str | None:
    """The name of the recommended drafting (``load_draft("auto")``) among ``methods``, if it was measured."""
    return next((m for m in methods if "(auto)" in m), None)


SPEED_GOALS = {"greedy geometric mean over tasks": 2.0, "greedy, slowest task": 1.2,
               "greedy mean accepted length (tau)": 3.5, "temperature 1 geometric mean": 1.5}


def speed_goals(summary: pd.DataFrame, method: str) -> pd.DataFrame:
    """The speed goals for ``method`` on one run of ``summarize`` rows per temperature (column temperature, 0 and
    1), every speedup over the fastest plain decoding of the run (column baseline): ``SPEED_GOALS`` (geometric
    means over tasks of the per-task median speedup; tau is the overall median accepted length), and the greedy
    geometric mean over transformers' best assisted generation >= 1.3x."""
    def geo(t):
        return geomean_speedups(summary, temperature=t)

    greedy = summary[(summary.temperature == 0) & (summary.method == method)]
    tasks, overall = greedy[greedy.task != "overall (median)"], greedy[greedy.task == "overall (median)"]
    assisted = {m: v for m, v in geo(0).items() if m.startswith("transformers") and not m.startswith("transformers generate")}
    best_hf = max(assisted, key=assisted.get) if assisted else None
    nan = float("nan")
    measured = {"greedy geometric mean over tasks": geo(0).get(method, nan),
                "greedy, slowest task": tasks.speedup.min() if len(tasks) else nan,
                "greedy mean accepted length (tau)": overall.mean_accepted_length.iloc[0] if len(overall) else nan,
                "temperature 1 geometric mean": geo(1).get(method, nan)}
    rows = [(goal, f">= {SPEED_GOALS[goal]}", value, SPEED_GOALS[goal]) for goal, value in measured.items()]
    rows.append((f"over {best_hf} (greedy)", ">= 1.3", geo(0).get(method, nan) / assisted[best_hf] if best_hf else nan, 1.3))
    table = pd.DataFrame(rows, columns=["goal", "wanted", "measured", "threshold"])
    table["met"] = table.measured >= table.threshold
    return table.drop(columns="threshold").assign(method=method, baseline=", ".join(summary["baseline"].unique()))


# The steps of drafting's progression shown in 03, all on the recommended EAGLE head: (step, before, after,
# temperature), methods by their labels in ``drafts_for_pair``. The last two are "auto"'s two choices: greedy the
# hybrid dynamic tree, at T = 1 the head's chain.
PROGRESSION = (("the drafter: a trained draft model -> the EAGLE head (chains)", "trained draft", "EAGLE head", 0.0),
               ("chain -> tree (the head's chain with siblings)", "EAGLE head", "EAGLE tree", 0.0),
               ("tree shape: fixed -> dynamic (head only)", "EAGLE tree", "EAGLE dynamic tree", 0.0),
               ("lookup branches: none -> the context's (dynamic tree)", "EAGLE dynamic tree", "hybrid dynamic tree",
                0.0),
               ("at T=1: the hybrid dynamic tree -> the head's chain", "hybrid dynamic tree", "EAGLE head", 1.0))


def progression(summary: pd.DataFrame, model_table: pd.DataFrame) -> pd.DataFrame:
    """One row per (``PROGRESSION`` step, method): the overall median accepted length (tau), the geometric mean
    over tasks of the measured speedup (from ``summarize``) and of the cost model's predicted speedup (from
    ``cost_model``) at the step's temperature. A method not measured in this run keeps its row, with nan."""
    def predicted(model, method):
        return geometric_mean(model[model.method == method]["predicted speedup"].dropna())

    def first(values):
        return values.iloc[0] if len(values) else float("nan")

    rows = []
    for step, before, after, t in PROGRESSION:
        measured = summary[(summary.temperature == t) & (summary.task == "overall (median)")]
        model = model_table[model_table.temperature == t]
        for role, method in (("before", before), ("after", after)):
            row = measured[measured.method == method]
            rows.append({"step": step, "temperature": t, "role": role, "method": method,
                         "tau": first(row.mean_accepted_length),
                         "speedup (geomean over tasks)": first(row.speedup_geomean_tasks),
                         "cost model (geomean over tasks)": predicted(model, method)})
    return pd.DataFrame(rows)


def method_by_task(greedy: pd.DataFrame, method: str, column: str) -> pd.Series:
    """One method's ``column`` per task, in the article's task order (nan for a task not measured)."""
    return greedy[greedy.method == method].set_index("task")[column].reindex(ARTICLE_003.task)


def geomean_speedups(summary: pd.DataFrame, temperature: float = 0.0) -> dict:
    """{method: geometric mean over tasks of the per-task median speedup} at one temperature."""
    overall = summary[(summary.temperature == temperature) & (summary.task == "overall (median)")]
    return overall.set_index("method").speedup_geomean_tasks.to_dict()


def acceptance_by_position_table(spec_runs: pd.DataFrame, gamma: int) -> pd.DataFrame:
    """Mean P(draft i accepted | drafts before it accepted) per method and temperature, one row per position."""
    cols = [f"accept_pos{i}" for i in range(1, gamma + 1)]
    by_pos = spec_runs.groupby(["method", "temperature"])[cols].mean().reset_index().melt(
        id_vars=["method", "temperature"], var_name="position", value_name="acceptance")
    by_pos["position"] = by_pos.position.str.replace("accept_pos", "").astype(int)
    return by_pos


def _ints(text) -> list:
    return [int(x) for x in str(text).split()]


def round_depths(tree_depths, proposed_lengths) -> list:
    """Per-round proposal depths from a ``run_prompts`` row's columns: the tree depths for tree drafts, else the
    proposed lengths (a chain's depth is its length)."""
    return _ints(tree_depths) if isinstance(tree_depths, str) and tree_depths.strip() else _ints(proposed_lengths)


def acceptance_along_output(spec_runs: pd.DataFrame, bucket: int = 32) -> pd.DataFrame:
    """``acceptance_by_output_position`` of every run (its per-round accepted and proposed lengths, as
    ``run_prompts`` stores them): one row per (run, bucket) with method, temperature, output position, alpha."""
    rows = []
    for r in spec_runs.itertuples():
        depths = round_depths(getattr(r, "tree_depths", None), r.proposed_lengths)
        along = acceptance_by_output_position(_ints(r.accepted_lengths), depths, bucket=bucket)
        rows.extend({"method": r.method, "temperature": r.temperature, "output position": start, "alpha": a}
                    for start, a in along.items())
    return pd.DataFrame(rows, columns=["method", "temperature", "output position", "alpha"])


def output_drops(along: pd.DataFrame) -> dict:
    """{method: mean alpha in its first output bucket - mean alpha in its last} (means over runs), for the
    methods measured in more than one bucket."""
    trend = along.groupby(["method", "output position"]).alpha.mean().unstack(0)
    return {m: trend[m].dropna().iloc[0] - trend[m].dropna().iloc[-1] for m in trend if trend[m].notna().sum() > 1}


def speedup_by_length(target, tokenizer, name: str, draft, prompts, lengths, gamma: int = 4,
                      plain: dict | None = None) -> pd.DataFrame:
    """Median speedup of one draft over the fastest plain decoding (greedy, same prompts; ``plain`` as in
    ``run_prompts``) for each max_new_tokens."""
    rows = []
    for n in lengths:
        r = run_prompts(target, tokenizer, {name: draft}, prompts, gamma=gamma, max_new_tokens=n, progress=False,
                        plain=plain)
        rows.append({"max_new_tokens": n, "speedup": speculative_rows(r).speedup.median(),
                     "baseline": r.baseline.iloc[0]})
    return pd.DataFrame(rows)


def greedy_agreement(runs: pd.DataFrame) -> pd.DataFrame:
    """Per method (greedy rows of ``run_prompts``): the share of runs whose output is token for token ours plain
    on the same model, and the median first position where the others part from it."""
    greedy = runs[(runs.temperature == 0) & (runs.method != baseline.SAME_CONFIG) & (runs.kind != "plain")]
    return greedy.groupby("method").agg(runs=("same_as_baseline", "size"), identical=("same_as_baseline", "mean"),
                                        median_first_divergence=("first_divergence", "median")).reset_index()


DEFAULT_DRAFTS = ("auto", "smollm2-135m-draft", "smollm2-135m-eagle-deep-ttt", "smollm2-135m-medusa", "n-gram",
                  "layer-skip")


def main(argv=None):
    """python -m specdec_lite.repro.evaluate: every draft kind against the baseline on the evaluation prompts."""

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--target", default=EMBEDDED_TARGET)
    parser.add_argument("--drafts", nargs="+", default=list(DEFAULT_DRAFTS),
                        help="draft names, ids or folders (models, heads), n-gram / layer-skip, or the drafts on "
                             "the EAGLE head auto / hybrid-dynamic / dynamic-tree / eagle-tree")
    parser.add_argument("--prompts", default=str(prompts_dir()))
    parser.add_argument("--prompts-per-task", type=int, default=5)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--transformers", action="store_true",
                        help="also time transformers' generate, prompt lookup and (--assistant) assisted generation")
    parser.add_argument("--assistant", default="", help="draft model for transformers' assisted generation")
    parser.add_argument("--out", default="out/draft_kinds.csv", help="a one-off run's table (default out/, ignored)")
    args = parser.parse_args(argv)
    target, tokenizer = load_model(args.target, args.device, args.dtype)
    drafts = {name: load_draft(name, target) for name in args.drafts}  # refusals come before any run
    hf = None
    if args.transformers:
        hf = transformers_methods(load_draft(args.assistant, target) if args.assistant else None)
    prompts = first_per_task(load_prompts(args.prompts), args.prompts_per_task)
    frames = [run_prompts(target, tokenizer, drafts, prompts, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                          sampling=SamplingParams(temperature=t), transformers=hf) for t in args.temperatures]
    runs = pd.concat(frames, ignore_index=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.out, index=False)
    for t in args.temperatures:
        print(f"\n### temperature {t}\n")
        print(to_markdown(summarize(runs[runs.temperature == t])))


if __name__ == "__main__":
    main()
