"""Run the notebooks for several model pairs and put their results side by side.

    python -m specdec_lite.sweep pairs.yaml        (or .json; `make sweep PAIRS=pairs.yaml`)

The pairs file (every key is checked before anything runs)::

    notebooks: [03_task_acceptance]        # which notebooks, in order; an entry may carry its own
                                           # parameters: {00_train_draft: {retrain: true}}
    parameters: {prompts_per_task: 2}      # notebook parameters for every pair (optional)
    out: out/sweeps/my-sweep               # where the comparison goes (default: out/sweeps/<file name>)
    publish: false                         # true: write the shipped results (the shipped pair only)
    pairs:
      - target: meta-llama/Llama-3.1-8B-Instruct   # required: name, Hugging Face id or local folder
        draft: meta-llama/Llama-3.2-1B-Instruct    # required
        heads: auto                                # optional, as the notebooks take it
        device: cuda                               # optional (default cpu)
        dtype: auto                                # optional (default auto)
        run_name: llama-8b-1b                      # optional: the run's folder name
        parameters: {max_new_tokens: 64}           # optional: notebook parameters for this pair only

Each pair is checked first (names, device, dtype, matching tokenizers); a pair that is refused, or a notebook that
fails, is recorded with the reason and the sweep goes on. Each run writes its executed notebooks, CSVs and figures
in its own folder (``out/runs/<run name>/``). A publishing sweep (``publish: true``, ``make reproduce``) runs the
notebooks with ``SPECDEC_PUBLISH=1``, so they write the shipped results, figures and documents, and saves each
executed notebook over the committed one when it ran with the committed parameters (else in the run's folder):
a committed notebook's parameters cell is what ran. The sweep then writes ``status.csv``, and from every run of
``03_task_acceptance`` ``comparison.csv`` and ``comparison.png``: acceptance, mean accepted length, c and speedup
per pair, method and task.

Executed notebooks are saved as JupyterLab saves them (``jupyterlab_form``), with each progress bar's final
state only, so opening one in JupyterLab does not change it.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import paths
from .paths import is_head_dir
from .tokenizers import check_tokenizers
from .repro.notebook import PUBLISH_ENV, SMOKE_ENV, RunPlace, check_parameters, place_run

PAIR_KEYS = {"target", "draft", "heads", "device", "dtype", "run_name", "parameters"}
TOP_KEYS = {"notebooks", "parameters", "pairs", "out", "publish"}
PAIR_PARAMETERS = ("target", "draft", "device", "dtype", "run_name", "heads")  # keys a pair passes to notebooks
KERNEL = "python3"
KERNEL_DISPLAY_NAME = "Python 3 (ipykernel)"  # what JupyterLab writes for this kernel


@dataclass
class Pair:
    target: str
    draft: str
    heads: str = "auto"
    device: str = "cpu"
    dtype: str = "auto"
    run_name: str = ""
    parameters: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.run_name or f"{Path(self.target).name} / {Path(self.draft).name}"


@dataclass
class Sweep:
    notebooks: list  # [(name, parameters of that notebook)]
    parameters: dict  # for every pair
    pairs: list  # [Pair]
    out: Path
    publish: bool = False  # the runs write the shipped results (SPECDEC_PUBLISH=1)


def notebook_path(name: str) -> Path:
    return paths.repo_root() / "notebooks" / f"{Path(name).stem}.ipynb"


def declared_parameters(name: str) -> set:
    """The parameters a notebook declares in its parameters cell."""
    import papermill

    return set(papermill.inspect_notebook(str(notebook_path(name))))


def read_sweep(path: str | Path) -> Sweep:
    """Read and check a pairs file (YAML or JSON): a missing or unknown key, an unknown notebook, or a parameter no
    chosen notebook declares is refused before anything runs."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no sweep file at {path}: give a YAML or JSON file (see python -m specdec_lite.sweep -h)")
    raw = (json.loads if path.suffix == ".json" else yaml.safe_load)(path.read_text())
    where = f"sweep file {path}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: the top level must be a mapping with keys {sorted(TOP_KEYS)}")
    check_keys(raw, TOP_KEYS, {"pairs"}, where)
    notebooks = [entry if isinstance(entry, dict) else {entry: {}} for entry in raw.get("notebooks", ["03_task_acceptance"])]
    notebooks = [(str(name), dict(params or {})) for entry in notebooks for name, params in entry.items()]
    for name, _ in notebooks:
        if not notebook_path(name).is_file():
            known = sorted(p.stem for p in (paths.repo_root() / "notebooks").glob("[0-9]*.ipynb"))
            raise ValueError(f"{where}: no notebook {name!r}; choose from {known}")
    if not isinstance(raw["pairs"], list) or not raw["pairs"]:
        raise ValueError(f"{where}: 'pairs' must be a non-empty list of mappings with 'target' and 'draft'")
    pairs = []
    for i, entry in enumerate(raw["pairs"], 1):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: pair {i} must be a mapping with keys 'target' and 'draft'")
        check_keys(entry, PAIR_KEYS, {"target", "draft"}, f"{where}, pair {i}")
        pairs.append(Pair(**{k: pair_value(k, v) for k, v in entry.items()}))
    declared = set().union(*(declared_parameters(name) for name, _ in notebooks))
    given = [("parameters", raw.get("parameters") or {})] + [(f"notebooks: {n}", p) for n, p in notebooks] + \
            [(f"pair {i} parameters", p.parameters) for i, p in enumerate(pairs, 1)]
    for place, params in given:
        unknown = sorted(set(params) - declared)
        if unknown:
            raise ValueError(f"{where}, {place}: unknown notebook parameters {unknown}; the chosen notebooks take "
                             f"{sorted(declared)}")
    if not isinstance(raw.get("publish", False), bool):
        raise ValueError(f"{where}: 'publish' must be true or false")
    out = Path(raw.get("out") or paths.repo_root() / "out" / "sweeps" / path.stem)
    return Sweep(notebooks=notebooks, parameters=dict(raw.get("parameters") or {}), pairs=pairs, out=out,
                 publish=raw.get("publish", False))


def pair_value(key: str, value):
    """A pair's value as the notebooks take it: parameters a dict, heads a comma-separated string, else a string."""
    if key == "parameters":
        return dict(value or {})
    if key == "heads" and isinstance(value, list):
        return ",".join(map(str, value))
    return "" if value is None else str(value)


def check_keys(mapping: dict, allowed: set, required: set, where: str) -> None:
    unknown, missing = sorted(set(mapping) - allowed), sorted(required - set(mapping))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")


def check_pair(pair: Pair, smoke: bool = False, publish: bool = False) -> RunPlace:
    """Refuse a pair before its notebooks start (names, device, dtype, publishing, the draft's tokenizer), with the
    notebooks' own checks; returns where its run writes, by the notebooks' own rule."""
    from transformers import AutoTokenizer

    from .names import resolve_name

    device, dtype = check_parameters(pair.target, pair.draft, pair.device, pair.dtype)
    place = place_run(pair.target, pair.draft, device, dtype, pair.run_name, smoke, publish)
    if pair.draft in ("n-gram", "layer-skip") or is_head_dir(Path(resolve_name(pair.draft))):
        return place  # drafts without a tokenizer of their own
    check_tokenizers(AutoTokenizer.from_pretrained(resolve_name(pair.target)),
                     AutoTokenizer.from_pretrained(resolve_name(pair.draft)))
    return place


def executed_path(name: str, place: RunPlace, changed: dict) -> Path:
    """Where an executed notebook is saved: over the committed one for a publishing run with the committed
    parameters (``changed`` empty), so that a committed notebook shows what ran; else in the run's folder."""
    if place.published and not changed:
        return notebook_path(name)
    folder = paths.repo_root() / "out" / "runs" / place.name if place.published else place.folder
    return folder / f"{Path(name).stem}.ipynb"


def run_notebook(name: str, output: Path, parameters: dict, publish: bool = False) -> None:
    """Execute one notebook with papermill (in ``notebooks/``), publishing or not (``SPECDEC_PUBLISH``), with the
    parameters that differ from its defaults; then save it as JupyterLab would."""
    import papermill

    output.parent.mkdir(parents=True, exist_ok=True)
    changed = changed_parameters(name, parameters)
    try:
        with environment(PUBLISH_ENV, "1" if publish else "0"):  # the kernel inherits it
            papermill.execute_notebook(str(notebook_path(name)), str(output), kernel_name=KERNEL,
                                       progress_bar=False, parameters=changed,
                                       cwd=str(paths.repo_root() / "notebooks"), coalesce_streams=True)
    finally:
        if output.exists():
            output.write_text(jupyterlab_form(portable_metadata(output.read_text(), changed)))


@contextmanager
def environment(name: str, value: str):
    """``name=value`` in this process's environment (and its kernels') for the ``with`` block."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def changed_parameters(name: str, parameters: dict) -> dict:
    """The parameters the notebook declares whose values differ from its defaults: what papermill injects."""
    import ast

    import papermill

    defaults = papermill.inspect_notebook(str(notebook_path(name)))
    changed = {}
    for key, value in parameters.items():
        if key not in defaults:
            continue
        try:
            same = ast.literal_eval(defaults[key]["default"]) == value
        except (ValueError, SyntaxError):
            same = False
        if not same:
            changed[key] = value
    return changed


def portable_metadata(text: str, injected: dict) -> str:
    """papermill records the input and output paths as given (absolute here): make them relative to the
    repository, so a saved notebook carries no machine's paths; and record the parameters this run injected
    (papermill keeps an earlier run's record when it injects none)."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    record = nb.metadata.get("papermill", {})
    record["parameters"] = dict(injected)
    root = paths.repo_root()
    for key in ("input_path", "output_path"):
        if record.get(key) and Path(record[key]).is_absolute() and Path(record[key]).is_relative_to(root):
            record[key] = str(Path(record[key]).relative_to(root))
    return nbformat.writes(nb)


def jupyterlab_form(text: str) -> str:
    """A notebook's text as JupyterLab saves it: nbformat 4 JSON (sorted keys, one-space indent, a final newline),
    with the kernel's display name as JupyterLab writes it."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    spec = nb.metadata.get("kernelspec")
    if spec and spec.get("name") == KERNEL:
        spec["display_name"] = KERNEL_DISPLAY_NAME
    return nbformat.writes(nb) + "\n"


def run_sweep(sweep: Sweep, log=print) -> list[dict]:
    """Every pair, every notebook; one status row per (pair, notebook). Never stops at a failing pair."""
    from papermill.exceptions import PapermillExecutionError

    smoke = bool(sweep.parameters.get("smoke")) or os.environ.get(SMOKE_ENV) == "1"
    status = []
    for i, pair in enumerate(sweep.pairs, 1):
        head = f"[pair {i}/{len(sweep.pairs)}] {pair.label}"
        try:
            place = check_pair(pair, smoke or bool(pair.parameters.get("smoke")), sweep.publish)
        except (ValueError, FileNotFoundError, OSError) as err:
            log(f"{head}: refused: {err}")
            status += [row(pair, name, "refused", str(err), None) for name, _ in sweep.notebooks]
            continue
        for name, nb_params in sweep.notebooks:
            params = {k: getattr(pair, k) for k in PAIR_PARAMETERS} | sweep.parameters | nb_params | pair.parameters
            output = executed_path(name, place, changed_parameters(name, params))
            log(f"{head}: {name} ...")
            start = time.perf_counter()
            try:
                run_notebook(name, output, params, place.published)
                outcome, reason = "ok", ""
            except PapermillExecutionError as err:
                outcome, reason = "failed", f"{err.ename}: {err.evalue}"
            seconds = time.perf_counter() - start
            log(f"{head}: {name} {outcome} ({seconds:.0f} s){': ' + reason if reason else ''}")
            status.append(row(pair, name, outcome, reason, seconds, output.parent, place.results))
    return status


def row(pair: Pair, notebook: str, outcome: str, reason: str, seconds, folder: Path | None = None,
        results: Path | None = None) -> dict:
    """One status row: the pair, the notebook, how it ended, and where the executed notebook and CSVs went."""
    return {"pair": pair.label, "target": pair.target, "draft": pair.draft, "device": pair.device,
            "dtype": pair.dtype, "notebook": notebook, "status": outcome, "reason": reason,
            "seconds": None if seconds is None else round(seconds, 1), "folder": str(folder or ""),
            "results": str(results or "")}


def comparison(status: list[dict]):
    """One table over the pairs: every run's task_acceptance_summary.csv (03), with its pair label. speedup is over
    the fastest plain decoding of that pair's run (named in baseline), speedup_same_config over ours plain in the
    run's own configuration."""
    import pandas as pd

    cols = ["pair", "method", "kind", "task", "temperature", "alpha", "mean_accepted_length", "c", "speedup",
            "baseline", "speedup_same_config", "dtype"]
    frames = [pd.read_csv(Path(r["results"]) / "task_acceptance_summary.csv").assign(pair=r["pair"])
              for r in status if r["notebook"].startswith("03") and r["status"] == "ok"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def comparison_figure(table, path: Path) -> None:
    """comparison.png: ``figures.sweep_comparison`` of the comparison table."""
    import matplotlib
    matplotlib.use("Agg")

    from .repro import figures

    figures.save(figures.sweep_comparison(table), path, dpi=110, close=True)


def write_outputs(sweep: Sweep, status: list[dict]) -> dict:
    """status.csv, comparison.csv and comparison.png in the sweep's folder; returns their paths."""
    import pandas as pd

    sweep.out.mkdir(parents=True, exist_ok=True)
    written = {"status": sweep.out / "status.csv"}
    pd.DataFrame(status).to_csv(written["status"], index=False)
    table = comparison(status)
    if len(table):
        written["comparison"] = sweep.out / "comparison.csv"
        table.to_csv(written["comparison"], index=False)
        written["figure"] = sweep.out / "comparison.png"
        comparison_figure(table, written["figure"])
    return written


def main(argv=None):
    """python -m specdec_lite.sweep: run chosen notebooks for each model pair of a YAML/JSON file, then compare."""
    parser = argparse.ArgumentParser(description=main.__doc__, epilog=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs_file", help="YAML or JSON file: notebooks, parameters, pairs (see above)")
    args = parser.parse_args(argv)
    sweep = read_sweep(args.pairs_file)
    status = run_sweep(sweep)
    written = write_outputs(sweep, status)
    if "comparison" in written:
        import pandas as pd

        from .show import to_markdown

        table = pd.read_csv(written["comparison"])
        print(to_markdown(table[table.task.str.startswith("overall")].round(3)))
    print("\n".join(f"wrote {p}" for p in written.values()))
    failed = [r for r in status if r["status"] != "ok"]
    if failed:
        print(f"{len(failed)} of {len(status)} notebook runs did not finish: see {written['status']}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
