"""Notebook cells can be run again, in any order: a claim cell run again replaces its row (one row per check,
the last one wins) and the set-up cell run again keeps the rows, so the claims table and its CSV stay those of
one clean run. Executed here as JupyterLab would, with some cells repeated (smoke mode)."""
import copy

import nbformat
import pytest
from nbclient import NotebookClient

from specdec_lite import paths

NOTEBOOK = paths.repo_root() / "notebooks" / "01_unbiasedness.ipynb"
SMOKE = "import os\nos.environ['SPECDEC_SMOKE'] = '1'\nos.environ['SPECDEC_PUBLISH'] = '0'"
SHOW_CSV = "print(open(run.results / 'claims_01_unbiasedness.csv').read())"


def cell_with(cells, text: str):
    [found] = [c for c in cells if text in c.source]
    return found


@pytest.mark.slow
def test_cells_run_again_leave_the_claims_of_one_clean_run():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    again = [cell_with(code, "run = setup("), cell_with(code, "c4_round_bounds"), cell_with(code, "c17_truncation"),
             cell_with(code, "c4_round_bounds"), code[-1]]
    show = nbformat.v4.new_code_cell(SHOW_CSV)
    nb.cells = [nbformat.v4.new_code_cell(SMOKE), *code, show, *map(copy.deepcopy, [*again, show])]
    NotebookClient(nb, kernel_name=nb.metadata.kernelspec.name, timeout=600,
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    clean, rerun = ("".join(o.get("text", "") for o in c.outputs) for c in nb.cells if c.source == SHOW_CSV)
    assert rerun == clean, (clean, rerun)
    rows = [line.split(",")[:2] for line in clean.strip().splitlines()[1:]]
    assert [claim for claim, _ in rows] == ["C1", "C2", "C3", "C4", "C16", "C17", "C22", "C1"], clean
    assert "C4" in "".join(o.get("data", {}).get("text/plain", "") for o in nb.cells[-2].outputs)
