"""One kind of progress bar for every long loop of the package: plain text on stdout.

In a terminal and in JupyterLab it redraws in place (carriage returns). A notebook saved by
``specdec_lite.sweep`` keeps only each bar's final state, because the sweep has the notebook client merge each
cell's stream output and apply the carriage returns. Text bars (not widgets) also read correctly where a saved
notebook is shown without a kernel.
"""
from __future__ import annotations

import sys


def progress_bar(iterable=None, *, desc: str = "", total: int | None = None, initial: int = 0,
                 disable: bool = False):
    """A tqdm text bar on stdout, redrawn at most once a second."""
    from tqdm.std import tqdm

    return tqdm(iterable, desc=desc, total=total, initial=initial, disable=disable, file=sys.stdout,
                mininterval=1.0, ncols=100)
