"""Every figure of specdec_lite.repro.figures, drawn from small frames with the columns the notebooks pass, reads
at its size: no legend over any axes, title or label, at most six entries in a legend, titles wrapped
(``figures.layout_problems``, on matplotlib's own extents); the check flags bad layouts; the per-task figure shows
the methods picked by role."""
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import seaborn as sns  # noqa: E402

from specdec_lite.repro import evaluate, figures, speedup_tables  # noqa: E402

TASKS = ["code", "dialogue", "summarization", "translation"]
AUTO = "hybrid dynamic tree; at T > 0 EAGLE head (auto)"
SPECULATIVE = ["trained draft", "EAGLE head", "EAGLE head (smollm2-135m-eagle)", "EAGLE-3 head", "Medusa heads",
               "n-gram", "lookup tree", "EAGLE tree", "EAGLE dynamic tree", "hybrid tree", "hybrid dynamic tree",
               AUTO, "layer-skip"]
PLAIN = ["autoregressive", "transformers generate", "autoregressive, float16", "transformers generate, float16",
         "autoregressive, float32", "transformers generate, float32"]
ASSISTED = ["transformers prompt lookup", "transformers assisted (trained draft)"]
FASTEST = "transformers generate, float16"  # the baseline of every speedup in these runs
SHOWN = [f"fastest plain: {FASTEST}", "trained draft", "n-gram", "EAGLE head (chain)",
         "auto: hybrid dynamic tree; at T > 0 EAGLE head", "transformers prompt lookup"]


def fake_runs(seed=0) -> pd.DataFrame:
    """``evaluate.run_prompts`` rows (the columns the figures read): 21 methods, 4 tasks, 2 prompts, 2
    temperatures; FASTEST's speedup is 1 on every prompt."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in (0.0, 1.0):
        for task in TASKS:
            for prompt in range(2):
                for method in PLAIN + SPECULATIVE + ASSISTED:
                    kind = "plain" if method in PLAIN else "speculative" if method in SPECULATIVE else \
                        "transformers assisted"
                    speculative = kind == "speculative"
                    rows.append({"id": f"{task}-{prompt}", "task": task, "method": method, "temperature": t,
                                 "kind": kind, "plain": kind == "plain", "baseline": FASTEST,
                                 "alpha": rng.uniform(0.1, 0.8) if speculative else np.nan,
                                 "speedup": 1.0 if method == FASTEST else rng.uniform(0.3, 1.9)})
    return pd.DataFrame(rows)


def fake_cost_model() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame([{"method": m, "task": task, "temperature": t, "predicted speedup": rng.uniform(0.5, 2),
                          "speedup": rng.uniform(0.5, 2)}
                         for m in SPECULATIVE for task in TASKS for t in (0.0, 1.0)])


def fake_progression() -> pd.DataFrame:
    rng = np.random.default_rng(2)
    return pd.DataFrame([{"step": step, "temperature": t, "role": role, "method": method, "tau": 2.0,
                          "speedup (geomean over tasks)": rng.uniform(0.8, 1.6),
                          "cost model (geomean over tasks)": rng.uniform(0.8, 1.9)}
                         for step, before, after, t in evaluate.PROGRESSION
                         for role, method in (("before", before), ("after", after))])


def fake_by_position() -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(3)
    by_pos = pd.DataFrame([{"method": m, "temperature": t, "position": i, "acceptance": rng.uniform(0.1, 0.9)}
                           for m in SPECULATIVE for t in (0.0, 1.0) for i in range(1, 5)])
    along = pd.DataFrame([{"method": m, "temperature": t, "output position": 32 * b, "alpha": rng.uniform(0.1, 0.9)}
                          for m in SPECULATIVE for t in (0.0, 1.0) for b in range(4) for _ in range(2)])
    return by_pos, along


ENDPOINTS = {"local plain": "local plain", "local speculative (auto)": "local plain",
             "llama.cpp plain": "llama.cpp plain", "llama.cpp prompt lookup": "llama.cpp plain"}


def fake_endpoints() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every request, ``endpoints.per_task`` of every part), as 05_endpoints has them."""
    rng = np.random.default_rng(4)
    parts = {"main": (200, 1), "short outputs": (24, 1), "concurrency 1": (48, 1), "concurrency 4": (48, 4)}
    records = pd.DataFrame([{"endpoint": e, "task": task, "latency_s": rng.uniform(0.5, 6), "part": part}
                            for e in ENDPOINTS for task in TASKS for part in parts for _ in range(3)])
    table = pd.DataFrame([{"endpoint": e, "baseline": b, "task": task, "part": part, "max_tokens": n,
                           "concurrency": level, "speedup": 1.0 if e == b else rng.uniform(0.4, 2.2),
                           "acceptance": rng.uniform(0.1, 0.3) if "speculative" in e else np.nan}
                          for e, b in ENDPOINTS.items() for task in TASKS for part, (n, level) in parts.items()])
    return records, table


def fake_heads_log() -> pd.DataFrame:
    rows = [{"kind": "eagle", "step": s, "heldout_ce": 4 - s / 1000, "heldout_agreement": 0.3 + s / 10_000}
            for s in range(200, 3600, 400)]
    rows += [{"kind": "medusa", "step": s, "heldout_ce": 6 - s / 1000,
              **{f"heldout_agreement_head{k}": 0.3 / k + s / 20_000 for k in range(1, 5)}}
             for s in range(200, 1600, 200)]
    return pd.DataFrame(rows)


def fake_sweep_table() -> pd.DataFrame:
    runs = fake_runs()
    frames = []
    for pair in ("smollm2 / draft", "tiny / tiny-1l"):
        summary = pd.concat([evaluate.summarize(runs[runs.temperature == t]).assign(temperature=t)
                             for t in (0.0, 1.0)], ignore_index=True)
        frames.append(summary.assign(pair=pair, mean_accepted_length=2.0))
    return pd.concat(frames, ignore_index=True)


def fake_gpu_rows() -> list[dict]:
    rows = []
    for target, draft in (("llama-8b", "llama-1b"), ("smollm2-135m", "tiny")):
        for path in ("eager-dynamic", "static-compiled"):
            row = {"target": target, "draft": draft, "path": path, "device": "cuda", "dtype": "bfloat16",
                   "transformers generate tokens/s": 30.0, "transformers assisted tokens/s": 40.0,
                   "ours autoregressive tokens/s": 35.0}
            for a in (0.6, 0.8, 0.9):
                row |= {f"speculative tokens/s a={a}": 40 + 20 * a, f"predicted speedup a={a}": 1 + a}
            rows.append(row)
    return rows


def fake_batch_throughput() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(``batching.batch_throughput`` rows, ``costs.by_batch``): plain decoding in two configurations, three
    draftings, the EAGLE head's chain skipped past batch 1."""
    rng = np.random.default_rng(5)
    batches = [1, 2, 4, 8, 16, 32]
    rows = []
    for b in batches:
        plain = {"autoregressive, float32": 40.0 * b ** 0.8, "transformers generate, float32": 35.0 * b ** 0.85,
                 "autoregressive, bfloat16": 55.0 * b ** 0.6}
        fastest = max(plain, key=plain.get)
        for method, tps in plain.items():
            rows.append({"batch": b, "method": method, "kind": "plain", "tokens_per_second": tps,
                         "baseline": fastest, "speedup": tps / plain[fastest], "skipped": ""})
        for method, gain in (("trained draft", 1.3), ("n-gram", 1.5), ("EAGLE head", 1.8)):
            skipped = method == "EAGLE head" and b > 1
            speedup = np.nan if skipped else gain * b ** -0.15 * rng.uniform(0.95, 1.05)
            rows.append({"batch": b, "method": method, "kind": "speculative",
                         "tokens_per_second": speedup * plain[fastest], "baseline": fastest, "speedup": speedup,
                         "skipped": "refused a batch" if skipped else ""})
    v = pd.DataFrame({"batch": batches, "v(4) = T(5 tokens)/T(1 token)": np.linspace(1.05, 3.0, len(batches))})
    return pd.DataFrame(rows), v


def title(text):
    return f"{text} (bfloat16)"


FIGURES = {
    "draft_training_loss": lambda: figures.draft_training_loss(pd.DataFrame(
        [{"step": s, "train_loss": 5 - s / 1000, "heldout_hard_ce": 5 - s / 1200, "heldout_soft_ce": 5 - s / 1400,
          "heldout_agreement": 0.2 + s / 10_000} for s in range(100, 4100, 100)]), title),
    "heads_training": lambda: figures.heads_training(fake_heads_log(), title),
    "unbiasedness_pvalues": lambda: figures.unbiasedness_pvalues(pd.DataFrame(
        [{"verifier": v, "samples": n, "p-value": 10.0 ** -(i * n / 2000), "max deviation": 1 / np.sqrt(n) + i / 50}
         for i, v in enumerate(["correct verifier", "bonus from wrong position", "residual from p",
                                "inverted ratio q/p", "bonus after last-position rejection"])
         for n in (2000, 5000, 12600, 31700, 80000, 200000)]), level=0.01, n_tokens=3),
    "speedup_heatmap": lambda: figures.speedup_heatmap(speedup_tables.wide_table(
        np.round(np.arange(0.3, 0.96, 0.05), 2), cs=(0.05, 0.1, 0.2), gammas=range(1, 11))),
    "break_even": lambda: figures.break_even(speedup_tables.break_even_curves(
        np.round(np.linspace(0.0, 0.5, 6), 2), vs=(1.0, 1.3, 1.7))),
    "predicted_vs_measured_speedup": lambda: figures.predicted_vs_measured_speedup(pd.DataFrame(
        {"gamma": range(1, 9), "measured": np.linspace(1.1, 0.7, 8), "predicted": np.linspace(1.0, 0.8, 8),
         "predicted (v = 1)": np.linspace(1.1, 0.9, 8),
         "measured over the fastest plain": np.linspace(1.1, 0.7, 8)}), title),
    "task_acceptance": lambda: figures.task_acceptance(fake_runs(), title),
    "cost_model": lambda: figures.cost_model(fake_cost_model(), title),
    "drafting_progression": lambda: figures.drafting_progression(fake_progression(), title),
    "acceptance_by_position": lambda: figures.acceptance_by_position(*fake_by_position(), title),
    "endpoints": lambda: figures.endpoints(fake_endpoints()[0].query("part == 'main'"),
                                           fake_endpoints()[1].query("part == 'main'"), 200, title),
    "endpoints_length_concurrency": lambda: figures.endpoints_length_concurrency(fake_endpoints()[1], title),
    "sweep_comparison": lambda: figures.sweep_comparison(fake_sweep_table()),
    "gpu_check": lambda: figures.gpu_check(fake_gpu_rows(), (0.6, 0.8, 0.9)),
    "batch_throughput": lambda: figures.batch_throughput(*fake_batch_throughput(), title),
}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_every_figure_saved_is_drawn_by_the_module_and_here():
    """The notebooks and scripts draw no figure themselves: each calls one function of the module, and each of
    those is drawn by the test below."""
    root = Path(__file__).resolve().parents[1]
    callers = [*sorted((root / "notebooks").glob("[0-9]*.ipynb")), root / "specdec_lite" / "sweep.py",
               root / "specdec_lite" / "repro" / "gpu_bench.py"]
    code = {path.name: "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                                 if c["cell_type"] == "code") if path.suffix == ".ipynb" else path.read_text()
            for path in callers}
    called = {name for text in code.values() for name in re.findall(r"figures\.(\w+)\(", text)} - {"save"}
    assert called == set(FIGURES)
    drawing_itself = [name for name, text in code.items() if re.search(r"savefig|plt\.|sns\.", text)]
    assert not drawing_itself, drawing_itself


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_reads_at_its_size(name, tmp_path):
    fig = FIGURES[name]()
    assert fig.axes and all(ax.has_data() for ax in fig.axes), "the figure drew nothing"
    assert figures.layout_problems(fig) == []
    legends = figures.legends_of(fig)
    assert all(len(legend.get_texts()) <= figures.MAX_METHODS for legend in legends)
    figures.save(fig, tmp_path / f"{name}.png")
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000


def legend_labels(fig) -> list[str]:
    return [t.get_text().replace("\n", " ") for legend in figures.legends_of(fig) for t in legend.get_texts()]


def test_the_task_figure_shows_six_methods_picked_by_role():
    fig = figures.task_acceptance(fake_runs(), title)
    assert legend_labels(fig) == SHOWN
    alpha, speedup = fig.axes
    assert [len(bars) for bars in speedup.containers] == [len(TASKS)] * len(SHOWN)  # a bar per task and method
    assert len(alpha.containers) == 4  # the plain baseline and transformers' lookup have no alpha


def test_the_baseline_is_found_by_its_speedup_and_auto_by_its_mark():
    runs = fake_runs()
    # ours plain in the run's own configuration is the baseline: the baseline column names its configuration
    runs.loc[runs.method == FASTEST, "speedup"] = 0.97
    runs.loc[runs.method == "autoregressive", "speedup"] = 1.0
    runs["baseline"] = "autoregressive, bfloat16"
    runs["method"] = runs["method"].replace(AUTO, "EAGLE tree (auto)")
    shown, palette = figures.key_methods(runs)
    assert list(palette)[0] == "fastest plain: autoregressive, bfloat16"
    assert set(shown[shown.shown == list(palette)[0]].method) == {"autoregressive"}
    assert "auto: EAGLE tree" in palette
    # several runs side by side (or another baseline at T=1): the role, not a name
    runs.loc[(runs.temperature == 1.0) & (runs.method == "autoregressive"), "speedup"] = 0.9
    runs.loc[(runs.temperature == 1.0) & (runs.method == FASTEST), "speedup"] = 1.0
    runs.loc[runs.temperature == 1.0, "baseline"] = FASTEST
    shown, palette = figures.key_methods(runs)
    assert list(palette)[0] == "fastest plain decoding"
    assert set(shown[shown.shown == "fastest plain decoding"].method) == {"autoregressive", FASTEST}
    assert list(figures.key_methods(runs, named=False)[1])[4] == "auto"


def test_a_missing_role_keeps_the_others_colours_and_markers():
    runs = fake_runs()
    _, every = figures.key_methods(runs)
    _, some = figures.key_methods(runs[runs.method != "n-gram"])
    assert "n-gram" not in some and len(some) == 5
    assert all(every[label] == colour for label, colour in some.items())
    markers = figures.role_markers(every)
    assert len(set(markers.values())) == len(every)  # methods whose points coincide both show
    assert figures.role_markers(some) == {label: markers[label] for label in some}


def test_the_labels_picked_by_name_are_those_results_give(tiny_target, tiny_draft):
    from specdec_lite.drafts.loading import drafts_for_pair

    drafts, _ = drafts_for_pair(tiny_target, tiny_draft, heads="")
    assert {figures.TRAINED_DRAFT, figures.NGRAM} <= set(drafts)
    assert figures.PROMPT_LOOKUP in evaluate.transformers_methods()
    assert figures.EAGLE_CHAIN in {method for _, before, after, _ in evaluate.PROGRESSION for method in (before, after)}
    assert evaluate.recommended(["n-gram", AUTO]) == AUTO and AUTO.endswith(figures.AUTO_MARK)


# ---- the check finds what it must (a check that cannot fail is no check)


def lines(ax, n):
    for i in range(n):
        ax.plot([0, 1], [i, i + 1], label=f"method {i}")


def test_the_check_flags_a_legend_over_the_axes():
    fig, ax = plt.subplots(layout="constrained")
    lines(ax, 3)
    ax.set_title("three methods")
    ax.legend(loc="center")
    assert any("covers the axes" in p for p in figures.layout_problems(fig))


def test_the_check_flags_seven_methods():
    fig, ax = plt.subplots(layout="constrained")
    lines(ax, 7)
    fig.legend(loc="outside lower center", ncols=4)
    assert figures.layout_problems(fig) == ["legend 0 has 7 entries (at most 6)"]


def test_the_check_flags_a_legend_over_another_subplots_title():
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    lines(left, 2)
    right.plot([0, 1], [0, 1])
    left.set_title("left")
    right.set_title("the right panel's title")
    left.legend(loc="center", bbox_to_anchor=(0.75, 0.9), bbox_transform=fig.transFigure)
    fig.canvas.draw()
    assert "the right panel's title" in " ".join(figures.layout_problems(fig))


def test_the_check_flags_a_legend_over_a_tick_label_and_legends_over_each_other():
    fig, ax = plt.subplots(figsize=(5, 4))
    lines(ax, 2)
    fig.subplots_adjust(left=0.3)
    first = ax.legend(loc="center right", bbox_to_anchor=(0.0, 0.5), frameon=True)
    ax.add_artist(first)
    ax.legend(["again"], loc="center right", bbox_to_anchor=(0.0, 0.55))
    problems = " ".join(figures.layout_problems(fig))
    assert "covers the text" in problems and "covers another legend" in problems


def test_the_check_flags_an_unwrapped_title():
    fig, axes = plt.subplots(1, 3, figsize=(9, 3), layout="constrained")
    axes[0].set_title("left")
    axes[2].set_title("right")
    axes[1].set_title("a long title that nobody wrapped, so it runs over the panels beside it (bfloat16)")
    problems = " ".join(figures.layout_problems(fig))
    assert "wider than its axes" in problems and "covers the title 'right'" in problems
    figures.set_title(axes[1], "a long title that nobody wrapped, so it runs over the panels beside it (bfloat16)")
    assert figures.layout_problems(fig) == []


def test_the_check_flags_the_old_per_task_figure():
    """The per-task figure as 03 drew it before: every method, seaborn's legends over both plots."""
    runs = fake_runs()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    plot = evaluate.speculative_rows(runs)
    sns.barplot(data=plot, x="task", y="alpha", hue="method", errorbar=None, ax=axes[0]).set(
        title=title("acceptance alpha by task (all temperatures)"))
    sns.barplot(data=plot, x="task", y="speedup", hue="method", errorbar=None, ax=axes[1]).set(
        title=title("speedup over the fastest plain decoding"))
    fig.tight_layout()
    problems = figures.layout_problems(fig)
    assert "legend method has 13 entries (at most 6)" in problems
    assert any("covers the axes" in p for p in problems)
