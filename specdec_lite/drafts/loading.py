"""Drafts by name (every kind), and a (target, draft, tokenizer) pair in one call."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from ..core.drafter import ByTemperature
from ..core.lm import model_device, static_state, tokenizer_of
from ..core.models import (EMBEDDED_DRAFT, EMBEDDED_EAGLE, EMBEDDED_EAGLE_DEEP, EMBEDDED_EAGLE_DEEP_TTT,
                           EMBEDDED_EAGLE_REPLIES, EMBEDDED_EAGLE_SELF, EMBEDDED_TARGET, check_model_name, load_model,
                           resolve_name)
from ..core.tokenizers import check_tokenizers
from ..paths import drafts_dir, is_head_dir
from .heads import EagleDraft, MedusaDraft, check_head_target, load_head, read_head_config
from .datastore import Datastore, DatastoreTreeDraft
from .layer_skip import LayerSkipDraft
from .ngram import NGramDraft
from .trees import AdaptiveLength, EagleTreeDraft, HybridTreeDraft, LookupTreeDraft, measured_dynamic_tree


def load_draft(name_or_path: str, target, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """A draft for ``target`` by name: ``"auto"`` (the recommended drafting, ``AUTO_DRAFT``: greedy, lookup and
    store branches and the EAGLE head's dynamic tree in one tree, sized by costs measured as it loads; at T > 0 the
    same without the store's branches; lookup trees for a target without a head),
    ``"hybrid-tree"``, ``"hybrid-tree-drawn"``, ``"eagle-tree"``, ``"eagle-tree-drawn"``, ``"eagle-adaptive"``,
    ``"dynamic-tree"`` and ``"hybrid-dynamic"`` (EAGLE-2's dynamic tree, alone or with lookup branches: its costs
    are measured on this machine when it loads, a few seconds), ``"hybrid-dynamic-store"`` and
    ``"hybrid-tree-drawn-store"`` (those hybrids with the continuations retrieved from the target's earlier replies,
    ``drafts.datastore``; the second measured for "auto" at T > 0 only), ``"store-tree"`` (those alone),
    ``"lookup-tree"`` (``TREE_DRAFTS``), ``"n-gram"`` (prompt lookup), ``"layer-skip"`` (the
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
# recommended drafting (AUTO_DRAFT): measured best on the embedded target (README, "Measured"); for another target,
# the same recipe with the EAGLE head trained for it if there is one, else lookup trees.
TREE_DRAFTS = ("auto", "hybrid-tree", "hybrid-tree-drawn", "hybrid-tree-drawn-store", "eagle-tree", "eagle-tree-drawn",
               "eagle-adaptive", "dynamic-tree", "hybrid-dynamic", "hybrid-dynamic-store", "lookup-tree", "store-tree")
DYNAMIC_TREES = ("dynamic-tree", "hybrid-dynamic", "hybrid-dynamic-store")  # measured on the machine as they load
STORE_DRAFTS = ("hybrid-dynamic-store", "hybrid-tree-drawn-store", "store-tree")  # read the target's earlier replies
# "auto" (core.drafter.ByTemperature): (greedy, T > 0), each measured best at its temperature on prompts outside the
# benchmark (docs/SPEED.md; at T > 0 the store's branches cost more than they drafted, and the drawn hybrid tree
# lost to the dynamic one in two runs of two); the second pair for a target that wrote no replies the store could read
AUTO_DRAFT = ("hybrid-dynamic-store", "hybrid-dynamic")
AUTO_WITHOUT_STORE = ("hybrid-dynamic", "hybrid-dynamic")
TREE_LABELS = {"eagle-adaptive": "EAGLE adaptive", "eagle-tree": "EAGLE tree", "eagle-tree-drawn": "EAGLE tree drawn",
               "hybrid-tree": "hybrid tree", "hybrid-tree-drawn": "hybrid tree drawn",
               "dynamic-tree": "EAGLE dynamic tree", "hybrid-dynamic": "hybrid dynamic tree",
               "hybrid-dynamic-store": "hybrid dynamic tree + store"}  # how results name them (notebook 03 runs each)
AUTO_SETTINGS = dict(lookup_branches=2, head_width=2, adaptive_threshold=0.3)  # the measured recommendation
STORE_SETTINGS = dict(budget=6, max_match=8, min_frequency=0.1)  # the store's nodes a round (drafts/datastore.py)


def tree_draft(name: str, target, head: str | None = None):
    """A tree or adaptive drafter by name (``TREE_DRAFTS``). The head-based ones need an EAGLE head trained for
    ``target`` under the drafts folder (``heads_for``): ``head`` names it, by default ``recommended_eagle``'s;
    "auto" falls back to lookup trees without one. The store's (``STORE_DRAFTS``) need replies the target wrote
    (``Datastore.from_corpus``)."""
    eagle_names = [n for n in heads_for(target) if read_head_config(drafts_dir() / n).kind == "eagle"]
    if head is not None and head not in eagle_names:
        raise ValueError(f"head {head!r} is not an EAGLE head trained for this target under {drafts_dir()}; "
                         f"those are {eagle_names or 'none'}")
    if name == "lookup-tree" or (name == "auto" and not eagle_names):
        return LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"])
    if name == "store-tree":
        return store_draft(target)
    if not eagle_names:
        raise ValueError(f"draft {name!r} needs an EAGLE head trained for this target under {drafts_dir()}; "
                         "train one (notebooks/00_train_heads.ipynb) or use 'lookup-tree'")
    names, store = auto_drafting(target) if name == "auto" else ((name,), None)
    if name in STORE_DRAFTS:
        store = store_draft(target)
    eagle = load_head(drafts_dir() / (head or recommended_eagle(eagle_names)), target)
    built = head_tree_drafts(eagle, target if set(names) & set(DYNAMIC_TREES) else None, store)
    return auto_drafter(built, names) if name == "auto" else built[name]


def auto_drafting(target) -> tuple[tuple[str, str], "DatastoreTreeDraft | None"]:
    """((greedy name, T > 0 name), store) of what "auto" is for ``target``: ``AUTO_DRAFT`` with its store of the
    target's replies, or, where the target wrote none (another model; an installed package without the
    repository's corpus), ``AUTO_WITHOUT_STORE``."""
    try:
        return AUTO_DRAFT, store_draft(target)
    except ValueError:
        return AUTO_WITHOUT_STORE, None


def auto_drafter(built: dict, names: tuple[str, str]) -> ByTemperature:
    """The "auto" drafter from those ``head_tree_drafts`` built: the greedy and the T > 0 ones that
    ``auto_drafting`` named."""
    greedy, sampled = names
    return ByTemperature(built[greedy], built[sampled])


def store_draft(target) -> DatastoreTreeDraft:
    """The retrieval draft over the replies ``target`` wrote (``data/target_text``), with ``STORE_SETTINGS``."""
    return DatastoreTreeDraft(Datastore.from_corpus(target), **STORE_SETTINGS)


def recommended_eagle(eagle_names: list[str]) -> str:
    """The EAGLE head the tree drafts use when none is named: for the embedded target the first shipped of
    ``RECOMMENDED_EAGLES``, for another target the first of ``eagle_names``. On prompts outside the benchmark's,
    the two-layer head trained unrolled on a GPU (``EMBEDDED_EAGLE_DEEP_TTT``) drafts more tokens a round than the
    one it started from (``EMBEDDED_EAGLE_DEEP``), which drafts more than the one-layer head it grew from,
    the head continued on the replies to the target's own requests (``EMBEDDED_EAGLE_SELF``), which drafts more than
    the one it started from (``EMBEDDED_EAGLE_REPLIES``), which drafts more than the first head; the
    EAGLE-3-style head (``EMBEDDED_EAGLE3``) fewer (docs/SPEED.md, "Which head the trees use"), so it is used only
    when named, and so are the heads continued unrolled (``EMBEDDED_EAGLE_TTT``, ``EMBEDDED_EAGLE_TTT2``), which tie
    with it there."""
    return next((name for name in RECOMMENDED_EAGLES if name in eagle_names), eagle_names[0])


RECOMMENDED_EAGLES = (EMBEDDED_EAGLE_DEEP_TTT, EMBEDDED_EAGLE_DEEP, EMBEDDED_EAGLE_SELF, EMBEDDED_EAGLE_REPLIES,
                      EMBEDDED_EAGLE)  # the embedded target's, best first


def head_tree_drafts(eagle: EagleDraft, target=None, store: DatastoreTreeDraft | None = None) -> dict:
    """The drafters built on one EAGLE head, by ``TREE_DRAFTS`` name, with the recommended settings
    (``AUTO_SETTINGS``); each has its own adaptive threshold, which at T > 0 reads q's entropy. "eagle-tree-drawn"
    and "hybrid-tree-drawn" draw the head's candidates from q at T > 0 (SpecInfer) where "eagle-tree" and
    "hybrid-tree" choose the most likely (at T = 0 each is the same as its chosen twin). Given
    ``target``, also the dynamic trees, with costs measured once on this machine (``measured_dynamic_tree``),
    shared by all, and, given ``store`` (``store_draft``), the hybrid dynamic tree with the store's branches."""
    def adaptive():
        return AdaptiveLength(threshold=AUTO_SETTINGS["adaptive_threshold"], entropy=True)

    def lookup():
        return LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"])

    def head_tree(draw=False):
        return EagleTreeDraft(eagle, width=AUTO_SETTINGS["head_width"], adaptive=adaptive(), draw=draw)

    built = {"eagle-adaptive": EagleTreeDraft(eagle, width=1, adaptive=adaptive()), "eagle-tree": head_tree(),
             "eagle-tree-drawn": head_tree(draw=True), "hybrid-tree": HybridTreeDraft(lookup(), head_tree()),
             "hybrid-tree-drawn": HybridTreeDraft(lookup(), head_tree(draw=True))}
    if target is not None:
        dynamic = measured_dynamic_tree(eagle, target)
        built.update({"dynamic-tree": dynamic, "hybrid-dynamic": HybridTreeDraft(lookup(), dynamic)})
        if store is not None:
            built["hybrid-dynamic-store"] = HybridTreeDraft(lookup(), dynamic, store)
    if store is not None:
        built["hybrid-tree-drawn-store"] = HybridTreeDraft(lookup(), head_tree(draw=True), store)
    return built


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
    """How results name a head: 'EAGLE head', 'EAGLE-3 head' (features fused from several layers) or 'Medusa
    heads'."""
    if isinstance(draft, MedusaDraft):
        return "Medusa heads"
    return "EAGLE-3 head" if len(draft.feature_layers) > 1 else "EAGLE head"


def labelled_heads(loaded: dict, recommended: str | None) -> dict:
    """{label: head} of the heads ``loaded`` by name: each by its kind (``head_label``), or, where several share a
    kind, by kind and name ("EAGLE head (smollm2-135m-eagle)"), the ``recommended`` EAGLE head keeping the plain
    label, so no head is dropped and "EAGLE head" is the one the trees use."""
    kinds = {name: head_label(head) for name, head in loaded.items()}
    sharing = Counter(kinds.values())
    return {kind if sharing[kind] == 1 or name == recommended else f"{kind} ({name})": loaded[name]
            for name, kind in kinds.items()}


def one_head_per_kind(loaded: dict, recommended: str | None) -> tuple[dict, list]:
    """(kept, left out) of the heads ``loaded`` by name: the ``recommended`` EAGLE head, the first of each other
    kind, and the embedded target's first head (``EMBEDDED_EAGLE``, where drafting's progression starts)."""
    kept, seen = set(), set()
    for name in sorted(loaded, key=lambda n: n != recommended):  # the recommended head first
        kind = head_label(loaded[name])
        if kind not in seen or name == EMBEDDED_EAGLE:
            kept.add(name)
            seen.add(kind)
    return {n: h for n, h in loaded.items() if n in kept}, [n for n in loaded if n not in kept]


def auto_label(names: tuple[str, str]) -> str:
    """How results name "auto": its greedy and its T > 0 drafting (one name where they are the same), marked
    "(auto)" (``evaluate.recommended``)."""
    greedy, sampled = (TREE_LABELS[n] for n in names)
    return f"{greedy} (auto)" if greedy == sampled else f"{greedy}; at T > 0 {sampled} (auto)"


def drafts_for_pair(target, draft_model=None, heads="auto", layer_skip_exit: int = 0) -> tuple[dict, dict]:
    """Every draft kind that applies to ``target``, by label, and the kinds skipped, with the reason.

    The draft model (if given; labelled "trained draft"), the heads, n-gram prompt lookup (chain and tree), the
    recommended EAGLE head's adaptive chain, trees and hybrids (``TREE_LABELS``) and "auto" (``auto_label``), when
    there is an EAGLE head, and layer skip. ``heads``: "auto" (of the heads trained for this target,
    ``heads_for``, one of each kind (``one_head_per_kind``), the others listed as skipped; none is not an error),
    or names/folders (a comma-separated string or a list), each refused with the loader's message when it was
    trained for another target. Heads are labelled by ``labelled_heads``.
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
    loaded = {name: load_draft(name, target) for name in filter(None, names)}
    eagles = [name for name, head in loaded.items() if isinstance(head, EagleDraft)]
    recommended = recommended_eagle(eagles) if eagles else None
    if heads == "auto":
        loaded, skipped_heads = one_head_per_kind(loaded, recommended)
        skipped.update({name: "another head of a kind measured here: name it in `heads` to measure it"
                        for name in skipped_heads})
    drafts.update(labelled_heads(loaded, recommended))
    drafts["n-gram"] = NGramDraft()
    drafts["lookup tree"] = LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"])
    eagle = loaded[recommended] if recommended else None
    if eagle is not None:  # adaptive length, trees and the hybrids on the same head
        auto, store = auto_drafting(target)
        built = head_tree_drafts(eagle, target, store)
        drafts.update({TREE_LABELS[name]: built[name] for name in TREE_LABELS if name in built})
        drafts[auto_label(auto)] = auto_drafter(built, auto)
        if store is None:
            skipped[TREE_LABELS["hybrid-dynamic-store"]] = "the target wrote no replies for a store (data/target_text)"
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
