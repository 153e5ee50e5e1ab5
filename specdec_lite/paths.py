"""Where things are on disk: the one module that knows the folders the package reads and writes.

Shipped data (the trained drafts and heads, the evaluation prompts) is found, in this order:
  1. ``$SPECDEC_LITE_DATA``, a folder laid out like the repository's ``data/`` (``drafts/``, ``prompts/``);
  2. the copy installed with the package (``pip install .`` puts ``data/drafts`` and ``data/prompts`` under
     ``specdec_lite/shipped/``);
  3. the repository's ``data/`` folder, for a source checkout or an editable install.

Everything the reproduction publishes (results CSVs, figures) lives in the repository checkout (``repo_root()``).
What is made again on demand, or is state rather than product, goes to the cache, ``$SPECDEC_LITE_CACHE`` or
``~/.cache/specdec_lite``, and is never tracked: model conversions, the training text (restored from the
repository's history by ``python -m specdec_lite.train.restore``), features, training runs (optimizer states,
checkpoints) and the machine's measured cost profiles.
"""
from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "SPECDEC_LITE_DATA"
CACHE_ENV = "SPECDEC_LITE_CACHE"
HEAD_CONFIG = "head_config.json"  # the file that marks a folder as a feature-level head (see drafts.heads)

_PACKAGE = Path(__file__).resolve().parent
_INSTALLED_DATA = _PACKAGE / "shipped"
_CHECKOUT = _PACKAGE.parent


def data_dir() -> Path:
    """The folder holding ``drafts/`` and ``prompts/`` (see the module docstring for the order)."""
    if os.environ.get(DATA_ENV):
        path = Path(os.environ[DATA_ENV]).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"${DATA_ENV} points to {path}, which is not a folder; unset it or point it "
                                    "to a folder with drafts/ and prompts/")
        return path
    if _INSTALLED_DATA.is_dir():
        return _INSTALLED_DATA
    return _CHECKOUT / "data"


def drafts_dir() -> Path:
    """Shipped drafts and heads, one folder each."""
    return data_dir() / "drafts"


def prompts_dir() -> Path:
    """Shipped evaluation prompts, one JSONL file per task."""
    return data_dir() / "prompts"


def repo_root() -> Path:
    """The repository checkout this package runs from; the reproduction (notebooks, corpus, results) needs it."""
    if not (_CHECKOUT / "notebooks").is_dir():
        raise FileNotFoundError(f"{_CHECKOUT} is not a specdec_lite checkout: the reproduction (target-made text, "
                                "results, figures) runs from a clone of the repository, installed with `make`")
    return _CHECKOUT


def corpus_dir() -> Path:
    """Target-made training text (``tokens.bin``, ``index.jsonl``); ``train.restore`` writes the shipped one."""
    return cache_dir() / "target_text"


def teacher_dir() -> Path:
    """Teacher-forced training text: installed code, documentation and translation catalogs, tokenized
    (``train.restore`` writes the shipped one)."""
    return cache_dir() / "teacher_text"


def training_text_dirs() -> dict[str, Path]:
    """The shipped training text: {its folder in the repository's history (tracked until ``train.restore``'s
    commit): where it lives now}."""
    return {"data/target_text": corpus_dir(), "data/teacher_text": teacher_dir()}


def results_dir() -> Path:
    """The CSVs the notebooks write."""
    return repo_root() / "data" / "results"


def figures_dir() -> Path:
    return repo_root() / "figures"


def cache_dir() -> Path:
    """Converted models and extracted features: ``$SPECDEC_LITE_CACHE`` or ``~/.cache/specdec_lite``."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "specdec_lite")).expanduser()


def training_dir(name: str) -> Path:
    """A training run's state (the model so far, AdamW's moments, the random states), resumed from here by a later
    run on this machine; the finished model is published into ``drafts_dir()``, the state never is."""
    return cache_dir() / "training" / name


def features_root() -> Path:
    """The target's hidden states over the training text, one folder per target."""
    return cache_dir() / "features"


def cost_profiles_dir() -> Path:
    """Costs measured on this machine (v(n), a head's cost per depth), one JSON file per machine and setting."""
    return cache_dir() / "cost_profiles"


def is_head_dir(path) -> bool:
    """Whether ``path`` is a folder holding a feature-level head (rather than a model)."""
    return (Path(path) / HEAD_CONFIG).exists()
