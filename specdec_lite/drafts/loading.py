"""Drafts by name (every kind), and a (target, draft, tokenizer) pair in one call."""
from __future__ import annotations

from pathlib import Path

import torch

from ..core.lm import model_device, static_state, tokenizer_of
from ..core.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, check_model_name, load_model, resolve_name
from ..core.tokenizers import check_tokenizers
from ..paths import drafts_dir, is_head_dir
from .heads import EagleDraft, MedusaDraft, check_head_target, load_head, read_head_config
from .layer_skip import LayerSkipDraft
from .ngram import NGramDraft
from .trees import AdaptiveLength, EagleTreeDraft, HybridTreeDraft, LookupTreeDraft


def load_draft(name_or_path: str, target, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """A draft for ``target`` by name: ``"auto"`` (the recommended drafting: the hybrid lookup + EAGLE-head token
    tree with an adaptive length, or lookup trees for a target without a head), ``"hybrid-tree"``, ``"eagle-tree"``,
    ``"eagle-adaptive"``, ``"lookup-tree"`` (``TREE_DRAFTS``), ``"n-gram"`` (prompt lookup), ``"layer-skip"`` (the
    target's own layers, middle third skipped), a feature-level head (``"smollm2-135m-eagle"``, ``"smollm2-135m-medusa"`` or a folder
    with ``head_config.json``; refused when it was trained for another target), or else a draft model (package
    name, Hugging Face id or local path; its tokenizer must match the target's). Device and dtype default to
    the target's."""
    if name_or_path == "n-gram":
        return NGramDraft()
    if name_or_path == "layer-skip":
        return LayerSkipDraft(target)
    if name_or_path in TREE_DRAFTS:
        return tree_draft(name_or_path, target)
    path = resolve_name(name_or_path)
    if is_head_dir(path):
        return load_head(path, target)
    state = static_state(target)  # a draft model takes the target's cache kind and sits at its input
    options = dict(cache="static", max_cache_len=state.max_length, compile=state.compile) if state else {}
    draft_model, draft_tokenizer = load_model(path, device or model_device(target), dtype or target.dtype, **options)
    if tokenizer_of(target) is not None:
        check_tokenizers(tokenizer_of(target), draft_tokenizer)
    return draft_model


# Draft kinds built from a target's heads and its own text (drafts/trees.py), by name. "auto" is the package's
# recommended drafting: measured best on the embedded target (README, "Measured"); for another target, the same
# recipe with the EAGLE head trained for it if there is one, else lookup trees.
TREE_DRAFTS = ("auto", "hybrid-tree", "eagle-tree", "eagle-adaptive", "lookup-tree")
AUTO_SETTINGS = dict(lookup_branches=2, head_width=2, adaptive_threshold=0.3)  # the measured recommendation


def tree_draft(name: str, target):
    """A tree or adaptive drafter by name (``TREE_DRAFTS``). The head-based ones need an EAGLE head trained for
    ``target`` under the drafts folder (``heads_for``); "auto" falls back to lookup trees without one."""
    eagle_names = [n for n in heads_for(target) if read_head_config(drafts_dir() / n).kind == "eagle"]
    if name == "lookup-tree" or (name == "auto" and not eagle_names):
        return LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"])
    if not eagle_names:
        raise ValueError(f"draft {name!r} needs an EAGLE head trained for this target under {drafts_dir()}; "
                         "train one (notebooks/00_train_heads.ipynb) or use 'lookup-tree'")
    built = head_tree_drafts(load_head(drafts_dir() / eagle_names[0], target))
    return built["hybrid-tree" if name == "auto" else name]


def head_tree_drafts(eagle: EagleDraft) -> dict:
    """The drafters built on one EAGLE head, by ``TREE_DRAFTS`` name, with the recommended settings
    (``AUTO_SETTINGS``); each has its own adaptive threshold."""
    def adaptive():
        return AdaptiveLength(threshold=AUTO_SETTINGS["adaptive_threshold"])

    head_tree = EagleTreeDraft(eagle, width=AUTO_SETTINGS["head_width"], adaptive=adaptive())
    return {"eagle-adaptive": EagleTreeDraft(eagle, width=1, adaptive=adaptive()),
            "eagle-tree": head_tree,
            "hybrid-tree": HybridTreeDraft(LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"]),
                                           EagleTreeDraft(eagle, width=AUTO_SETTINGS["head_width"], adaptive=adaptive()))}


def check_draft_name(name_or_path: str) -> None:
    """Refuse, before anything is loaded, a draft name ``load_draft`` could not load (see ``check_model_name``)."""
    if name_or_path in ("n-gram", "layer-skip", *TREE_DRAFTS) or is_head_dir(Path(name_or_path).expanduser()):
        return
    check_model_name(name_or_path)


def load_pair(target: str = EMBEDDED_TARGET, draft: str = EMBEDDED_DRAFT, device: str | torch.device = "auto",
              dtype: str | torch.dtype | None = "auto", **load_options):
    """(target, draft, tokenizer): by default the embedded target and the draft trained for it. ``draft`` is
    anything ``load_draft`` takes (a model, a head, "n-gram", "layer-skip"). An incompatible draft (another
    tokenizer, a head trained for another target) is refused before anything else runs. dtype: as in
    ``load_model`` ("auto" by default); the draft follows the target's. ``load_options`` (``device_map``,
    ``cache``, ``max_cache_len``, ``compile``) go to ``load_model`` for the target; a draft model gets the same
    cache kind, on the device where the target takes its input."""
    target_model, tokenizer = load_model(target, device, dtype, **load_options)
    return target_model, load_draft(draft, target_model), tokenizer


def heads_for(target) -> list[str]:
    """Names of the feature-level heads under the drafts folder that were trained for ``target`` (matched by
    hidden size, vocabulary and a probe of the target's weights, in any dtype), sorted; [] when none fits."""
    names = []
    for folder in sorted(drafts_dir().iterdir()) if drafts_dir().is_dir() else []:
        if not is_head_dir(folder):
            continue
        try:
            check_head_target(read_head_config(folder), target)
        except ValueError:
            continue
        names.append(folder.name)
    return names


def head_label(draft) -> str:
    """How results name a head: 'EAGLE head' or 'Medusa heads'."""
    return "Medusa heads" if isinstance(draft, MedusaDraft) else "EAGLE head"


def drafts_for_pair(target, draft_model=None, heads="auto", layer_skip_exit: int = 0) -> tuple[dict, dict]:
    """Every draft kind that applies to ``target``, by label, and the kinds skipped, with the reason.

    The draft model (if given; labelled "trained draft"), the heads, n-gram prompt lookup (chain and tree), the
    EAGLE head's adaptive chain, tree and hybrid tree (when there is an EAGLE head) and layer skip. ``heads``: "auto" (the heads
    trained for this target, ``heads_for``; none is not an error), or names/folders (a comma-separated string
    or a list), each refused with the loader's message when it was trained for another target.
    """
    drafts, skipped = {}, {}
    if draft_model is not None:
        drafts["trained draft"] = draft_model
    if heads == "auto":
        names = heads_for(target)
        if not names:
            skipped["heads"] = "no head under the drafts folder was trained for this target"
    else:
        names = [h.strip() for h in heads.split(",")] if isinstance(heads, str) else list(heads)
    for name in filter(None, names):
        head = load_draft(name, target)
        drafts[head_label(head)] = head
    drafts["n-gram"] = NGramDraft()
    drafts["lookup tree"] = LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"])
    eagle = next((d for d in drafts.values() if isinstance(d, EagleDraft)), None)
    if eagle is not None:  # adaptive length, trees and the hybrid on the same head
        built = head_tree_drafts(eagle)
        drafts.update({"EAGLE adaptive": built["eagle-adaptive"], "EAGLE tree": built["eagle-tree"],
                       "hybrid tree (auto)": built["hybrid-tree"]})
    else:
        skipped["EAGLE adaptive / tree / hybrid"] = "no EAGLE head for this target"
    try:
        layer_skip = LayerSkipDraft(target, exit_layer=layer_skip_exit or None)
    except (NotImplementedError, ValueError) as err:
        skipped["layer-skip"] = str(err)
    else:
        n_layers = target.config.get_text_config(decoder=True).num_hidden_layers
        if len(layer_skip.layers) < n_layers:
            drafts["layer-skip"] = layer_skip
        else:
            skipped["layer-skip"] = f"it would keep all {n_layers} of the target's layers (nothing to skip)"
    return drafts, skipped
