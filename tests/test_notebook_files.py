"""The committed notebooks as a JupyterLab user meets them: saved in JupyterLab's own form (opening one changes
nothing), no machine paths or warnings in their outputs, progress bars in their final state only, parameters
with types and help that are what ran (no injected cell), safe defaults, what each shows, costs and writes at
its top, short lines, output checks as cell tags, and first cells that run through the notebooks' kernel spec."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specdec_lite import paths, sweep

NOTEBOOKS = sorted((paths.repo_root() / "notebooks").glob("[0-9]*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
ABSOLUTE = re.compile(r"(?<![\w.~])/(?:home|root|tmp|work|Users|usr|opt|var)/|site-packages|[A-Z]:\\\\")


def outputs(nb: dict):
    for cell in nb["cells"]:
        yield from cell.get("outputs", [])


def output_text(output: dict) -> str:
    text = output.get("text") or "".join(output.get("data", {}).get("text/plain", "")) or output.get("evalue", "")
    return "".join(text) if isinstance(text, list) else str(text)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebooks_are_saved_as_jupyterlab_saves_them(path):
    text = path.read_text()
    assert text == sweep.jupyterlab_form(text), f"{path.name}: rerun it with python -m specdec_lite.sweep"
    assert json.loads(text)["metadata"]["kernelspec"]["display_name"] == sweep.KERNEL_DISPLAY_NAME


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_outputs_carry_no_machine_path_warning_or_progress_noise(path):
    nb = json.loads(path.read_text())
    assert not ABSOLUTE.search(json.dumps(nb["metadata"])), "absolute path in the notebook's metadata"
    for output in outputs(nb):
        text = output_text(output)
        assert not ABSOLUTE.search(text), (path.name, text[:300])
        assert "Warning" not in text, (path.name, text[:300])
        assert output.get("name") != "stderr", (path.name, text[:300])
        assert "\r" not in text, (path.name, "a progress bar's intermediate states were kept")
        assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {}), path.name
    streams = [o for cell in nb["cells"] for o in cell.get("outputs", []) if o["output_type"] == "stream"]
    assert len(streams) <= 2 * len(nb["cells"]), "stream outputs were not merged per cell"


def test_the_output_check_catches_what_it_must():
    """The patterns above find what they are for (a check that cannot fail is no check)."""
    assert ABSOLUTE.search("/work/main/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning")
    assert ABSOLUTE.search("wrote /home/user/x.csv") and not ABSOLUTE.search("wrote out/runs/x/results")
    assert not ABSOLUTE.search("~/.cache/specdec_lite/features") and not ABSOLUTE.search("data/results/claims.csv")
    messy = json.dumps({"cells": [], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
                        "nbformat": 4, "nbformat_minor": 5})
    assert sweep.jupyterlab_form(messy) != messy and '"display_name": "Python 3 (ipykernel)"' in sweep.jupyterlab_form(messy)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_papermill_help_shows_every_parameter_with_its_type_and_help(path):
    out = subprocess.run([str(Path(sys.executable).parent / "papermill"), "--help-notebook", str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "Unknown type" not in out
    lines = out.splitlines()
    found = {}
    for i, line in enumerate(lines):
        match = re.match(r"\s{2}(\w+): (\w+) \(default .*\)(.*)$", line)
        if match:  # the help follows on the same line, or on the next one when the default is long
            help_text = match.group(3).strip() or lines[i + 1].strip()
            found[match.group(1)] = (match.group(2), help_text)
    assert len(found) >= 7, out
    for name, (type_name, help_text) in found.items():
        assert type_name in ("str", "int", "float", "bool", "list") and help_text and ":" not in help_text[:1], name
    assert {"target", "device", "dtype", "run_name", "smoke", "publish"} <= set(found), (path.name, sorted(found))
    assert ("seed" in found) == (path.stem != "04_claims"), "seed where something is sampled, nowhere else"
    assert found["dtype"][0] == "str" and found["smoke"][0] == "bool"


def parameters_of(path: Path) -> dict:
    import papermill

    return {name: p["default"] for name, p in papermill.inspect_notebook(str(path)).items()}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_a_notebook_shows_what_ran_and_its_defaults_are_safe(path):
    """No papermill cell overrides the parameters cell (the committed notebooks are `make reproduce` runs with
    their shown defaults); a Run All neither publishes nor retrains."""
    nb = json.loads(path.read_text())
    assert not [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])], path.name
    assert nb["metadata"]["papermill"]["parameters"] == {}, "the papermill record names parameters that did not run"
    defaults = parameters_of(path)
    assert defaults["publish"] == "False" and defaults["smoke"] == "False"
    assert defaults.get("retrain", "False") == "False"


def test_make_reproduce_runs_the_notebooks_as_committed():
    for name in ("reproduce", "drafts"):
        assert sweep.read_sweep(paths.repo_root() / "notebooks" / f"{name}.yaml").publish, name
    plan = sweep.read_sweep(paths.repo_root() / "notebooks" / "reproduce.yaml")
    order = [n for n, _ in plan.notebooks]
    assert sorted(order) == IDS and order[-1] == "04_claims", order  # 04_claims gathers every notebook's verdicts
    [pair] = plan.pairs
    for name, params in plan.notebooks:
        given = {k: getattr(pair, k) for k in sweep.PAIR_PARAMETERS} | plan.parameters | params | pair.parameters
        assert sweep.changed_parameters(name, given) == {}, name  # so they are executed over the committed ones


def test_the_training_defaults_are_those_of_the_shipped_checkpoints():
    draft = parameters_of(paths.repo_root() / "notebooks" / "00_train_draft.ipynb")
    heads = parameters_of(paths.repo_root() / "notebooks" / "00_train_heads.ipynb")
    logs = {name: json.loads((paths.drafts_dir() / name / "training_log.jsonl").read_text().splitlines()[-1])
            for name in ("smollm2-135m-draft", "smollm2-135m-medusa")}
    assert int(draft["steps"]) == logs["smollm2-135m-draft"]["step"]
    assert int(heads["medusa_steps"]) == logs["smollm2-135m-medusa"]["step"]
    # the first EAGLE head is no longer shipped: its recipe is the one data/results/heads.csv records
    first = pd.read_csv(paths.results_dir() / "heads.csv").set_index("name").loc["smollm2-135m-eagle"]
    assert int(heads["eagle_steps"]) == first["steps"] and ast.literal_eval(heads["kinds"]) == ["medusa"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_each_notebook_opens_with_what_it_shows_costs_and_writes(path):
    top = "".join(json.loads(path.read_text())["cells"][0]["source"])
    shows, costs, writes = (re.search(rf"^- \*\*{word}[:*]", top, re.M) for word in ("Shows", "Costs", "Writes"))
    assert shows and costs and writes, top[:400]
    cost = top[costs.start():writes.start()]
    assert re.search(r"[\d,]+ s .*in full", cost) and re.search(r"[\d,]+ s in smoke mode", cost), cost
    assert "out/runs/" in top and "publish = True" in top


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_cells_are_short_lines_with_output_checks_as_tags(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        assert "NBVAL" not in source, "an nbval marker as a comment: use the cell tag (nbval-check-output, ...)"
        long = [line for line in source.splitlines() if len(line) > 100]
        assert not long, (path.name, long)
        if "display(" in source:  # IPython's display is imported where it is used, not taken as a builtin
            assert any("from IPython.display import display" in "".join(c["source"]) for c in nb["cells"])
    tags = {t for c in nb["cells"] for t in c["metadata"].get("tags", [])}
    assert tags <= {"parameters", "nbval-check-output", "nbval-ignore-output"}, tags


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_first_cells_run_through_the_notebooks_kernel_spec(path, tmp_path):
    """What JupyterLab does on opening: start the kernel the notebook names (the one `make lab` registers) and
    run the first cells: parameters, imports and set-up (smoke, so nothing is written over the shipped files)."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    spec = KernelSpecManager().get_kernel_spec(nb.metadata.kernelspec.name)
    assert spec.display_name == nb.metadata.kernelspec.display_name
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = code[: next(i for i, c in enumerate(code) if "run = setup(" in c.source) + 1]  # up to the set-up cell
    nb.cells = [nbformat.v4.new_code_cell("import os; os.environ['SPECDEC_SMOKE'] = '1'"), *first]
    NotebookClient(nb, kernel_name=nb.metadata.kernelspec.name, timeout=300,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = "".join(output_text(o) for o in outputs(nb))
    assert "smoke: True" in printed and "writes to out/smoke/" in printed, printed
