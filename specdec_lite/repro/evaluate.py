"""Per-prompt measurements of draft kinds against the autoregressive baseline, and their summaries.

For each prompt, the baseline and every draft run side by side (interleaved, same prompt, same sampling, same
seed), so ratios are measured under the same machine load. From those runs:
- acceptance rate (accepted drafts / drafted), mean accepted length (bonus included), acceptance by position;
- c = draft time per drafted token / target time per autoregressive step (both from the same runs);
- speedup = tokens/s of speculative decoding / tokens/s of the baseline, per prompt.
Summaries are medians over prompts per task, and the geometric mean of the per-task medians.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..core.decode import autoregressive_generate, speculative_generate
from ..core.models import EMBEDDED_TARGET, load_model
from ..core.sampling import SamplingParams
from ..drafts.loading import load_draft
from ..paths import prompts_dir
from .report import to_markdown
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


def run_prompts(target, tokenizer, drafts: dict, prompts, *, gamma=4, max_new_tokens=128,
                sampling=SamplingParams(temperature=0), seed=0, progress=True) -> pd.DataFrame:
    """One row per (prompt, method): the baseline ('autoregressive') and each named draft."""
    from tqdm.auto import tqdm

    rows = []
    eos = tokenizer.eos_token_id
    for i, p in enumerate(tqdm(prompts, desc="prompts", disable=not progress)):
        x = chat_ids(tokenizer, p["prompt"], target.device)
        runs = {"autoregressive": lambda: autoregressive_generate(
            target, x, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, eos_token_id=eos)}
        for name, draft in drafts.items():
            runs[name] = (lambda d: lambda: speculative_generate(
                target, d, x, gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                eos_token_id=eos))(draft)
        order = list(runs) if i % 2 == 0 else list(reversed(runs))  # alternate to share drift fairly
        results = {name: runs[name]() for name in order}
        base = results["autoregressive"].stats
        step = base.target_seconds / max(base.rounds, 1)
        for name, gen in results.items():
            s = gen.stats
            row = {"id": p["id"], "task": p["task"], "method": name, "temperature": sampling.temperature,
                   "gamma": gamma, "new_tokens": s.new_tokens, "seconds": s.total_seconds,
                   "tokens_per_second": s.tokens_per_second, "rounds": s.rounds}
            if name != "autoregressive":
                pos = acceptance_by_position(s.accepted_lengths, gamma, s.proposed_lengths)
                row.update({"acceptance_rate": s.acceptance_rate,
                            "alpha": alpha_estimate(s.accepted_lengths, s.proposed_lengths),
                            "mean_accepted_length": s.mean_accepted_length,
                            "c": (s.draft_seconds / s.drafted) / step if s.drafted else float("nan"),
                            "speedup": s.tokens_per_second / base.tokens_per_second,
                            "same_as_baseline": bool(torch.equal(gen.tokens, results["autoregressive"].tokens))})
                row.update({f"accept_pos{j + 1}": v for j, v in enumerate(pos)})
                row["accepted_lengths"] = " ".join(map(str, s.accepted_lengths))  # per round, for later analysis
                row["proposed_lengths"] = " ".join(map(str, s.proposed_lengths))
            rows.append(row)
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Medians per (method, task), an 'overall' row per method (median over all prompts), and the geometric
    mean over tasks of the per-task median speedup."""
    spec = df[df["method"] != "autoregressive"]
    cols = ["alpha", "acceptance_rate", "mean_accepted_length", "c", "speedup"]
    per_task = spec.groupby(["method", "task"])[cols].median().reset_index()
    overall = spec.groupby("method")[cols].median().reset_index().assign(task="overall (median)")
    geo = per_task.groupby("method")["speedup"].apply(lambda s: math.exp(np.log(s).mean()))
    overall["speedup_geomean_tasks"] = overall["method"].map(geo)
    return pd.concat([per_task, overall], ignore_index=True)


DEFAULT_DRAFTS = ("smollm2-135m-draft", "smollm2-135m-eagle", "smollm2-135m-medusa", "n-gram", "layer-skip")


def main(argv=None):
    """python -m specdec_lite.repro.evaluate: every draft kind against the baseline on the evaluation prompts."""

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--target", default=EMBEDDED_TARGET)
    parser.add_argument("--drafts", nargs="+", default=list(DEFAULT_DRAFTS),
                        help="draft names, ids or folders (models, heads), or n-gram / layer-skip")
    parser.add_argument("--prompts", default=str(prompts_dir()))
    parser.add_argument("--prompts-per-task", type=int, default=5)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="data/results/draft_kinds.csv")
    args = parser.parse_args(argv)
    target, tokenizer = load_model(args.target, args.device)
    drafts = {name: load_draft(name, target) for name in args.drafts}  # refusals come before any run
    prompts = first_per_task(load_prompts(args.prompts), args.prompts_per_task)
    frames = [run_prompts(target, tokenizer, drafts, prompts, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                          sampling=SamplingParams(temperature=t)) for t in args.temperatures]
    runs = pd.concat(frames, ignore_index=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.out, index=False)
    for t in args.temperatures:
        print(f"\n### temperature {t}\n")
        print(to_markdown(summarize(runs[runs.temperature == t])))


if __name__ == "__main__":
    main()
