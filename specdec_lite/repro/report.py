"""Tables for people, and the results document.

``to_markdown`` renders a result frame as a GitHub table. ``write_results(results_dir, out_path)`` writes
docs/RESULTS.md from the CSVs the notebooks leave in ``data/results/``: where it was measured, one verdict per
claim (C1..C22, see docs/CLAIMS.md), each notebook's checks, the per-task tables, a short analysis computed from
those tables, the speed and cost-model tables (the cost model as one row per method), any other CSV found there
(a short one as a table, a long one as a link), and the figures. The document stays within ``MAX_LINES`` lines:
the CSVs hold every row. Every number in the document comes from a CSV (or, for the "where measured" table,
from the installed versions read when it is generated); a CSV that is missing gives an explicit "not measured
yet" line instead of its section.

    python -m specdec_lite.repro.report [--results data/results] [--out docs/RESULTS.md]
"""
from __future__ import annotations

import argparse
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import paths
from ..tuning.devices import cpuinfo
from ..show import to_markdown
from . import claims as claims_mod
from . import theory
from .tasks import TASKS
from .theory import geometric_mean

RESULTS_DOC = Path("docs") / "RESULTS.md"  # relative to the repository root
NOT_MEASURED = "not measured yet"
VERDICT_NOT_MEASURED = "not measured yet"
SUMMARY_CSV, RUNS_CSV, CLAIMS_CSV = "task_acceptance_summary.csv", "task_acceptance_runs.csv", "claims.csv"
# written by 03_task_acceptance
GOALS_CSV, COST_MODEL_CSV, PROGRESSION_CSV = "speed_goals.csv", "cost_model.csv", "drafting_progression.csv"
ENDPOINT_RUNS_CSV = "endpoints_runs.csv"  # written by 05_endpoints: every request with its text (its table is shown)
OVERALL = "overall (median)"
MAX_LINES = 400  # the whole document; a test holds the shipped one to it
MAX_TABLE_ROWS = 16  # an other CSV with more rows (in its first part, where it has a "part" column) is linked
BENCH_PREFIX = "bench"  # repro.bench's tables, quoted with their machine in README.md and docs/SPEED.md: linked


@dataclass(frozen=True)
class Figure:
    file: str  # under figures/
    notebook: str  # the notebook that draws it
    shows: str
    dtype: str  # the arithmetic behind it


REAL_MODELS = "real models"  # a figure of real-model measurements: its dtype is the one the results record
FIGURES = [
    Figure("unbiasedness_pvalues.png", "01_unbiasedness", "chi-square p-value of the loop's output against the exact "
           "target law, for the correct verifier and the broken ones, and the deviation against sample size",
           "float64 (toy Markov models)"),
    Figure("speedup_heatmap.png", "02_speedup_table", "expected speedup over alpha and gamma",
           "float64 (the formula)"),
    Figure("break_even.png", "02_speedup_table", "break-even alpha against the draft's cost c",
           "float64 (the formula)"),
    Figure("predicted_vs_measured_speedup.png", "02_speedup_table", "speedup predicted from measured alpha, c and "
           "v(gamma) against the measured one, on the embedded pair", REAL_MODELS),
    Figure("batch_throughput.png", "02_speedup_table", "throughput against batch size: the fastest plain batched "
           "decoding against speculative decoding per drafting, their speedup and v(gamma) by batch size",
           REAL_MODELS),
    Figure("task_acceptance.png", "03_task_acceptance", "acceptance and speedup per task and per draft kind",
           REAL_MODELS),
    Figure("acceptance_by_position.png", "03_task_acceptance", "acceptance by draft position and along the output",
           REAL_MODELS),
    Figure("cost_model.png", "03_task_acceptance", "the cost model's predicted speedup (E[N] from acceptance per "
           "depth, draft cost, v(nodes)) against the measured one, per drafting method and task", REAL_MODELS),
    Figure("drafting_progression.png", "03_task_acceptance", "drafting's progression: the first head against the "
           "EAGLE-3-style one, fixed against dynamic trees, chosen against drawn drafts at T=1; measured speedup "
           "beside the cost model's", REAL_MODELS),
    Figure("endpoints.png", "05_endpoints", "OpenAI-compatible servers, plain and speculative: end-to-end latency, "
           "speedup over the plain server of each kind and acceptance from the servers' counters, per task",
           REAL_MODELS),
    Figure("endpoints_length_concurrency.png", "05_endpoints", "the servers' median speedup by max_tokens and by "
           "concurrency", REAL_MODELS),
    Figure("draft_training_loss.png", "00_train_draft", "the standalone draft's training curve",
           "float32 training (weights shipped in float16)"),
    Figure("heads_training.png", "00_train_heads", "the EAGLE-style head's and the Medusa heads' training curves",
           "float32 training (weights shipped in float16)"),
]


def environment() -> dict:
    """The machine and the installed versions, read now."""
    import torch
    import transformers

    cpu = (cpuinfo("model name") or [platform.processor() or platform.machine()])[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def _read(results_dir: Path, name: str) -> pd.DataFrame | None:
    path = Path(results_dir) / name
    return pd.read_csv(path, keep_default_na=False, na_values=[""]) if path.exists() else None


def _missing(name: str, notebook: str) -> str:
    return f"*{NOT_MEASURED}: `{name}` is not in the results folder; run `notebooks/{notebook}.ipynb`.*"


def _f(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


# ---- sections -------------------------------------------------------------------------------------------------

def where_measured(results_dir: Path, env: dict | None = None) -> str:
    env = env or environment()
    measured = any(Path(results_dir).glob("*.csv"))
    status = "measured" if measured else NOT_MEASURED
    table = pd.DataFrame([
        {"where": f"CPU: {env['cpu']}, {env['cores']} cores (this machine)",
         "versions": f"torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}",
         "dtype": f"{recorded_dtypes(results_dir)} (real models); float64 (toy models, formulas)",
         "what": "notebooks 01-04 (the CSVs below), unit tests", "status": status},
        {"where": "NVIDIA GPU", "versions": "", "dtype": "",
         "what": "`make gpu-check`; the notebooks with `-p device cuda` and a larger pair", "status": "not run yet"},
    ])
    return "\n".join([
        "## Where measured", "",
        "The versions are those installed when this document was generated; `make reproduce` runs notebook 04 "
        "last, in the environment that ran 01-03.", "",
        to_markdown(table)])


CONTEXT = ["target", "draft", "dtype"]  # what every CSV row of a notebook run records


def recorded_dtypes(results_dir: Path) -> str:
    """The dtypes the CSVs in ``results_dir`` record (their 'dtype' column), e.g. 'float32'; 'unrecorded' if none."""
    found = set()
    for path in Path(results_dir).glob("*.csv"):
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        found |= set(frame["dtype"]) if "dtype" in frame else set()
    return ", ".join(sorted(found - {""})) or "unrecorded"


def _claims_table(results_dir: Path) -> pd.DataFrame | None:
    table = _read(results_dir, CLAIMS_CSV)
    if table is None:
        return None
    return table.astype(str).replace("nan", "")


def claims_overview(results_dir: Path) -> str:
    """One verdict per claim, from claims.csv; every id C1..C22 appears, measured or not."""
    lines = ["## Claims: one verdict each", ""]
    table = _claims_table(results_dir)
    if table is None:
        lines += [_missing(CLAIMS_CSV, "04_claims"), ""]
        table = pd.DataFrame(columns=["claim", "source", "expected", "verdict", "reason"])
    else:
        counts = table.verdict.value_counts()
        lines += ["Verdicts: " + ", ".join(f"{v} {counts.get(v, 0)}" for v in claims_mod.VERDICTS) + ". A claim "
                  "checked in several places reproduces only if every check does; the checks are listed by "
                  "notebook in the next section, the claims themselves in [CLAIMS.md](CLAIMS.md).", ""]
    rows = []
    for cid in claims_mod.ALL_CLAIMS:
        found = table[table.claim == cid]
        info = claims_mod.CLAIMS[cid]
        if found.empty:
            rows.append({"claim": cid, "articles": info.articles, "the article's figure": "",
                         "verdict": f"**{VERDICT_NOT_MEASURED}**", "checked in": info.notebook})
        else:
            r = found.iloc[0]
            rows.append({"claim": cid, "articles": info.articles, "the article's figure": r.expected,
                         "verdict": f"**{r.verdict}**", "checked in": info.notebook})
    lines.append(to_markdown(pd.DataFrame(rows)))
    return "\n".join(lines)


def claims_by_notebook(results_dir: Path) -> str:
    """Each notebook's own claim rows (claims_<notebook>.csv): the article's figure, ours, verdict, why."""
    lines = ["## Claims: each check, by notebook", ""]
    files = sorted(Path(results_dir).glob("claims_*.csv"))
    if not files:
        return "\n".join(lines + [f"*{NOT_MEASURED}: no `claims_<notebook>.csv` in the results folder; run "
                                  "notebooks 01-03.*"])
    for path in files:
        rows = pd.read_csv(path, dtype=str, keep_default_na=False)
        notebook = path.stem.removeprefix("claims_")
        context = rows[[c for c in CONTEXT if c in rows]].drop_duplicates()
        rows = rows.drop(columns=list(context)).assign(verdict=[f"**{v}**" for v in rows.verdict])
        run = "; ".join(", ".join(f"{k} `{v}`" for k, v in r.items()) for r in context.to_dict("records"))
        rows = rows.rename(columns={"source": "articles", "expected": "the article's figure",
                                    "measured": "measured here", "reason": "why"})
        lines += [f"### `{notebook}`", ""] + ([f"Measured with {run}.", ""] if run else []) + [to_markdown(rows), ""]
    return "\n".join(lines).rstrip()


def _ordered_tasks(tasks) -> list:
    tasks = list(dict.fromkeys(tasks))
    known = [t for t in TASKS if t in tasks]
    return known + [t for t in tasks if t not in known and t != OVERALL] + ([OVERALL] if OVERALL in tasks else [])


def _pivot(summary: pd.DataFrame, column: str, methods: list) -> pd.DataFrame:
    rows = []
    for t in sorted(summary.temperature.unique()):
        part = summary[summary.temperature == t]
        for task in _ordered_tasks(part.task):
            cells = part[part.task == task].set_index("method")[column]
            rows.append({"T": _f(t, 1), "task": task, **{m: cells.get(m, float("nan")) for m in methods}})
        if column == "speedup" and "speedup_geomean_tasks" in part:
            cells = part[part.task == OVERALL].set_index("method")["speedup_geomean_tasks"]
            if len(cells):
                rows.append({"T": _f(t, 1), "task": "overall (geometric mean of tasks)",
                             **{m: cells.get(m, float("nan")) for m in methods}})
    return pd.DataFrame(rows)


def _is_true(series: pd.Series) -> pd.Series:
    return series.astype(str).str.strip().str.lower().isin(["true", "1", "1.0"])


def _setup_line(runs: pd.DataFrame | None) -> str:
    if runs is None:
        return _missing(RUNS_CSV, "03_task_acceptance")
    spec = _speculative(runs)
    per_task = runs.groupby("task").id.nunique()
    gammas = ", ".join(str(int(g)) for g in sorted(spec.gamma.dropna().unique()))
    parts = [f"{int(runs.id.nunique())} prompts from `data/prompts/` ("
             + ", ".join(f"{task} {int(per_task[task])}" for task in _ordered_tasks(per_task.index)) + ")",
             f"gamma {gammas}", f"{int(runs.new_tokens.max())} new tokens a run (EOS ignored while timing)",
             "temperatures " + ", ".join(_f(t, 1) for t in sorted(runs.temperature.unique()))]
    greedy = spec[spec.temperature == 0]
    if "same_as_baseline" in greedy and len(greedy):
        parts.append(f"{int(_is_true(greedy.same_as_baseline).sum())} of {len(greedy)} greedy speculative outputs "
                     "identical, token for token, to plain decoding of the same model and dtype")
    return "Set-up, read from the runs: " + "; ".join(parts) + "."


def _speculative(runs: pd.DataFrame) -> pd.DataFrame:
    """Our speculative methods' rows (column kind; older CSVs without it: every row but the baseline's)."""
    return runs[runs.kind == "speculative"] if "kind" in runs else runs[runs.method != "autoregressive"]


def _baseline_words(frame: pd.DataFrame) -> str:
    """'the fastest plain decoding (<its name>)' from a table's baseline column."""
    names = ", ".join(sorted(set(frame["baseline"].astype(str)))) if "baseline" in frame else "not recorded"
    return f"the fastest plain decoding measured in the same run ({names})"


def task_tables(results_dir: Path) -> str:
    """alpha, mean accepted length and speedup per task and draft kind (c and the acceptance by draft position
    are in the CSVs, the analysis and the cost model below)."""
    lines = ["## Every draft kind, per task (`03_task_acceptance`)", ""]
    summary, runs = _read(results_dir, SUMMARY_CSV), _read(results_dir, RUNS_CSV)
    lines += [_setup_line(runs), ""]
    if summary is None:
        return "\n".join(lines + [_missing(SUMMARY_CSV, "03_task_acceptance")])
    lines += ["Medians over prompts. alpha: accepted drafts / drafts the verifier looked at; mean accepted length: "
              "tokens per round, the corrected or bonus token included; speedup: time per token of "
              + _baseline_words(summary) + " / the method's, on the same prompt, measured side by side. T is the "
              "temperature. Each method's draft cost c per task is in `task_acceptance_summary.csv`, its "
              "acceptance by draft position (`accept_pos*`) in `task_acceptance_runs.csv` and "
              "`figures/acceptance_by_position.png`.", ""]
    methods = list(dict.fromkeys(summary.method))
    for column, title in [("alpha", "alpha"), ("mean_accepted_length", "Mean accepted length"),
                          ("speedup", "Speedup over the fastest plain decoding")]:
        if column in summary:
            lines += [f"### {title}", "", to_markdown(_pivot(summary, column, methods), digits=2), ""]
    return "\n".join(lines).rstrip()


def analysis(results_dir: Path) -> str:
    """Sentences computed from the per-task summary: rankings, per-task winners, and the formula beside them."""
    lines = ["## Analysis", ""]
    summary, runs = _read(results_dir, SUMMARY_CSV), _read(results_dir, RUNS_CSV)
    if summary is None:
        return "\n".join(lines + [_missing(SUMMARY_CSV, "03_task_acceptance")])
    gamma = int(_speculative(runs).gamma.median()) if runs is not None else None
    implied, formula = [], {}
    for t in sorted(summary.temperature.unique()):
        part = summary[summary.temperature == t]
        overall = part[part.task == OVERALL].set_index("method")
        tasks = [x for x in _ordered_tasks(part.task) if x != OVERALL]
        lines.append(f"### Temperature {_f(t, 1)}")
        lines.append("")
        if "speedup_geomean_tasks" in overall and len(overall):
            ranked = overall.speedup_geomean_tasks.sort_values(ascending=False)
            lines.append("- Geometric-mean speedup over the tasks, fastest first: "
                         + ", ".join(f"{m} {_f(v)}x" for m, v in ranked.items()) + ".")
        for task in tasks:
            rows = part[part.task == task].set_index("method")
            best_alpha, best_speed = rows.alpha.idxmax(), rows.speedup.idxmax()
            lines.append(f"- {task}: highest alpha {best_alpha} ({_f(rows.alpha[best_alpha])}), fastest "
                         f"{best_speed} ({_f(rows.speedup[best_speed])}x).")
        if {"EAGLE head", "Medusa heads"} <= set(part.method):
            e = part[part.method == "EAGLE head"].set_index("task").alpha
            m = part[part.method == "Medusa heads"].set_index("task").alpha
            above = sum(e[x] > m[x] for x in tasks if x in e and x in m)
            lines.append(f"- The EAGLE-style head's alpha is above the Medusa heads' in {above} of "
                         f"{len(tasks)} tasks (the articles rank EAGLE above Medusa).")
        lines.append("")
        if gamma is None:
            continue
        for method, r in overall.iterrows():
            if pd.isna(r.alpha):  # plain decoding, transformers' methods: no drafts of ours to put in the formula
                continue
            alpha = min(max(float(r.alpha), 0.0), 0.999)
            row = formula.setdefault(method, {"method": method})
            v = float(r.mean_accepted_length) / float(r.speedup) - gamma * float(r.c)
            row.update({f"alpha (T={t:g})": r.alpha, f"c (T={t:g})": r.c,
                        f"formula at v = 1 (T={t:g})": float(theory.speedup(alpha, gamma, float(r.c))),
                        f"measured (T={t:g})": r.speedup, f"implied v (T={t:g})": v})
            implied.append(v)
    if formula:
        lines += [f"What the formula gives for each draft kind's overall alpha and c at gamma {gamma}, if the "
                  "target's forward over gamma + 1 tokens cost one decode step (v = 1, the articles' assumption), "
                  "beside the measured speedup (median); implied v is the verification cost that would explain the "
                  "measured speedup, mean accepted length / speedup - gamma c (rough: it combines medians).", "",
                  to_markdown(pd.DataFrame(list(formula.values())), digits=2), ""]
    if implied and min(implied) > 1:
        lines.append("Every implied v is above 1: the target's forward over gamma + 1 tokens costs more than one "
                     "decode step here, so a draft must be accepted more often to pay for itself than the articles' "
                     "formula (v = 1, a GPU at batch 1) says. Notebook 02 measures v(gamma) directly on this machine "
                     "(claims C12, C13, C19).")
    return "\n".join(lines)


def speed_section(results_dir: Path) -> str:
    """The speed of every method, ours and transformers', as geometric means over tasks of the per-task median
    speedup over the fastest plain decoding; the speed goals; the cost model's predictions beside the
    measurements (greedy). From ``03_task_acceptance``'s CSVs."""
    lines = ["## Speed: every method against the fastest plain decoding, the goals, the cost model "
             "(`03_task_acceptance`)", ""]
    summary_path = Path(results_dir) / SUMMARY_CSV
    if not summary_path.exists():
        return "\n".join(lines + [_missing(SUMMARY_CSV, "03_task_acceptance")])
    summary = pd.read_csv(summary_path)
    per_task = summary[summary.task != "overall (median)"]
    table = per_task.groupby(["method", "temperature"]).speedup.agg(
        geomean=geometric_mean, slowest_task="min").reset_index()
    table = table.pivot(index="method", columns="temperature", values=["geomean", "slowest_task"])
    table.columns = [f"{stat} (T={t:g})" for stat, t in table.columns]
    lines += [f"Speedup over {_baseline_words(summary)}, same prompts and tokens; the methods run in "
              f"{', '.join(sorted(set(summary.get('dtype', pd.Series(['unrecorded'])).astype(str))))}. "
              "Geometric mean over tasks of the per-task median, and the slowest task:", "",
              to_markdown(table.sort_values(table.columns[0], ascending=False).reset_index(), digits=2), ""]
    for name, title in ((GOALS_CSV, "The speed goals, for the recommended drafting"),
                        (PROGRESSION_CSV, "Drafting's progression, step by step: tau, the measured speedup and the "
                                          "cost model's"),
                        (COST_MODEL_CSV, "The cost model, greedy: predicted E[N] and speedup beside the measured ones, "
                                         "per method (medians over tasks; speedups as geometric means over tasks; "
                                         "each task's row is in `cost_model.csv`)")):
        path = Path(results_dir) / name
        if path.exists():
            frame = pd.read_csv(path)
            if name == COST_MODEL_CSV:
                frame = cost_model_by_method(frame[frame.temperature == 0].drop(columns="temperature"))
            frame = frame.drop(columns=[c for c in ("target", "draft", "dtype") if c in frame])
            lines += [f"{title}:", "", to_markdown(frame, digits=2), ""]
    return "\n".join(lines).rstrip()


def cost_model_by_method(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per method of the per-task cost-model table: speedups as geometric means over the tasks, every
    other number as the median over them, in the method's first-seen order."""
    speeds = [c for c in frame.columns if "speedup" in c]
    numbers = [c for c in frame.select_dtypes("number").columns if c not in speeds]
    rows = []
    for method, part in frame.groupby("method", sort=False):
        row = {"method": method, "tasks": int(part.task.nunique()) if "task" in part else len(part)}
        row.update({c: float(part[c].median()) for c in numbers})
        row.update({c: geometric_mean(part[c].dropna()) if part[c].notna().any() else float("nan") for c in speeds})
        rows.append(row)
    return pd.DataFrame(rows)


def _link(path: Path, out_dir: Path | None) -> str:
    """A markdown link to ``path`` relative to the document's folder (the bare name without one)."""
    if out_dir is None:
        return f"`{path.name}`"
    rel = Path(os.path.relpath(Path(path).resolve(), Path(out_dir).resolve())).as_posix()
    return f"[`{path.name}`]({rel})"


def other_results(results_dir: Path, out_dir: Path | None = None) -> str:
    """Any other CSV in the results folder: a short one as a table (where it has a "part" column, its first
    part), a long one or a benchmark's (``bench*``) as a link with its size and columns, so that the document
    stays short; every row stays in the CSV."""
    known = {CLAIMS_CSV, SUMMARY_CSV, RUNS_CSV, GOALS_CSV, COST_MODEL_CSV, PROGRESSION_CSV, ENDPOINT_RUNS_CSV}
    others = [p for p in sorted(Path(results_dir).glob("*.csv"))
              if p.name not in known and not p.name.startswith("claims_")]
    lines = ["## Other measurements", ""]
    compared = (Path(results_dir) / SUMMARY_CSV).exists() and \
        pd.read_csv(Path(results_dir) / SUMMARY_CSV).method.str.startswith("transformers").any()
    if not compared and not any("bench" in p.name for p in others):
        lines += [f"*Benchmark against transformers' `generate`, prompt lookup and assisted generation: "
                  f"{NOT_MEASURED} into a CSV; `python -m specdec_lite.repro.bench` prints it.*", ""]
    linked = []
    for path in others:
        frame = pd.read_csv(path)
        shown, note = frame, ""
        if "part" in frame and len(frame):
            first = frame.part.iloc[0]
            shown = frame[frame.part == first].drop(columns="part")
            if len(shown) < len(frame):
                note = f"Its part `{first}`, {len(shown)} of {len(frame)} rows; the other parts are in the CSV."
        if len(shown) > MAX_TABLE_ROWS or path.name.startswith(BENCH_PREFIX):
            linked.append(f"- {_link(path, out_dir)}: {len(frame)} rows; columns " +
                          ", ".join(f"`{c}`" for c in frame.columns) + ".")
            continue
        lines += [f"### `{path.name}`", "", f"From {_link(path, out_dir)}." + (f" {note}" if note else ""), "",
                  to_markdown(shown, digits=3), ""]
    if linked:
        lines += ["### Longer tables, in their CSVs", "", *linked, ""]
    return "\n".join(lines).rstrip()


def figures_section(figures_dir: Path, out_dir: Path, results_dir: Path) -> str:
    lines = ["## Figures", "", "Each figure with the notebook that draws it and the arithmetic behind it.", ""]
    rel = Path(os.path.relpath(Path(figures_dir).resolve(), Path(out_dir).resolve())).as_posix()
    known = {f.file for f in FIGURES}
    extra = [Figure(p.name, "", p.stem.replace("_", " "), "not recorded")
             for p in sorted(Path(figures_dir).glob("*.png")) if p.name not in known]
    for fig in FIGURES + extra:
        where = f"`{fig.notebook}`, " if fig.notebook else ""
        if fig.dtype == REAL_MODELS:
            fig = Figure(fig.file, fig.notebook, fig.shows, f"{recorded_dtypes(results_dir)} (real models)")
        if (Path(figures_dir) / fig.file).exists():
            lines += [f"**{fig.shows}** ({where}dtype: {fig.dtype})\\", f"![{Path(fig.file).stem}]({rel}/{fig.file})",
                      ""]
        else:
            lines += [f"**{fig.shows}** ({where}dtype: {fig.dtype}): *{NOT_MEASURED}, `{fig.file}` not drawn.*",
                      ""]
    return "\n".join(lines).rstrip()


def results_markdown(results_dir: Path | None = None, out_dir: Path | None = None, figures_dir: Path | None = None,
                     env: dict | None = None) -> str:
    """The whole results document as markdown; ``out_dir`` is where it will live (for the figures' links)."""
    results_dir = Path(results_dir or paths.results_dir())
    if not results_dir.is_dir():
        raise FileNotFoundError(f"no results folder at {results_dir}: run the notebooks (make reproduce) first, or "
                                "pass the folder that holds their CSVs")
    figures_dir = Path(figures_dir or paths.figures_dir())
    out_dir = Path(out_dir or paths.repo_root() / RESULTS_DOC.parent)
    head = "\n".join([
        "# Results", "",
        "<!-- generated by specdec_lite.repro.report.write_results (notebooks/04_claims.ipynb); do not edit -->", "",
        "Written by `notebooks/04_claims.ipynb` from the CSVs in `data/results/`: every number below comes from "
        "those files. Rerun the notebooks (`make reproduce`) to remake them. The claims are described in "
        "[CLAIMS.md](CLAIMS.md), the articles they come from in [SOURCES.md](SOURCES.md)."])
    sections = [head, where_measured(results_dir, env), claims_overview(results_dir), claims_by_notebook(results_dir),
                task_tables(results_dir), analysis(results_dir), speed_section(results_dir),
                other_results(results_dir, out_dir),
                figures_section(figures_dir, out_dir, results_dir)]
    return "\n\n".join(s.rstrip() for s in sections) + "\n"


def write_results(results_dir: Path | None = None, out_path: Path | None = None,
                  figures_dir: Path | None = None) -> Path:
    """Write the results document (default docs/RESULTS.md) from the CSVs in ``results_dir`` (default
    data/results); figures are linked relative to it from ``figures_dir`` (default the ``figures/`` folder
    beside ``data/``). Returns the path written."""
    out_path = Path(out_path or paths.repo_root() / RESULTS_DOC)
    text = results_markdown(results_dir, out_path.parent, figures_dir)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    return out_path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=None, help="default: the repository's data/results")
    parser.add_argument("--out", default=None, help="default: the repository's docs/RESULTS.md")
    parser.add_argument("--figures", default=None, help="default: figures/ beside data/")
    args = parser.parse_args(argv)
    print(write_results(args.results, args.out, args.figures))


if __name__ == "__main__":
    main()
