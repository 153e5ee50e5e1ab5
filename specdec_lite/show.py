"""How the package shows things as text: progress bars and markdown tables (the lowest layer: every other one
may use them).

``progress_bar``: one kind of progress bar for every long loop, plain text on stdout. In a terminal and in
JupyterLab it redraws in place (carriage returns). A notebook saved by ``specdec_lite.sweep`` keeps only each
bar's final state, because the sweep has the notebook client merge each cell's stream output and apply the
carriage returns. Text bars (not widgets) also read correctly where a saved notebook is shown without a kernel.
"""
from __future__ import annotations

import math
import sys

import numpy as np


def progress_bar(iterable=None, *, desc: str = "", total: int | None = None, initial: int = 0,
                 disable: bool = False):
    """A tqdm text bar on stdout, redrawn at most once a second."""
    from tqdm.std import tqdm

    return tqdm(iterable, desc=desc, total=total, initial=initial, disable=disable, file=sys.stdout,
                mininterval=1.0, ncols=100)


def to_markdown(df, digits: int = 3) -> str:
    """A GitHub markdown table (no extra dependency)."""
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if math.isnan(v) else f"{v:.{digits}f}"
        return str(v).replace("|", "\\|").replace("\n", " ")
    header = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])
