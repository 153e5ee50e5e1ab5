"""What every notebook does first: find the repository, decide smoke mode, and pick its output folders.

``run = setup(smoke)`` replaces the set-up cell each notebook used to carry. Smoke runs (``smoke=True`` or the
environment variable ``SPECDEC_SMOKE=1``, which ``make test`` sets for nbval) write under ``out/smoke/``, never
over the shipped figures and results.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import paths

SMOKE_ENV = "SPECDEC_SMOKE"


@dataclass(frozen=True)
class NotebookRun:
    root: Path  # the repository checkout
    smoke: bool  # small, fast settings for CI
    figures: Path  # where this run's figures go
    results: Path  # where this run's CSVs go

    def path(self, relative_or_absolute: str | Path) -> Path:
        """A notebook parameter's path: absolute as given, else relative to the repository root."""
        path = Path(relative_or_absolute).expanduser()
        return path if path.is_absolute() else self.root / path

    def shown(self, path: str | Path) -> str:
        """``path`` as a notebook prints it: relative to the repository root, or to the home folder (``~/``), so
        that committed outputs carry no machine's absolute paths; any other path as it is."""
        path = Path(path)
        for base, prefix in ((self.root, ""), (Path.home(), "~/")):
            if path.is_relative_to(base):
                return prefix + str(path.relative_to(base))
        return str(path)

    def pick(self, full, smoke):
        """``smoke`` in a smoke run, ``full`` otherwise."""
        return smoke if self.smoke else full


def setup(smoke: bool = False) -> NotebookRun:
    """The run's settings; creates its output folders and says whether it is a smoke run."""
    smoke = bool(smoke) or os.environ.get(SMOKE_ENV) == "1"
    root = paths.repo_root()
    base = root / "out" / "smoke" if smoke else None
    run = NotebookRun(root=root, smoke=smoke,
                      figures=base / "figures" if smoke else paths.figures_dir(),
                      results=base / "results" if smoke else paths.results_dir())
    run.figures.mkdir(parents=True, exist_ok=True)
    run.results.mkdir(parents=True, exist_ok=True)
    print("smoke:", smoke)
    return run
