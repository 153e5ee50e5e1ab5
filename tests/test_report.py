"""The results document: built from the CSVs only, every claim with a verdict, explicit gaps, in sync."""
import re

import pandas as pd
import pytest
import torch
import transformers

from specdec_lite import paths
from specdec_lite.repro import claims, report

ENV = {"cpu": "Test CPU", "cores": 3, "torch": "9.9.9", "transformers": "8.8.8", "python": "3.0.0"}
METHODS = ("EAGLE head", "n-gram")


def _summary():
    rows = []
    for t in (0.0, 1.0):
        for m, (alpha, speed) in zip(METHODS, [(0.417, 1.234), (0.613, 1.876)]):
            for i, task in enumerate(["code", "dialogue"]):
                rows.append({"method": m, "task": task, "alpha": alpha + i / 100, "acceptance_rate": 0.2,
                             "mean_accepted_length": 1.5 + i / 10, "c": 0.05, "speedup": speed + i / 100,
                             "speedup_geomean_tasks": float("nan"), "temperature": t})
            rows.append({"method": m, "task": "overall (median)", "alpha": alpha, "acceptance_rate": 0.2,
                         "mean_accepted_length": 1.55, "c": 0.05, "speedup": speed, "speedup_geomean_tasks":
                         speed + 0.111, "temperature": t})
    return pd.DataFrame(rows)


def _runs():
    rows = []
    for t in (0.0, 1.0):
        for pid, task in [("code-00", "code"), ("code-01", "code"), ("dialogue-00", "dialogue")]:
            rows.append({"id": pid, "task": task, "method": "autoregressive", "temperature": t, "gamma": 5,
                         "new_tokens": 96, "c": float("nan"), "same_as_baseline": "", "accept_pos1": float("nan")})
            for m in METHODS:
                rows.append({"id": pid, "task": task, "method": m, "temperature": t, "gamma": 5, "new_tokens": 96,
                             "c": 0.05, "same_as_baseline": t == 0.0, "accept_pos1": 0.777})
    return pd.DataFrame(rows)


@pytest.fixture
def results(tmp_path):
    folder = tmp_path / "results"
    claims.write_claims([claims.ClaimRow("C1", "000", "exact law", "max dev 3.3e-17", "reproduces", "enumeration"),
                         claims.ClaimRow("C5", "000", "4x4 table", "15/16 cells", "differs", "one slip")],
                        "01_unbiasedness", folder)
    claims.write_claims([claims.ClaimRow("C11", "003", "code 85%", "code alpha 0.42", "differs", "small target")],
                        "03_task_acceptance", folder)
    claims.gather(folder).to_csv(folder / "claims.csv", index=False)
    _summary().to_csv(folder / "task_acceptance_summary.csv", index=False)
    _runs().to_csv(folder / "task_acceptance_runs.csv", index=False)
    pd.DataFrame({"comparison": ["ours vs generate"], "ratio": [1.0437]}).to_csv(folder / "compare.csv", index=False)
    pd.DataFrame({"method": ["auto"], "ms/token": [12.3456]}).to_csv(folder / "bench_x.csv", index=False)
    pd.DataFrame({"row": range(report.MAX_TABLE_ROWS + 1), "value": 7.6543}).to_csv(folder / "long.csv", index=False)
    pd.DataFrame({"part": ["main"] * 2 + ["other"] * 30, "value": [5.4321] * 2 + [9.8765] * 30}).to_csv(
        folder / "parts.csv", index=False)
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "task_acceptance.png").write_bytes(b"png")
    (figures / "extra_plot.png").write_bytes(b"png")
    return folder, figures


def _row(text, claim):
    return next(line for line in text.splitlines() if line.startswith(f"| {claim} |"))


def test_document_carries_the_csv_numbers_and_a_verdict_per_claim(results, tmp_path):
    folder, figures = results
    out = report.write_results(folder, tmp_path / "docs" / "RESULTS.md", figures)
    text = out.read_text()
    for claim in claims.ALL_CLAIMS:
        assert re.search(rf"^\| {claim} \|.*\*\*(reproduces|differs|not testable here|not measured yet)\*\*",
                         text, re.M), claim
    assert "**reproduces**" in _row(text, "C1") and "**differs**" in _row(text, "C5")
    assert "**not testable here**" in _row(text, "C2")  # no notebook checked it
    assert "Verdicts: reproduces 1, differs 2, not testable here 19" in text
    # each check's own measurement, by notebook
    assert "### `01_unbiasedness`" in text and "max dev 3.3e-17" in text and "code alpha 0.42" in text
    # per-task tables: alpha, speedup, geometric mean, acceptance by position, set-up read from the runs
    assert "| 0.0 | code | 0.42 | 0.61 |" in text and "| 1.0 | dialogue | 0.43 | 0.62 |" in text
    assert "| 0.0 | overall (geometric mean of tasks) | 1.34 | 1.99 |" in text
    assert "gamma 5" in text and "96 new tokens a run (EOS ignored while timing)" in text
    assert "`accept_pos*`) in `task_acceptance_runs.csv`" in text  # by draft position: in the CSV, not a table
    assert "3 prompts from" in text and "code 2, dialogue 1" in text
    assert "6 of 6 greedy speculative outputs identical" in text
    # analysis computed from the summary
    assert "fastest first: n-gram 1.99x, EAGLE head 1.34x" in text
    assert "code: highest alpha n-gram (0.61), fastest n-gram (1.88x)" in text
    # a short other CSV is rendered; a long one and a benchmark's are linked, relative to the document; a CSV
    # with parts shows its first part
    assert "### `compare.csv`" in text and "1.044" in text
    assert "[`bench_x.csv`](../results/bench_x.csv): 1 rows" in text and "12.346" not in text
    assert f"[`long.csv`](../results/long.csv): {report.MAX_TABLE_ROWS + 1} rows" in text and "7.654" not in text
    assert "### `parts.csv`" in text and "5.432" in text and "9.877" not in text and "2 of 32 rows" in text
    # the figures are linked relative to the document with their dtype
    assert "](../figures/task_acceptance.png)" in text and "float32" in text
    assert "`unbiasedness_pvalues.png` not drawn" in text and "](../figures/extra_plot.png)" in text


def test_where_measured_reads_the_environment():
    text = report.where_measured(paths.results_dir())
    assert f"torch {torch.__version__}" in text and f"transformers {transformers.__version__}" in text
    assert report.recorded_dtypes(paths.results_dir()) in text and "NVIDIA GPU" in text and "not run yet" in text
    fake = report.where_measured(paths.results_dir(), env=ENV)
    assert "Test CPU, 3 cores" in fake and "torch 9.9.9" in fake


def test_missing_csvs_say_not_measured_yet(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results folder"):
        report.results_markdown(tmp_path / "absent", tmp_path, tmp_path, env=ENV)
    empty = tmp_path / "results"
    empty.mkdir()
    text = report.results_markdown(empty, tmp_path, tmp_path, env=ENV)
    assert "not measured yet: `claims.csv`" in text
    assert "not measured yet: `task_acceptance_summary.csv`" in text
    assert "not measured yet: `task_acceptance_runs.csv`" in text
    for claim in claims.ALL_CLAIMS:
        assert "**not measured yet**" in _row(text, claim)
    assert "| CPU: Test CPU, 3 cores (this machine) |" in text and "| not measured yet |" in text
    assert not re.search(r"\d\.\d\d\b", text.split("## Figures")[0].replace("9.9.9", "").replace("8.8.8", "")
                         .replace("3.0.0", "")), "a number appeared that no CSV gave"


def test_shipped_results_document_matches_the_committed_csvs():
    """docs/RESULTS.md is what the generator makes from data/results (the machine-dependent section aside):
    nobody edited a number by hand, and 04_claims was rerun after the last CSV changed."""
    shipped = (paths.repo_root() / report.RESULTS_DOC).read_text()
    fresh = report.results_markdown(paths.results_dir(), paths.repo_root() / "docs", paths.figures_dir())

    def sections(text):
        return {s.split("\n", 1)[0]: s for s in text.split("\n## ") if not s.startswith("Where measured")}
    assert sections(shipped) == sections(fresh), \
        "docs/RESULTS.md is stale: run notebooks/04_claims.ipynb (or python -m specdec_lite.repro.report)"
    table = pd.read_csv(paths.results_dir() / "claims.csv", dtype=str, keep_default_na=False)
    for r in table.itertuples():
        assert f"**{r.verdict}**" in _row(shipped, r.claim)


def test_shipped_results_document_stays_short():
    """docs/RESULTS.md holds the claims, each notebook's key tables and links to the CSVs, not every row."""
    lines = (paths.repo_root() / report.RESULTS_DOC).read_text().splitlines()
    assert len(lines) <= report.MAX_LINES == 400, f"docs/RESULTS.md has {len(lines)} lines, at most 400"


def test_speed_section_lists_every_method_the_goals_and_the_cost_model(tmp_path):
    rows = []
    for t in (0.0, 1.0):
        for method, speeds in (("hybrid tree (auto)", [1.8, 1.2]), ("transformers prompt lookup", [1.1, 0.9])):
            rows += [{"method": method, "task": task, "speedup": v, "temperature": t, "dtype": "bfloat16",
                      "baseline": "autoregressive, float32"} for task, v in zip(["code", "translation"], speeds)]
            rows.append({"method": method, "task": "overall (median)", "speedup": 1.5, "temperature": t,
                         "dtype": "bfloat16", "baseline": "autoregressive, float32"})
    pd.DataFrame(rows).to_csv(tmp_path / report.SUMMARY_CSV, index=False)
    pd.DataFrame([{"goal": "greedy geometric mean over tasks", "wanted": ">= 1.6", "measured": 1.47, "met": False,
                   "method": "hybrid tree (auto)", "target": "t", "draft": "d", "dtype": "bfloat16"}]).to_csv(
        tmp_path / report.GOALS_CSV, index=False)
    pd.DataFrame([{"method": "hybrid tree (auto)", "task": task, "temperature": t, "speedup": speed,
                   "predicted speedup": predicted, "v measured": v}
                  for task, t, speed, predicted, v in [("code", 0.0, 1.8, 1.7, 1.2),
                                                       ("translation", 0.0, 1.2, 1.5, 1.4),
                                                       ("code", 1.0, 9.9, 9.9, 9.9)]]).to_csv(
        tmp_path / report.COST_MODEL_CSV, index=False)
    pd.DataFrame([{"step": "tree shape: fixed -> dynamic", "temperature": 1.0, "role": "after", "method": "dynamic",
                   "tau": 2.5}]).to_csv(tmp_path / report.PROGRESSION_CSV, index=False)
    text = report.speed_section(tmp_path)
    assert "| tree shape: fixed -> dynamic | 1.00 | after | dynamic | 2.50 |" in text  # every temperature kept
    assert "| hybrid tree (auto) | 1.47 | 1.47 | 1.20 | 1.20 |" in text  # geomean of 1.8 and 1.2, slowest 1.2
    assert "| transformers prompt lookup | 0.99 |" in text and "run in bfloat16" in text
    assert "the fastest plain decoding measured in the same run (autoregressive, float32)" in text
    assert "| greedy geometric mean over tasks | >= 1.6 | 1.47 | False | hybrid tree (auto) |" in text
    # the cost model, greedy, one row per method: tasks, medians (v 1.3), geometric means of the speedups
    assert "| hybrid tree (auto) | 2 | 1.30 | 1.47 | 1.60 |" in text and "9.90" not in text
    assert f"{report.NOT_MEASURED}: `{report.SUMMARY_CSV}`" in report.speed_section(tmp_path / "empty")
