"""What every notebook does first: check its parameters, decide smoke mode, and pick its output folder.

``run = setup(smoke, target, draft, device, dtype, run_name, publish=publish)`` checks the pair's names, the
device and the dtype before any work, and decides where the run writes:

- a run as JupyterLab or papermill starts it writes under ``out/runs/<run name>/`` (``figures/``,
  ``results/``, ``drafts/``), and a smoke run (``smoke=True``, or ``SPECDEC_SMOKE=1``, which ``make test``
  sets for nbval) under ``out/smoke/<run name>/``;
- a publishing run (``publish=True``, or ``SPECDEC_PUBLISH=1``, which ``make reproduce`` sets) writes the
  shipped ``figures/``, ``data/results/``, ``docs/`` and ``data/drafts/``: only the pair the repository
  ships (the embedded target with its draft or its heads) on the CPU, never in smoke mode.

The run name comes from the pair and the dtype unless ``run_name`` is given. Nothing here reads the machine
until ``setup`` is called.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import paths
from ..names import EMBEDDED_DRAFT, EMBEDDED_MEDUSA, EMBEDDED_TARGET, check_model_name
from ..tuning.devices import dtype_name, resolve_device, resolve_dtype
from ..drafts.loading import check_draft_name

SMOKE_ENV = "SPECDEC_SMOKE"
PUBLISH_ENV = "SPECDEC_PUBLISH"
SHIPPED_HEADS_PREFIX = EMBEDDED_MEDUSA.removesuffix("-medusa")  # 00_train_heads' name_prefix of the shipped heads
SHIPPED_DRAFTS = (EMBEDDED_DRAFT, SHIPPED_HEADS_PREFIX)  # what a publishing run may name as its draft


@dataclass(frozen=True)
class NotebookRun:
    root: Path  # the repository checkout
    smoke: bool  # small, fast settings for CI
    name: str  # the run's name: its folder under out/runs (or out/smoke)
    published: bool  # a publishing run: it writes the shipped figures, results, documents and checkpoints
    folder: Path  # where this run writes (the repository itself for a publishing run)
    figures: Path  # where this run's figures go
    results: Path  # where this run's CSVs go
    drafts: Path  # where this run's trained checkpoints go
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
        """``smoke`` in a smoke run, ``full`` otherwise (for settings that are not parameters: see ``scale``)."""
        return smoke if self.smoke else full

    def scale(self, **parameters) -> tuple:
        """The values in use of parameters a smoke run makes smaller, given as ``name=(value, smoke value)``, in
        order; a smoke run prints each replacement beside the value the parameters cell shows."""
        if self.smoke:
            print("smoke replaces " + ", ".join(f"{name} = {value!r} by {small!r}"
                                                for name, (value, small) in parameters.items()))
        return tuple(small if self.smoke else value for value, small in parameters.values())

    def plain_candidates(self, target) -> dict:
        """The plain configurations timed beside ``target`` as baseline candidates: every one
        (``baseline.plain_candidates``) in a full run; in a smoke run none, so the target's own plain decoding is
        the baseline, which it prints. Notebook 03, the benchmark, times every candidate in smoke runs too, so that
        CI runs each of them once."""
        if self.smoke:
            print("smoke: the baseline is the target's own plain decoding (a full run times every plain configuration)")
            return {}
        from .baseline import plain_candidates

        return plain_candidates(target)

    def where(self) -> str:
        """Where this run writes, in words (``setup`` prints it)."""
        if self.published:
            return "writes the shipped files: figures/, data/results/, docs/, data/drafts/"
        hint = " (publish = True: the shipped ones)" if is_shipped_pair(self.target, self.draft) and not self.smoke \
            else ""
        return f"writes to {self.shown(self.folder)}/ (results/, figures/){hint}"

    def document(self, relative: str | Path) -> Path:
        """Where this run writes a document the repository keeps at ``relative`` (``docs/RESULTS.md``): there
        when publishing, else in its own folder."""
        return self.root / relative if self.published else self.folder / Path(relative).name

    def claim_sheet(self, notebook: str):
        """The notebook's ``claims.ClaimSheet`` for this run: one row per check, the same sheet each time."""
        from .claims import claim_sheet

        return claim_sheet(notebook, self.results, self.context)

    def checkpoints(self, names, retrain: bool) -> list[Path]:
        """The folders of a training notebook's checkpoints, under ``drafts``, in the order of ``names``;
        prints where they are and, when a publishing run retrains, which shipped checkpoints it replaces."""
        folders = [self.drafts / name for name in names]
        shown = ", ".join(self.shown(f) for f in folders)
        if self.published and retrain:
            print(f"publish = True, retrain = True: training replaces the shipped {shown}")
        elif self.published:
            print(f"{shown} as shipped: re-evaluated, model card rewritten")
        else:
            print(f"checkpoints: {shown}" + ("" if retrain else " (copies of the shipped ones)"))
        return folders

    def corpus(self, generates: bool) -> Path:
        """The target-made text a training notebook reads (``paths.corpus_dir()``, in the cache). Generating more
        appends to it, and the published checkpoints were trained on its first records, so only a publishing run
        may; a smoke run makes its own few records under its folder."""
        if generates and self.smoke:
            return self.folder / "target_text"
        if generates and not self.published:
            raise ValueError("corpus_budget > 0 appends to the training text in the cache: set publish = True, or "
                             "generate with python -m specdec_lite.train.corpus")
        return paths.corpus_dir()

    def title(self, text: str) -> str:
        """A figure title that says which dtype (and, for a pair the repository does not ship, which pair) it
        was measured in."""
        pair = "" if is_shipped_pair(self.target, self.draft) else \
            f", {short_name(self.target)} / {short_name(self.draft)}"
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


def is_shipped_pair(target: str, draft: str) -> bool:
    """The embedded target with the draft (or the heads' name prefix) the repository ships for it."""
    return target == EMBEDDED_TARGET and draft in SHIPPED_DRAFTS


def check_publish(target: str, draft: str, device: torch.device, smoke: bool) -> None:
    """A publishing run writes the shipped files: refused, before any work, for anything else than the shipped
    pair on the CPU at full size."""
    if smoke:
        raise ValueError(f"publish = True writes the shipped results; a smoke run never does: unset {SMOKE_ENV} "
                         "or set smoke = False")
    if not is_shipped_pair(target, draft) or device.type != "cpu":
        raise ValueError(f"publish = True writes the shipped results of {EMBEDDED_TARGET} with "
                         f"{' or '.join(SHIPPED_DRAFTS)} on the CPU; this run ({target}, {draft}, {device}) "
                         "writes under out/runs/: set publish = False")


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
    published: bool  # a publishing run: it writes the shipped figures, results, documents and checkpoints
    folder: Path  # the run's folder (the repository itself for a publishing run)
    figures: Path
    results: Path
    drafts: Path


def place_run(target: str, draft: str, device: torch.device, dtype: torch.dtype, run_name: str = "",
              smoke: bool = False, publish: bool = False) -> RunPlace:
    """Where a run writes: the shipped folders for a publishing run (refused for any other pair, device or a
    smoke run), else ``out/runs/<name>/`` (smoke: ``out/smoke/<name>/``), the name from the pair and dtype
    unless ``run_name`` is given."""
    root = paths.repo_root()
    name = run_name or run_name_for(target, draft, dtype)
    if publish:
        check_publish(target, draft, device, smoke)
        return RunPlace(name, True, root, paths.figures_dir(), paths.results_dir(), paths.drafts_dir())
    folder = root / "out" / ("smoke" if smoke else "runs") / name
    return RunPlace(name, False, folder, folder / "figures", folder / "results", folder / "drafts")


def switched_on(value: bool, env: str) -> tuple[bool, str]:
    """A flag parameter, switched on by its parameter or by ``env=1``; and how it was, for the printed line."""
    if os.environ.get(env) == "1" and not value:
        return True, f"True ({env}=1)"
    return bool(value), str(bool(value))


def quiet_model_loading() -> None:
    """No progress bars while models load: in JupyterLab they are widgets, which a saved notebook shows as
    'Loading weights: 0%' placeholders. The package's own bars are plain text (``specdec_lite.show``)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def setup(smoke: bool = False, target: str = EMBEDDED_TARGET, draft: str = EMBEDDED_DRAFT, device: str = "cpu",
          dtype: str = "auto", run_name: str = "", check_draft: bool = True, publish: bool = False) -> NotebookRun:
    """Check the notebook's parameters (names, device, dtype, publishing: a clear error before any work), then
    create and return its output folders, printing where they are. ``check_draft=False`` for notebooks whose
    ``draft`` is a name to write."""
    smoke, smoke_shown = switched_on(smoke, SMOKE_ENV)
    publish, publish_shown = switched_on(publish, PUBLISH_ENV)
    device, dtype = check_parameters(target, draft, device, dtype, check_draft)
    place = place_run(target, draft, device, dtype, run_name, smoke, publish)
    run = NotebookRun(root=paths.repo_root(), smoke=smoke, name=place.name, published=place.published,
                      folder=place.folder, figures=place.figures, results=place.results, drafts=place.drafts,
                      target=target, draft=draft, device=device, dtype=dtype)
    run.figures.mkdir(parents=True, exist_ok=True)
    run.results.mkdir(parents=True, exist_ok=True)
    quiet_model_loading()
    print(f"smoke: {smoke_shown} | publish: {publish_shown} | {run.dtype_name} on {device.type}")
    print(run.where())
    return run
