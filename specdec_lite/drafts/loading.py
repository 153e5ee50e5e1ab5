"""Drafts by name (every kind), and a (target, draft, tokenizer) pair in one call."""
from __future__ import annotations

import torch

from ..core.lm import tokenizer_of
from ..core.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_model, resolve_name
from ..core.tokenizers import check_tokenizers
from ..paths import is_head_dir
from .heads import load_head
from .layer_skip import LayerSkipDraft
from .ngram import NGramDraft


def load_draft(name_or_path: str, target, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """A draft for ``target`` by name: ``"n-gram"`` (prompt lookup), ``"layer-skip"`` (the target's own layers,
    middle third skipped), a feature-level head (``"smollm2-135m-eagle"``, ``"smollm2-135m-medusa"`` or a folder
    with ``head_config.json``; refused when it was trained for another target), or else a draft model (package
    name, Hugging Face id or local path; its tokenizer must match the target's). Device and dtype default to
    the target's."""
    if name_or_path == "n-gram":
        return NGramDraft()
    if name_or_path == "layer-skip":
        return LayerSkipDraft(target)
    path = resolve_name(name_or_path)
    if is_head_dir(path):
        return load_head(path, target)
    draft_model, draft_tokenizer = load_model(path, device or target.device, dtype or target.dtype)
    if tokenizer_of(target) is not None:
        check_tokenizers(tokenizer_of(target), draft_tokenizer)
    return draft_model


def load_pair(target: str = EMBEDDED_TARGET, draft: str = EMBEDDED_DRAFT, device: str | torch.device = "auto",
              dtype: torch.dtype | None = None):
    """(target, draft, tokenizer): by default the embedded target and the draft trained for it. ``draft`` is
    anything ``load_draft`` takes (a model, a head, "n-gram", "layer-skip"). An incompatible draft (another
    tokenizer, a head trained for another target) is refused before anything else runs."""
    target_model, tokenizer = load_model(target, device, dtype)
    return target_model, load_draft(draft, target_model), tokenizer
