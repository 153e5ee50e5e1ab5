"""Every figure the notebooks and scripts save, one function each, drawn to be read at the size it is shown.

The rules, which ``layout_problems`` checks on a drawn figure (tests/test_figures.py runs it on each one):

- at most ``MAX_METHODS`` methods in one plot: a figure over many methods shows those ``key_methods`` picks by
  role (the tables keep every method);
- legends outside the axes (below the figure, or beside their own axes), the figure laid out to fit them
  (matplotlib's constrained layout) and saved with them (``save``: ``bbox_inches="tight"``);
- long titles wrapped to their axes; nothing covers a title.

Each function takes the frames the notebooks (or scripts) have and returns the figure, drawn with pyplot so that
a notebook shows it; ``title`` is a function that finishes a title (the notebooks pass ``run.title``, which adds
the dtype). seaborn and pandas are imported where a figure needs them: ``gpu_check`` needs only matplotlib (the
GPU check runs where only torch and transformers are installed).
"""
from __future__ import annotations

import textwrap
import warnings

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

MAX_METHODS = 6  # methods (or other series) in one plot, and entries in one legend
LEGEND_CHARS = 48  # a legend label longer than this is wrapped
CHARS_PER_INCH = 9  # title characters that fit in an inch of a panel's width at the default title size

# the labels results give the methods ``key_methods`` picks by name (``drafts.loading.drafts_for_pair``,
# ``evaluate.transformers_methods``); the baseline and "auto" are found by role
TRAINED_DRAFT = "trained draft"
NGRAM = "n-gram"
EAGLE_CHAIN = "EAGLE head"  # the recommended EAGLE head's chain, the one the trees use
AUTO_MARK = " (auto)"  # the end of the recommended drafting's label (``evaluate.recommended``)
PROMPT_LOOKUP = "transformers prompt lookup"


def unchanged(text: str) -> str:
    return text


def wrapped(text: str, chars: int) -> str:
    """``text`` broken into lines of at most ``chars`` characters (at spaces)."""
    return "\n".join(textwrap.wrap(str(text), chars)) or str(text)


def panel_chars(ax) -> int:
    """How many title characters fit across ``ax``: its share of the figure's width."""
    spec = ax.get_subplotspec()
    columns = spec.get_gridspec().ncols if spec is not None else 1
    return max(20, int(ax.figure.get_figwidth() / columns * CHARS_PER_INCH))


def set_title(ax, text: str) -> None:
    """A title wrapped to the width of its axes."""
    ax.set_title(wrapped(text, panel_chars(ax)))


def legend_below(fig, palette: dict, *, title: str | None = None, lines: bool = False, columns: int = 3,
                 markers: dict | None = None):
    """One legend for the whole figure, below it: a patch (or, ``lines``, a line; with ``markers``, {label:
    marker}, a marker) of each colour of ``palette`` ({label: colour}), labels wrapped. The figure needs
    constrained layout."""
    if markers:
        handles = [Line2D([], [], color=c, marker=markers[label], ls="-" if lines else "")
                   for label, c in palette.items()]
    else:
        handles = [Line2D([], [], color=c) if lines else Patch(facecolor=c) for c in palette.values()]
    labels = [wrapped(label, LEGEND_CHARS) for label in palette]
    return fig.legend(handles, labels, loc="outside lower center", ncols=min(columns, len(labels)), title=title,
                      frameon=False)


def legend_beside(ax, title: str | None = None):
    """``ax``'s legend (the one seaborn drew inside it), moved to its right, outside it."""
    drawn = ax.get_legend()
    labels = [wrapped(t.get_text(), LEGEND_CHARS) for t in drawn.get_texts()]
    return ax.legend(drawn.legend_handles, labels, loc="upper left",
                     bbox_to_anchor=(1.02, 1), borderaxespad=0, title=title, frameon=False)


def move_below(fig, ax, columns: int = 3):
    """``ax``'s legend (the one seaborn drew inside it, its entries as drawn) made the figure's, below it."""
    drawn = ax.get_legend()
    labels = [wrapped(t.get_text(), LEGEND_CHARS) for t in drawn.get_texts()]
    drawn.remove()
    return fig.legend(drawn.legend_handles, labels, loc="outside lower center", ncols=min(columns, len(labels)),
                      frameon=False)


def drop_legends(*axes) -> None:
    """Remove the legends seaborn put inside the axes."""
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()


def colours(labels) -> dict:
    """{label: colour} in order, from the default colour cycle."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}


def save(fig, path, dpi: int = 120, close: bool = False) -> None:
    """Write ``fig`` to ``path`` with everything outside the axes included (``bbox_inches="tight"``);
    ``close`` (scripts) frees it afterwards."""
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    if close:
        plt.close(fig)


# ---- which methods a figure of many shows


def baseline_rows(frame):
    """The rows of the fastest plain decoding, the baseline of every speedup: plain rows (column kind) whose
    speedup is 1 on every row of their method (and temperature, and pair, where the frame has them). All False
    where the frame has no kind or speedup column."""
    if not {"kind", "speedup"} <= set(frame.columns):
        return frame["method"] != frame["method"]
    keys = ["method"] + [c for c in ("temperature", "pair") if c in frame.columns]
    is_one = frame["speedup"].sub(1.0).abs().lt(1e-9)
    return (frame["kind"] == "plain") & is_one.groupby([frame[k] for k in keys]).transform("all")


ROLE_MARKERS = ("s", "o", "^", "D", "X", "v")  # one per role of ``key_methods``, in its order


def role_markers(palette: dict) -> dict:
    """{label: marker} for a ``key_methods`` palette: each role's own marker, so that methods whose points
    coincide (auto at T > 0 may be the EAGLE head's chain) both show."""
    every = list(colours(range(len(ROLE_MARKERS))).values())
    return {label: ROLE_MARKERS[every.index(colour)] for label, colour in palette.items()}


def key_methods(frame, named: bool = True):
    """(the rows of the methods a figure over many methods shows, with their legend label in column ``shown``,
    {label: colour} in the order below), at most ``MAX_METHODS``, those ``frame`` has:

    the fastest plain decoding (``baseline_rows``), the trained draft, n-gram, the EAGLE head's chain, ``auto``
    (the method whose label ends with " (auto)") and transformers' prompt lookup. ``named``: labels say which
    method ("auto: hybrid dynamic tree"); else only the role, for a frame of several runs side by side.
    Each role keeps its colour whichever others are missing."""
    import pandas as pd

    method = frame["method"].astype(str)
    plain = baseline_rows(frame)
    auto = method.str.endswith(AUTO_MARK)
    names = frame.loc[plain, "baseline" if "baseline" in frame.columns else "method"].unique()
    roles = [("fastest plain" + (f": {names[0]}" if named and len(names) == 1 else " decoding"), plain),
             (TRAINED_DRAFT, method == TRAINED_DRAFT),
             (NGRAM, method == NGRAM),
             (f"{EAGLE_CHAIN} (chain)", method == EAGLE_CHAIN),
             ("auto" + (f": {method[auto].iloc[0].removesuffix(AUTO_MARK)}" if named and auto.any() else ""), auto),
             (PROMPT_LOOKUP, method == PROMPT_LOOKUP)]
    every = colours(range(len(ROLE_MARKERS)))
    labels = pd.Series(None, index=frame.index, dtype=object)
    palette = {}
    for i, (label, rows) in enumerate(roles):
        if rows.any():
            labels[rows] = label
            palette[label] = every[i]
    return frame.assign(shown=labels).dropna(subset=["shown"]), palette


# ---- 00: training


def draft_training_loss(log, title=unchanged):
    """00_train_draft: the draft's losses against steps, and its held-out greedy agreement with the target
    (``log``: the training log, one row per evaluation)."""
    import seaborn as sns

    losses = [c for c in ("train_loss", "heldout_hard_ce", "heldout_soft_ce") if c in log.columns]
    frame = log.melt(id_vars="step", value_vars=losses)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    palette = colours(losses)
    sns.lineplot(data=frame, x="step", y="value", hue="variable", palette=palette, ax=axes[0], legend=False)
    axes[0].set(ylabel="cross-entropy")
    set_title(axes[0], title("loss"))
    sns.lineplot(data=log, x="step", y="heldout_agreement", ax=axes[1])
    axes[1].set(ylabel="fraction")
    set_title(axes[1], title("held-out greedy agreement with the target"))
    legend_below(fig, palette, lines=True)
    return fig


def heads_training(log, title=unchanged):
    """00_train_heads: each head's held-out cross-entropy against steps (left) and its held-out greedy
    agreement, per measure (right; at most ``MAX_METHODS`` lines). ``log``: the heads' logs stacked, column
    kind."""
    import seaborn as sns

    measures = [c for c in log.columns if "agreement" in c]
    agree = log.melt(id_vars=["kind", "step"], value_vars=measures, var_name="measure",
                     value_name="agreement").dropna()
    agree["series"] = agree["kind"] + " " + agree["measure"].str.replace("heldout_agreement", "").str.replace(
        "_", " ").str.strip()
    series = list(dict.fromkeys(agree["series"]))[:MAX_METHODS]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4), layout="constrained")
    sns.lineplot(data=log, x="step", y="heldout_ce", hue="kind", marker="o", ax=axes[0])
    axes[0].set(ylabel="nats")
    set_title(axes[0], title("held-out cross-entropy against the target"))
    sns.lineplot(data=agree[agree["series"].isin(series)], x="step", y="agreement", hue="series",
                 hue_order=series, marker="o", ax=axes[1])
    axes[1].set(ylabel="fraction")
    set_title(axes[1], title("held-out greedy agreement (teacher-forced)"))
    legend_beside(axes[0], "head")
    legend_beside(axes[1], "head, measure")
    return fig


# ---- 01: unbiasedness


def unbiasedness_pvalues(curves, level: float, n_tokens: int):
    """01_unbiasedness: per verifier (the correct one and the broken ones), the chi-square p-value and the largest
    deviation from the exact law against the number of samples."""
    import seaborn as sns

    sizes = np.unique(curves["samples"])
    palette = colours(list(dict.fromkeys(curves["verifier"]))[:MAX_METHODS])
    shown = curves[curves["verifier"].isin(palette)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    sns.lineplot(data=shown, x="samples", y="p-value", hue="verifier", palette=palette, marker="o", ax=axes[0],
                 legend=False)
    axes[0].set(xscale="log", yscale="log", ylim=(1e-320, 10))
    axes[0].axhline(level, color="grey", ls="--")
    set_title(axes[0], f"chi-square p-value against sample size (dashed: the test's level, {level})")
    sns.lineplot(data=shown, x="samples", y="max deviation", hue="verifier", palette=palette, marker="o",
                 ax=axes[1], legend=False)
    axes[1].plot(sizes, 1 / np.sqrt(sizes), color="grey", ls=":")
    axes[1].set(xscale="log", yscale="log")
    set_title(axes[1], f"max |empirical - exact| over the law of the first {n_tokens} tokens (dotted: 1/sqrt(N))")
    legend_below(fig, palette, title="verifier", lines=True)
    return fig


# ---- 02: the speedup table


def speedup_heatmap(wide):
    """02_speedup_table: the expected speedup over alpha and gamma, one panel per c (``wide``: columns c, alpha,
    gamma, speedup)."""
    import seaborn as sns

    groups = list(wide.groupby("c"))
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 5), sharey=True, layout="constrained",
                             squeeze=False)
    for ax, (c, frame) in zip(axes[0], groups):
        speedups = frame.pivot(index="alpha", columns="gamma", values="speedup")
        sns.heatmap(speedups, annot=True, fmt=".1f", cmap="viridis", ax=ax, cbar=False, annot_kws={"size": 8})
        ax.tick_params(axis="y", rotation=0)
        set_title(ax, f"expected speedup, c = {c}, v = 1")
    axes[0][0].set_ylim(0, wide["alpha"].nunique())  # the smallest alpha at the bottom (shared by every panel)
    return fig


def break_even(curves):
    """02_speedup_table: the smallest alpha that pays off at the best gamma, against c, one line per verification
    cost (``speedup_tables.break_even_curves``: column v labels each, "v = 1.3")."""
    import seaborn as sns

    palette = colours(dict.fromkeys(curves["v"]))
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    sns.lineplot(data=curves, x="c", y="break-even alpha", hue="v", palette=palette, ax=ax, legend=False)
    ax.set(xlabel="c = draft step / target step")
    set_title(ax, "speculation pays off above the curve (best gamma)")
    legend_below(fig, palette, title="verification cost", lines=True)
    return fig


def predicted_vs_measured_speedup(by_gamma, title=unchanged):
    """02_speedup_table: the real pair's speedup against gamma, measured and predicted (``by_gamma``: column gamma
    and one column per line)."""
    import seaborn as sns

    lines = [c for c in ("measured", "predicted", "predicted (v = 1)", "measured over the fastest plain")
             if c in by_gamma.columns]
    palette = colours(lines)
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    sns.lineplot(data=by_gamma.melt(id_vars="gamma", value_vars=lines), x="gamma", y="value", hue="variable",
                 style="variable", palette=palette, markers=True, ax=ax)
    ax.axhline(1, color="grey", ls="--")
    ax.set(ylabel="speedup over plain decoding")
    set_title(ax, title("real pair, greedy"))
    move_below(fig, ax, columns=2)  # seaborn's entries show each line's dashes and markers (two may coincide)
    return fig


FASTEST_PLAIN = "plain: the fastest at each batch size"  # the baseline's line in ``batch_throughput``


def batch_throughput(table, v_by_batch=None, title=unchanged):
    """02_speedup_table: tokens/s over the whole batch (log axis) against batch size (log2 axis) for the fastest
    plain batched decoding at each batch size (the baseline, dashed; ``batching.by_batch`` names it) and speculative
    decoding with each drafting (left); each drafting's speedup over that baseline, with a line at 1 and, from
    ``v_by_batch`` (``costs.by_batch``), the verification cost v(gamma) by batch on the right axis (right).
    ``table``: ``batching.batch_throughput`` (skipped rows, nan, draw nothing); at most ``MAX_METHODS`` series."""
    fastest = table[(table["kind"] == "plain") & (table["method"] == table["baseline"])]
    series = {FASTEST_PLAIN: fastest} if fastest["tokens_per_second"].notna().any() else {}
    measured = table[(table["kind"] == "speculative") & table["speedup"].notna()]
    room = MAX_METHODS - len(series) - (v_by_batch is not None)
    for method in list(dict.fromkeys(measured["method"]))[:room]:
        series[method] = table[table["method"] == method]
    palette = colours(list(series))
    markers = dict(zip(palette, ROLE_MARKERS))
    sizes = sorted(table["batch"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for method, colour in palette.items():
        rows = series[method].sort_values("batch")
        style = dict(color=colour, marker=markers[method], ls="--" if method == FASTEST_PLAIN else "-")
        axes[0].plot(rows["batch"], rows["tokens_per_second"], **style)
        if method != FASTEST_PLAIN:
            axes[1].plot(rows["batch"], rows["speedup"], **style)
    axes[0].set(ylabel="tokens/s over the whole batch", yscale="log")
    set_title(axes[0], title("throughput against batch size (greedy)"))
    axes[1].axhline(1, color="grey", ls="--")
    axes[1].set(ylabel="speedup over the fastest plain decoding")
    set_title(axes[1], title("speedup against batch size; dotted, right axis: v(gamma)"))
    handles = [Line2D([], [], color=c, marker=markers[m], ls="--" if m == FASTEST_PLAIN else "-")
               for m, c in palette.items()]
    labels = list(palette)
    if v_by_batch is not None:
        column = v_by_batch.columns[1]
        cost = axes[1].twinx()
        cost.plot(v_by_batch["batch"], v_by_batch[column], color="black", ls=":", marker="x")
        cost.set_ylabel(wrapped(column, 30))
        handles.append(Line2D([], [], color="black", ls=":", marker="x"))
        labels.append(f"{column.split(' =')[0]} (right axis)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
        ax.set(xlabel="batch size")
    fig.legend(handles, [wrapped(label, LEGEND_CHARS) for label in labels], loc="outside lower center",
               ncols=min(3, len(labels)), frameon=False)
    return fig


# ---- 03: per task


def task_acceptance(runs, title=unchanged):
    """03_task_acceptance: per task, acceptance alpha and speedup over the fastest plain decoding (means over
    prompts and temperatures) of the methods ``key_methods`` picks (``runs``: ``evaluate.run_prompts`` rows)."""
    import seaborn as sns

    shown, palette = key_methods(runs)
    drafted = shown[shown["alpha"].notna()]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), layout="constrained")
    sns.barplot(data=drafted, x="task", y="alpha", hue="shown", palette=palette,
                hue_order=[m for m in palette if m in set(drafted["shown"])], errorbar=None, saturation=1,
                ax=axes[0])
    set_title(axes[0], title("acceptance alpha by task (all temperatures)"))
    sns.barplot(data=shown, x="task", y="speedup", hue="shown", palette=palette, hue_order=list(palette),
                errorbar=None, saturation=1, ax=axes[1])
    axes[1].axhline(1, color="grey", ls="--")
    set_title(axes[1], title("speedup over the fastest plain decoding (all temperatures)"))
    drop_legends(*axes)
    legend_below(fig, palette)
    return fig


def cost_model(model_table, title=unchanged):
    """03_task_acceptance: the cost model's predicted speedup against the measured one, per (method, task), one
    panel per temperature, for the methods ``key_methods`` picks (``model_table``: ``evaluate.cost_model``)."""
    import seaborn as sns

    shown, palette = key_methods(model_table)
    temperatures = sorted(shown["temperature"].unique()) or [0.0]
    top = max(shown[["predicted speedup", "speedup"]].max().max(), 1.0) * 1.05 if len(shown) else 2.0
    fig, axes = plt.subplots(1, len(temperatures), figsize=(5.5 * len(temperatures), 5), layout="constrained",
                             squeeze=False)
    for ax, t in zip(axes[0], temperatures):
        sns.scatterplot(data=shown[shown["temperature"] == t], x="predicted speedup", y="speedup", hue="shown",
                        palette=palette, style="shown", markers=role_markers(palette), s=60, ax=ax, legend=False)
        ax.plot([0, top], [0, top], color="grey", ls="--")
        ax.set(xlim=(0, top), ylim=(0, top), ylabel="measured speedup")
        set_title(ax, title(f"cost model: predicted against measured, T = {t:g}"))
    legend_below(fig, palette, title="one point per task", markers=role_markers(palette))
    return fig


def drafting_progression(steps, title=unchanged):
    """03_task_acceptance: each step of drafting's progression, before and after, measured and as the cost
    model predicts (``steps``: ``evaluate.progression``)."""
    import seaborn as sns

    frame = steps.assign(step=steps["step"].map(lambda s: wrapped(s, 40)))
    palette = colours(dict.fromkeys(frame["role"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 1 + 0.8 * frame["step"].nunique()), sharey=True,
                             layout="constrained")
    for ax, column in zip(axes, ["speedup (geomean over tasks)", "cost model (geomean over tasks)"]):
        sns.barplot(data=frame, y="step", x=column, hue="role", palette=palette, saturation=1, ax=ax, legend=False)
        ax.axvline(1.0, color="grey", ls="--")
        ax.set(ylabel="")
        set_title(ax, title(column.replace(" (geomean over tasks)", "")))
    legend_below(fig, palette)
    return fig


def acceptance_by_position(by_pos, along, title=unchanged):
    """03_task_acceptance: P(draft i accepted | drafts before it accepted) by draft position (left) and acceptance
    along the output (right), one row of panels per temperature, for the methods ``key_methods`` picks
    (``evaluate.acceptance_by_position_table``, ``evaluate.acceptance_along_output``)."""
    import seaborn as sns

    by_pos, palette = key_methods(by_pos)
    along, _ = key_methods(along)
    temperatures = sorted(set(by_pos["temperature"]) | set(along["temperature"])) or [0.0]
    fig, axes = plt.subplots(len(temperatures), 2, figsize=(12, 3.6 * len(temperatures)), sharex="col",
                             sharey=True, layout="constrained", squeeze=False)
    for row, t in zip(axes, temperatures):
        sns.lineplot(data=by_pos[by_pos["temperature"] == t], x="position", y="acceptance", hue="shown",
                     palette=palette, style="shown", markers=role_markers(palette), dashes=False, ax=row[0],
                     legend=False)
        set_title(row[0], title(f"T = {t:g}: P(draft i accepted | drafts before it accepted)"))
        sns.lineplot(data=along[along["temperature"] == t], x="output position", y="alpha", hue="shown",
                     palette=palette, style="shown", markers=role_markers(palette), dashes=False, errorbar=None,
                     ax=row[1], legend=False)
        set_title(row[1], title(f"T = {t:g}: acceptance along the output (32-token buckets)"))
    legend_below(fig, palette, lines=True, markers=role_markers(palette))
    return fig


# ---- 05: servers


def endpoint_colours(names) -> dict:
    """{endpoint: colour} of the first ``MAX_METHODS`` endpoints, in order."""
    return colours(list(dict.fromkeys(names))[:MAX_METHODS])


def endpoints(records, main, max_tokens: int, title=unchanged):
    """05_endpoints: per task, the end-to-end latency of every request (``records``), the speedup over the plain
    server of the same kind and the acceptance the servers' counters report (``main``: ``endpoints.per_task`` at
    max_tokens, concurrency 1), one colour per endpoint (at most ``MAX_METHODS``)."""
    import seaborn as sns

    palette = endpoint_colours(records["endpoint"])
    records, main = records[records["endpoint"].isin(palette)], main[main["endpoint"].isin(palette)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), layout="constrained")
    with warnings.catch_warnings():  # seaborn 0.13 passes boxplot's vert=, which matplotlib 3.11 deprecates
        warnings.filterwarnings("ignore", "vert: bool", category=DeprecationWarning)
        sns.boxplot(data=records, x="task", y="latency_s", hue="endpoint", palette=palette, saturation=1,
                    ax=axes[0], legend=False)
    set_title(axes[0], title(f"end-to-end latency, {max_tokens} tokens"))
    compared = main[main["endpoint"] != main["baseline"]]
    sns.barplot(data=compared, x="task", y="speedup", hue="endpoint", palette=palette, saturation=1, ax=axes[1],
                legend=False)
    axes[1].axhline(1, color="grey", ls="--")
    set_title(axes[1], title("speedup over the plain server of its kind"))
    counted = main[main["acceptance"].notna()]
    if len(counted):
        sns.barplot(data=counted, x="task", y="acceptance", hue="endpoint", palette=palette, saturation=1,
                    ax=axes[2], legend=False)
        set_title(axes[2], title("acceptance from the server's counters"))
    else:
        set_title(axes[2], "no server reported speculative counters")
    legend_below(fig, palette, columns=4)
    return fig


def endpoints_length_concurrency(table, title=unchanged):
    """05_endpoints: the median speedup over tasks of each speculative endpoint by max_tokens (short and long
    outputs) and by concurrency (``table``: ``endpoints.per_task`` of every part, column part)."""
    import seaborn as sns

    speculative = table[table["endpoint"] != table["baseline"]]
    palette = endpoint_colours(speculative["endpoint"])
    speculative = speculative[speculative["endpoint"].isin(palette)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for ax, by, part in ((axes[0], "max_tokens", "main|short"), (axes[1], "concurrency", "concurrency")):
        rows = speculative[speculative["part"].str.contains(part)]
        sns.pointplot(data=rows, x=by, y="speedup", hue="endpoint", palette=palette, estimator="median",
                      errorbar=None, ax=ax, legend=False)
        ax.axhline(1, color="grey", ls="--")
        set_title(ax, title(f"median speedup over tasks by {by}"))
    legend_below(fig, palette, lines=True)
    return fig


# ---- scripts: the sweep and the GPU check


def sweep_comparison(table):
    """specdec_lite.sweep: alpha, accepted length and speedup (overall medians) per pair, for the methods
    ``key_methods`` picks, named by role (``table``: ``sweep.comparison``)."""
    import seaborn as sns

    overall = table[table["task"].str.startswith("overall")]
    shown, palette = key_methods(overall, named=False)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), layout="constrained")
    for ax, column in zip(axes, ["alpha", "mean_accepted_length", "speedup"]):
        sns.barplot(data=shown, x="pair", y=column, hue="shown", palette=palette, hue_order=list(palette),
                    errorbar=None, saturation=1, ax=ax, legend=False)
        over = " over the fastest plain decoding" if column == "speedup" else ""
        ax.set(xlabel="")
        set_title(ax, f"{column}{over} (median over prompts, all temperatures)")
        ax.tick_params(axis="x", rotation=20)
    axes[2].axhline(1, color="grey", ls="--")
    legend_below(fig, palette)
    return fig


def gpu_check(rows: list[dict], acceptances):
    """specdec_lite.repro.gpu_bench: tokens/s per pair and path (transformers, ours autoregressive, ours
    speculative at each acceptance, with the formula's prediction as a marker). ``rows``: the check's rows
    (dicts: no pandas here)."""
    pairs = list(dict.fromkeys((r["target"], r["draft"]) for r in rows))
    paths = list(dict.fromkeys(r["path"] for r in rows))[:MAX_METHODS - 1]
    palette = colours(paths)
    fig, axes = plt.subplots(1, len(pairs), figsize=(7 * len(pairs), 5), layout="constrained", squeeze=False)
    labels = ["transformers generate", "transformers assisted", "ours autoregressive",
              *(f"ours speculative a={a}" for a in acceptances)]
    for ax, (target, draft) in zip(axes[0], pairs):
        mine = [r for r in rows if (r["target"], r["draft"]) == (target, draft) and r["path"] in palette]
        width = 0.8 / len(mine)
        for i, r in enumerate(mine):
            values = [r["transformers generate tokens/s"], r["transformers assisted tokens/s"],
                      r["ours autoregressive tokens/s"], *(r[f"speculative tokens/s a={a}"] for a in acceptances)]
            xs = [j + i * width for j in range(len(labels))]
            ax.bar(xs, values, width, color=palette[r["path"]])
            predicted = [r["ours autoregressive tokens/s"] * r[f"predicted speedup a={a}"] for a in acceptances]
            ax.scatter(xs[3:], predicted, color="black", marker="_", s=200, zorder=3)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=25, ha="right")
        ax.set(ylabel="tokens/s")
        set_title(ax, f"{target} + {draft} ({mine[0]['device']}, {mine[0]['dtype']})")
    handles = [Patch(facecolor=c) for c in palette.values()]
    handles.append(Line2D([], [], color="black", marker="_", ls="", markersize=14))
    fig.legend(handles, [*palette, "formula's prediction"], loc="outside lower center", ncols=len(handles),
               frameon=False)
    return fig


# ---- the rules, checked on a drawn figure


def legends_of(fig) -> list:
    """Every legend drawn in ``fig``: the figure's own, each axes', and any added as an artist."""
    return [legend for legend in fig.findobj(Legend) if legend.get_visible()]


def _in_view(ax, axis: str) -> list:
    """The tick labels ``ax`` draws on one axis (those of ticks inside its limits, not empty)."""
    ticks, labels, (low, high) = ((ax.get_xticks(), ax.get_xticklabels(), sorted(ax.get_xlim())) if axis == "x"
                                  else (ax.get_yticks(), ax.get_yticklabels(), sorted(ax.get_ylim())))
    return [label for tick, label in zip(ticks, labels) if low <= tick <= high and label.get_text()]


def _overlap(a: Bbox, b: Bbox) -> float:
    """The area (in pixels) that two boxes share."""
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(width, 0) * max(height, 0)


def layout_problems(fig, max_entries: int = MAX_METHODS) -> list[str]:
    """What breaks the rules in ``fig``, drawn as it is, in words (empty: none): a legend with more than
    ``max_entries`` entries, or over any axes' area, a title, an axis label or a tick label, or over another
    legend; a title wider than its axes by a fifth (not wrapped), or over another title or another axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    titles = [ax.title for ax in axes if ax.title.get_text()]
    texts = titles + [t for ax in axes for t in (ax.xaxis.label, ax.yaxis.label, *_in_view(ax, "x"),
                                                  *_in_view(ax, "y")) if t.get_visible() and t.get_text()]
    problems = []
    legends = legends_of(fig)
    for i, legend in enumerate(legends):
        name = f"legend {legend.get_title().get_text() or i}"
        box = legend.get_window_extent(renderer)
        if len(legend.get_texts()) > max_entries:
            problems.append(f"{name} has {len(legend.get_texts())} entries (at most {max_entries})")
        problems += [f"{name} covers the axes titled {ax.get_title()!r}" for ax in axes
                     if _overlap(box, ax.get_window_extent(renderer)) > 1]
        own = set(legend.findobj(Text))
        problems += [f"{name} covers the text {t.get_text()!r}" for t in texts
                     if t not in own and _overlap(box, t.get_window_extent(renderer)) > 1]
        problems += [f"{name} covers another legend" for other in legends[i + 1:]
                     if _overlap(box, other.get_window_extent(renderer)) > 1]
    for ax in axes:
        title = ax.title
        if not title.get_text():
            continue
        box = title.get_window_extent(renderer)
        if box.width > 1.2 * ax.get_window_extent(renderer).width:
            problems.append(f"the title {title.get_text()!r} is wider than its axes (wrap it)")
        problems += [f"the title {title.get_text()!r} covers the title {other.get_text()!r}" for other in titles
                     if other is not title and _overlap(box, other.get_window_extent(renderer)) > 1]
        problems += [f"the title {title.get_text()!r} covers the axes titled {other.get_title()!r}" for other in axes
                     if other is not ax and _overlap(box, other.get_window_extent(renderer)) > 1]
    return problems
