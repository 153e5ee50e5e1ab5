"""What every notebook does first: check its parameters, decide smoke mode, and pick its output folder.

``run = setup(smoke, target, draft, device, dtype)`` checks the pair's names, the device and the dtype before any
work, and decides where the run writes:

- the embedded default run (the embedded pair in the CPU's "auto" dtype, full size) writes the shipped ``figures/``
  and ``data/results/`` that the README and ``docs/RESULTS.md`` show;
- any other run writes under ``out/runs/<run name>/`` (``figures/``, ``results/``), and a smoke run
  (``smoke=True``, or ``SPECDEC_SMOKE=1``, which ``make test`` sets for nbval) under ``out/smoke/<run name>/``.

The run name comes from the pair and the dtype unless ``run_name`` is given.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import paths
from ..core.models import (EMBEDDED_DRAFT, EMBEDDED_TARGET, auto_dtype, check_model_name, dtype_name, resolve_device,
                           resolve_dtype)
from ..drafts.loading import check_draft_name

SMOKE_ENV = "SPECDEC_SMOKE"
DEFAULT_DTYPE = auto_dtype(torch.device("cpu"))  # the dtype of the shipped results: the CPU's "auto"


@dataclass(frozen=True)
class NotebookRun:
    root: Path  # the repository checkout
    smoke: bool  # small, fast settings for CI
    name: str  # the run's name: its folder under out/runs (or out/smoke)
    default: bool  # the embedded default run: it writes the shipped figures and results
    folder: Path  # where this run writes (executed notebooks go here too, except the default run's)
    figures: Path  # where this run's figures go
    results: Path  # where this run's CSVs go
    target: str
    draft: str
    device: torch.device
    dtype: torch.dtype  # resolved from the notebook's dtype parameter ("auto" by default)

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

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

    def title(self, text: str) -> str:
        """A figure title that says which dtype (and, outside the default run, which pair) it was measured in."""
        pair = "" if self.default else f", {short_name(self.target)} / {short_name(self.draft)}"
        return f"{text} ({self.dtype_name}{pair})"

    @property
    def context(self) -> dict:
        """What every CSV row of this run records: the pair and the dtype."""
        return {"target": self.target, "draft": self.draft, "dtype": self.dtype_name}

    def save_csv(self, frame, filename: str) -> Path:
        """Write ``frame`` to this run's results with the pair and dtype on every row; returns the path."""
        path = self.results / filename
        frame.assign(**self.context).to_csv(path, index=False)
        return path


def short_name(name_or_path: str) -> str:
    """The last part of a name, id or path, as file names allow: 'Llama-3.2-1B' for 'meta-llama/Llama-3.2-1B'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(name_or_path).rstrip("/")).name) or "model"


def run_name_for(target: str, draft: str, dtype: torch.dtype) -> str:
    """The default name of a run: target, draft and dtype ('tiny-llama--tiny-draft--float32')."""
    return f"{short_name(target)}--{short_name(draft)}--{dtype_name(dtype)}"


def is_default_run(target: str, draft: str, device: torch.device, dtype: torch.dtype, run_name: str = "") -> bool:
    """The embedded pair on the CPU in its "auto" dtype (``DEFAULT_DTYPE``), under no other name: the run behind the
    shipped results."""
    return (target, draft, device.type, dtype, run_name) == (EMBEDDED_TARGET, EMBEDDED_DRAFT, "cpu", DEFAULT_DTYPE, "")


def check_parameters(target: str, draft: str, device: str, dtype: str,
                     check_draft: bool = True) -> tuple[torch.device, torch.dtype]:
    """A clear error, before any work, for a name that cannot be loaded, a device that is not there or a dtype it
    cannot run; returns the resolved device and dtype. The notebooks (``setup``) and the sweep both check here."""
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    check_model_name(target)
    if check_draft:
        check_draft_name(draft)
    return device, dtype


@dataclass(frozen=True)
class RunPlace:
    name: str  # the run's name
    default: bool  # the embedded default run (full size): it writes the shipped figures and results
    folder: Path  # the run's folder (the repository itself for the default run)
    figures: Path
    results: Path


def place_run(target: str, draft: str, device: torch.device, dtype: torch.dtype, run_name: str = "",
              smoke: bool = False) -> RunPlace:
    """Where a run writes: the shipped folders for the embedded default run, else ``out/runs/<name>/`` (smoke:
    ``out/smoke/<name>/``), the name from the pair and dtype unless ``run_name`` is given."""
    root = paths.repo_root()
    name = run_name or run_name_for(target, draft, dtype)
    if not smoke and is_default_run(target, draft, device, dtype, run_name):
        return RunPlace(name, True, root, paths.figures_dir(), paths.results_dir())
    folder = root / "out" / ("smoke" if smoke else "runs") / name
    return RunPlace(name, False, folder, folder / "figures", folder / "results")


def setup(smoke: bool = False, target: str = EMBEDDED_TARGET, draft: str = EMBEDDED_DRAFT, device: str = "cpu",
          dtype: str = "auto", run_name: str = "", check_draft: bool = True) -> NotebookRun:
    """Check the notebook's parameters (names, device, dtype: a clear error before any work), then create and
    return its output folders. ``check_draft=False`` for notebooks whose ``draft`` is a name to write."""
    smoke = bool(smoke) or os.environ.get(SMOKE_ENV) == "1"
    device, dtype = check_parameters(target, draft, device, dtype, check_draft)
    place = place_run(target, draft, device, dtype, run_name, smoke)
    run = NotebookRun(root=paths.repo_root(), smoke=smoke, name=place.name, default=place.default,
                      folder=place.folder, figures=place.figures, results=place.results, target=target, draft=draft,
                      device=device, dtype=dtype)
    run.figures.mkdir(parents=True, exist_ok=True)
    run.results.mkdir(parents=True, exist_ok=True)
    print(f"smoke: {smoke} | {run.dtype_name} on {device.type} | writes to {run.shown(run.results)} and "
          f"{run.shown(run.figures)}")
    return run
