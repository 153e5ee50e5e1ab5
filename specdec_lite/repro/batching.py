"""Throughput against batch size: plain batched decoding against speculative decoding, per drafting (claim C15).

At batch 1 a decode step reads every weight to produce one token per row, and the verification forward over
gamma + 1 tokens costs about as much (memory-bound); as the batch grows, each step does more arithmetic per weight
read, the verification forward's extra tokens stop being free (compute-bound, ``costs.by_batch`` measures v(gamma)
by batch) and the speculative gain shrinks or reverses. ``batch_throughput`` measures that directly: for each batch
size, the tokens per second over the whole batch of

- plain batched decoding, ours (``autoregressive_generate``) and transformers' ``generate`` (left padding,
  ``attention_mask``, greedy), on the run's own model and on each other plain configuration given
  (``baseline.plain_candidates``: the same weights in float32 and each half precision the device runs), each row
  named "<method>, <configuration>"; the fastest of them at that batch size is the baseline there (column
  ``baseline``): the baseline rule, applied per batch size;
- speculative decoding with each drafting given (greedy), its speedup over that baseline and its mean accepted
  length tau.

Every row of a batch generates exactly ``max_new_tokens`` tokens (EOS ignored: ``ignore_eos=True`` for ours,
``min_new_tokens`` for ``generate``), so throughput is B x max_new_tokens / seconds. The prompts, chat-formatted
as ``tasks.chat_ids`` does, are cycled to fill the batch (row i is prompt i mod their number) and left-padded
together. Every method is warmed up once per batch size (a short run) before it is timed. A drafting that cannot
run a batch (``speculative_generate`` refuses it with NotImplementedError: token trees, a static cache, a head
that reads the target's hidden states where it drafts for one prompt at a time) keeps a row with the refusal in
column ``skipped``.
"""
from __future__ import annotations

import statistics

import pandas as pd
import torch

from ..generate import autoregressive_generate, speculative_generate
from ..tokenizers import padded
from ..core.stats import Clock
from ..core.sampling import SamplingParams
from . import baseline
from .tasks import chat_ids

PLAIN_METHODS = (baseline.SAME_CONFIG, "transformers generate")  # plain batched decoding: ours, transformers'
GREEDY = SamplingParams(temperature=0)
WARM_UP_TOKENS = 8  # new tokens of the untimed run before each method is timed at a batch size
COLUMNS = ["batch", "method", "kind", "new_tokens", "seconds", "tokens_per_second", "baseline", "speedup",
           "mean_accepted_length", "acceptance_rate", "prompt_width", "skipped"]


def batch_drafts(target, draft_model=None) -> tuple[dict, dict]:
    """(drafts, skipped) for ``batch_throughput``: the draft model (when given, "trained draft"), n-gram prompt
    lookup ("n-gram") and the chain of the recommended EAGLE head trained for ``target`` ("EAGLE head",
    ``loading.recommended_eagle``; labels as ``drafts_for_pair`` gives them), and {kind: why} of what is left out.
    Token trees are left out: they draft for one prompt at a time."""
    from ..drafts import loading
    from ..drafts.heads import read_head_config
    from ..drafts.ngram import NGramDraft
    from ..paths import drafts_dir

    drafts, skipped = {}, {}
    if draft_model is not None:
        drafts["trained draft"] = draft_model
    drafts["n-gram"] = NGramDraft()
    configs = {name: read_head_config(drafts_dir() / name) for name in loading.heads_for(target)}
    eagles = [name for name, config in configs.items() if config.kind == "eagle" and not config.feature_layers]
    if eagles:
        drafts["EAGLE head"] = loading.load_draft(loading.recommended_eagle(eagles), target)
    else:
        skipped["EAGLE head"] = "no EAGLE head under the drafts folder was trained for this target"
    return drafts, skipped


def check_batch_sizes(batch_sizes) -> list[int]:
    """The batch sizes as a sorted list of distinct positive ints; refuses anything else, before any work."""
    if isinstance(batch_sizes, (int, str)) or not hasattr(batch_sizes, "__iter__"):
        raise TypeError(f"batch_sizes must be a list of positive integers, e.g. [1, 2, 4], got {batch_sizes!r}")
    sizes = list(batch_sizes)
    bad = [b for b in sizes if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if not sizes or bad:
        raise ValueError(f"batch_sizes must be a non-empty list of positive integers, e.g. [1, 2, 4]; got {sizes!r}"
                         + (f" (not positive integers: {bad})" if bad else ""))
    return sorted(set(sizes))


def check_request(drafts, plain, prompts, max_new_tokens, gamma, repeats) -> None:
    """Refuse, before any work, what ``batch_throughput`` cannot run."""
    for name, value in (("drafts", drafts), ("plain", plain)):
        if not isinstance(value, dict):
            raise TypeError(f"{name} must be a dict {{label: {name[:-1]}}}, got {type(value).__name__}")
    clash = [name for name in drafts if str(name).split(",")[0] in PLAIN_METHODS]
    if clash:
        raise ValueError(f"draft labels {clash} start with the names of the plain decodings {list(PLAIN_METHODS)}: "
                         "rename them")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt (tasks.load_prompts)")
    for name, value in (("max_new_tokens", max_new_tokens), ("gamma", gamma), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def round_robin(prompts: list[dict]) -> list[dict]:
    """The prompts reordered one task at a time (the first of each task, then the second of each, ...), so that the
    rows of a small batch, cycled from the start, mix the tasks."""
    grouped = {}
    for p in prompts:
        grouped.setdefault(p["task"], []).append(p)
    columns = list(grouped.values())
    return [column[i] for i in range(max(map(len, columns), default=0)) for column in columns if i < len(column)]


def pad_id_of(tokenizer, target) -> int:
    """The id left pads take: the tokenizer's pad token, else its EOS, else the target's configured pad, else 0
    (masked out either way)."""
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None),
                  getattr(getattr(target, "generation_config", None), "pad_token_id", None)):
        if isinstance(value, int):
            return value
    return 0


def left_padded_batch(tokenizer, prompts: list[dict], batch_size: int, device, pad_id: int = 0):
    """(input_ids, attention_mask), both (batch_size, T) on ``device``: row i is ``prompts[i % len(prompts)]``
    chat-formatted (``tasks.chat_ids``), padded on the left with ``pad_id`` to the longest row, as a tokenizer with
    ``padding_side="left"`` pads."""
    rows = [chat_ids(tokenizer, prompts[i % len(prompts)]["prompt"])[0] for i in range(batch_size)]
    ids, mask = padded(rows, pad_id, left=True)
    return ids.to(device), mask.to(device)


def generate_batch(target, ids, mask, max_new_tokens: int, pad_id: int) -> int:
    """transformers' ``generate`` on a left-padded batch, greedy, every row exactly ``max_new_tokens`` long (EOS
    suppressed by ``min_new_tokens``); returns the new tokens over the batch."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a sampling setting in the model's generation config warns under do_sample=False
    try:
        out = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                              do_sample=False, pad_token_id=pad_id)
    finally:
        hf_logging.set_verbosity(verbosity)
    return int(out.shape[0] * (out.shape[1] - ids.shape[1]))


def plain_methods(target, plain: dict, pad_id: int) -> dict:
    """{name: function(ids, mask, max_new_tokens) -> (new tokens, None)}: plain batched decoding, greedy, EOS
    ignored, by ours and by transformers' ``generate``, on ``target`` and on each model of ``plain`` ({label: model},
    ``baseline.plain_candidates``), each named "<method>, <configuration>" (``PLAIN_METHODS``, ``baseline.configuration``
    for ``target``, the label for the others)."""
    def ours(model):
        def run(ids, mask, n):
            gen = autoregressive_generate(model, ids, attention_mask=mask, max_new_tokens=n, sampling=GREEDY,
                                          ignore_eos=True, timed=False)
            return gen.stats.new_tokens, None
        return run

    def transformers(model):
        return lambda ids, mask, n: (generate_batch(model, ids, mask, n, pad_id), None)

    models = {baseline.configuration(target): target, **plain}
    return {f"{method}, {label}": run(model) for label, model in models.items()
            for method, run in zip(PLAIN_METHODS, (ours, transformers))}


def speculative_methods(target, drafts: dict, gamma: int) -> dict:
    """{label: function(ids, mask, max_new_tokens) -> (new tokens, stats)}: speculative decoding with each drafting
    of ``drafts``, greedy, EOS ignored."""
    def speculative(draft):
        def run(ids, mask, n):
            gen = speculative_generate(target, draft, ids, attention_mask=mask, gamma=gamma, max_new_tokens=n,
                                       sampling=GREEDY, ignore_eos=True, timed=False)
            return gen.stats.new_tokens, gen.stats
        return run

    return {name: speculative(draft) for name, draft in drafts.items()}


def batch_throughput(target, tokenizer, drafts: dict, prompts, batch_sizes, max_new_tokens: int = 128,
                     gamma: int = 4, repeats: int = 1, plain: dict | None = None,
                     progress: bool = False) -> pd.DataFrame:
    """One row per (batch size, method): ``COLUMNS``. Plain batched decoding by ours and transformers' ``generate``
    on ``target`` and on each model of ``plain`` ({label: model}, ``baseline.plain_candidates(target)``; kind
    "plain", named as ``plain_methods`` names them), then each drafting of ``drafts`` ({label: draft}, anything
    ``speculative_generate`` takes; kind "speculative", on ``target``), greedy, every row of the batch
    ``max_new_tokens`` long.

    tokens_per_second: new tokens over the whole batch / seconds (the median over ``repeats`` timed runs, the
    methods' order alternating between repeats); baseline: the fastest plain decoding at that batch size; speedup:
    tokens_per_second over the baseline's; mean_accepted_length (tau, the bonus token included) and
    acceptance_rate from the run's ``Generation.stats``. ``prompts``: dicts with a "prompt" (``tasks.load_prompts``,
    say 4 per task, ``round_robin`` to mix the tasks in small batches), cycled to fill each batch and left-padded
    together (prompt_width: the padded length). A method that refuses a batch (NotImplementedError) gets a row with
    its message in ``skipped`` and nan elsewhere. Bad batch sizes and arguments are refused before any work."""
    from ..show import progress_bar

    sizes = check_batch_sizes(batch_sizes)
    plain = {} if plain is None else plain
    check_request(drafts, plain, prompts, max_new_tokens, gamma, repeats)
    pad_id = pad_id_of(tokenizer, target)
    plains = plain_methods(target, plain, pad_id)
    methods = {**plains, **speculative_methods(target, drafts, gamma)}
    clock = Clock(target.device)
    rows = []
    for batch in progress_bar(sizes, desc="batch sizes", disable=not progress):
        ids, mask = left_padded_batch(tokenizer, prompts, batch, target.device, pad_id)
        runnable, measured, refused = {}, [], []
        for name, fn in methods.items():  # the warm-up runs find the refusals
            try:
                fn(ids, mask, min(WARM_UP_TOKENS, max_new_tokens))
            except NotImplementedError as err:
                refused.append(skipped_row(batch, name, name in plains, str(err), ids.shape[1]))
            else:
                runnable[name] = fn
        times = {name: [] for name in runnable}
        results = {}
        for r in range(repeats):
            order = list(runnable) if r % 2 == 0 else list(reversed(runnable))  # share drift fairly
            for name in order:
                start = clock.now()
                tokens, stats = runnable[name](ids, mask, max_new_tokens)
                times[name].append(clock.total(start))
                results[name] = (tokens, stats)
        for name in runnable:
            tokens, stats = results[name]
            seconds = statistics.median(times[name])
            measured.append({"batch": batch, "method": name, "kind": "plain" if name in plains else "speculative",
                             "new_tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
                             "mean_accepted_length": stats.mean_accepted_length if stats else float("nan"),
                             "acceptance_rate": stats.acceptance_rate if stats else float("nan"),
                             "prompt_width": ids.shape[1], "skipped": ""})
        measured = with_speedups(measured)
        fastest = measured[0]["baseline"] if measured else ""  # the skipped rows name it too
        rows.extend(measured + [dict(row, baseline=fastest) for row in refused])
    table = pd.DataFrame(rows, columns=COLUMNS)
    order = {name: i for i, name in enumerate(methods)}
    return table.sort_values(["batch", "method"], key=lambda c: c.map(order) if c.name == "method" else c,
                             kind="stable").reset_index(drop=True)


def skipped_row(batch: int, method: str, is_plain: bool, reason: str, width: int) -> dict:
    nan = float("nan")
    return {"batch": batch, "method": method, "kind": "plain" if is_plain else "speculative",
            "new_tokens": nan, "seconds": nan, "tokens_per_second": nan, "baseline": "", "speedup": nan,
            "mean_accepted_length": nan, "acceptance_rate": nan, "prompt_width": width, "skipped": reason}


def with_speedups(measured: list[dict]) -> list[dict]:
    """The rows of one batch size with their baseline (the fastest plain decoding) and speedup over it (nan where
    no plain decoding ran)."""
    plain = [row for row in measured if row["kind"] == "plain"]
    fastest = max(plain, key=lambda row: row["tokens_per_second"]) if plain else None
    for row in measured:
        row["baseline"] = fastest["method"] if fastest else ""
        row["speedup"] = row["tokens_per_second"] / fastest["tokens_per_second"] if fastest else float("nan")
    return measured


def draftings(table: pd.DataFrame) -> list[str]:
    """The speculative methods of a ``batch_throughput`` table measured at some batch size, in its order."""
    spec = table[(table["kind"] == "speculative") & table["speedup"].notna()]
    return list(dict.fromkeys(spec["method"]))


def speedups_by_batch(table: pd.DataFrame, method: str) -> pd.Series:
    """``method``'s speedup by batch size (the batch sizes where it ran), smallest first."""
    rows = table[(table["method"] == method) & table["speedup"].notna()]
    return rows.set_index("batch")["speedup"].sort_index()


def stop_paying(table: pd.DataFrame) -> dict:
    """{drafting: the smallest batch size from which its speedup is below 1 at every larger batch size measured,
    or None if it pays at the largest}, for each drafting of a ``batch_throughput`` table that ran somewhere."""
    out = {}
    for method in draftings(table):
        speedups = speedups_by_batch(table, method)
        below = speedups.lt(1.0)
        if not below.iloc[-1]:
            out[method] = None
            continue
        start = speedups.index[-1]
        for batch in reversed(speedups.index):  # back from the largest while it stays below 1
            if not below[batch]:
                break
            start = batch
        out[method] = int(start)
    return out


def by_batch(table: pd.DataFrame, v_by_batch: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per batch size: the baseline and its tokens/s, each drafting's speedup (column "speedup: <name>";
    nan where it was skipped), and, from ``v_by_batch`` (``costs.by_batch``: columns batch and v(gamma)), the
    verification cost at that batch size beside them (nan where it was not measured)."""
    plain = table[(table["kind"] == "plain") & (table["method"] == table["baseline"])]
    out = plain.set_index("batch")[["baseline", "tokens_per_second"]].rename(
        columns={"tokens_per_second": "baseline tokens/s"})
    out = out.reindex(sorted(table["batch"].unique()))
    out.index.name = "batch"
    for method in draftings(table):
        out[f"speedup: {method}"] = speedups_by_batch(table, method)
    if v_by_batch is not None:
        column = v_by_batch.columns[1]
        out[column] = v_by_batch.set_index("batch")[column]
    return out.reset_index()
