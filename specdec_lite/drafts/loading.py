"""Drafts by name (every kind), and a (target, draft, tokenizer) pair in one call."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from ..instruments.cost_profiles import machine_settings
from ..core.drafter import ByTemperature
from ..core.lm import model_device, static_state
from ..tokenizers import tokenizer_of
from ..names import EMBEDDED_DRAFT, EMBEDDED_EAGLE_DEEP_TTT, EMBEDDED_TARGET, check_model_name, resolve_name
from ..core.models import load_model
from ..tokenizers import check_tokenizers
from ..paths import drafts_dir, is_head_dir, results_dir
from .heads import EagleDraft, MedusaDraft, check_head_target, load_head, read_head_config
from .layer_skip import LayerSkipDraft
from .ngram import NGramDraft
from .pacing import PacedDraft
from .trees import (DEFAULT_COSTS, AdaptiveLength, EagleTreeDraft, HybridTreeDraft, LookupTreeDraft, device_class,
                    measured_dynamic_tree)

# Draft kinds built from a target's EAGLE head (drafts/trees.py), by name; with "n-gram" and "layer-skip", every
# name ``load_draft`` takes besides a head folder or a draft model.
TREE_DRAFTS = ("auto", "hybrid-dynamic", "dynamic-tree", "eagle-tree")
DRAFT_NAMES = (*TREE_DRAFTS, "n-gram", "layer-skip")
TREE_LABELS = {"eagle-tree": "EAGLE tree", "dynamic-tree": "EAGLE dynamic tree",
               "hybrid-dynamic": "hybrid dynamic tree"}  # how results name them (notebook 03 runs each)
AUTO_SETTINGS = dict(lookup_branches=2, head_width=2, adaptive_threshold=0.3)  # the measured recommendation
# Names load_draft took before notebook 03's run measured them behind the kinds kept (data/results/
# task_acceptance_summary.csv), and the heads superseded by the one "auto" uses (data/results/heads.csv; refused
# unless one is trained again into the drafts folder): refused, saying so, rather than looked up as Hugging Face ids.
REMOVED_DRAFTS = ("hybrid-tree", "hybrid-tree-drawn", "hybrid-tree-drawn-store", "eagle-tree-drawn", "eagle-adaptive",
                  "hybrid-dynamic-store", "lookup-tree", "store-tree")
REMOVED_HEADS = ("smollm2-135m-eagle", "smollm2-135m-eagle-deep", "smollm2-135m-eagle-replies",
                 "smollm2-135m-eagle-self", "smollm2-135m-eagle-ttt", "smollm2-135m-eagle-ttt2", "smollm2-135m-eagle3")


def load_draft(name_or_path: str, target, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """A draft for ``target`` by name (``DRAFT_NAMES``): ``"auto"`` (the recommended drafting, ``auto_draft``),
    ``"hybrid-dynamic"`` (lookup branches and EAGLE-2's dynamic tree on the EAGLE head in one tree),
    ``"dynamic-tree"`` (the dynamic tree alone; both size their trees by the costs ``calibrate`` measured on this
    machine, else by the head's shipped defaults for this kind of device: ``measured_dynamic_tree``),
    ``"eagle-tree"`` (the head's adaptive chain with siblings), ``"n-gram"`` (prompt lookup), ``"layer-skip"``
    (the target's own layers, middle third skipped); a feature-level head (``"smollm2-135m-eagle-deep-ttt"``,
    ``"smollm2-135m-medusa"`` or a folder with ``head_config.json``; refused when it was trained for another
    target), or else a draft model (package name, Hugging Face id or local path; its tokenizer must match the
    target's). A removed name (``check_not_removed``) is refused, listing these. Device and dtype default to the
    target's."""
    if not isinstance(target, torch.nn.Module):
        raise TypeError(f"load_draft needs the loaded target (a model from sd.load_model) as its second argument, got "
                        f"{type(target).__name__}")
    check_not_removed(name_or_path)
    if name_or_path == "n-gram":
        return NGramDraft()
    if name_or_path == "layer-skip":
        return LayerSkipDraft(target)
    if name_or_path in TREE_DRAFTS:
        return tree_draft(name_or_path, target)
    path = resolve_name(name_or_path, also=DRAFT_NAMES)
    if is_head_dir(path):
        return load_head(path, target)
    state = static_state(target)  # a draft model takes the target's cache kind and sits at its input
    options = dict(cache="static", max_cache_len=state.max_length, compile=state.compile) if state else {}
    draft_model, draft_tokenizer = load_model(path, device or model_device(target), dtype or target.dtype, **options)
    if tokenizer_of(target) is not None:
        check_tokenizers(tokenizer_of(target), draft_tokenizer)
    return draft_model


def check_not_removed(name: str) -> None:
    """Refuse a name of ``REMOVED_DRAFTS``, or of ``REMOVED_HEADS`` that is not in the drafts folder, saying which
    names ``load_draft`` takes."""
    if name in REMOVED_DRAFTS or (name in REMOVED_HEADS and not is_head_dir(drafts_dir() / name)):
        raise ValueError(f"draft {name!r} was removed: the drafts kept measured faster (notebook 03, "
                         f"{results_dir() / 'task_acceptance_summary.csv'}; the superseded heads' scores and training "
                         f"commands are in {results_dir() / 'heads.csv'}; git commit 7635d78 still has it). "
                         "load_draft takes "
                         f"{', '.join(DRAFT_NAMES)}, a head folder (with head_config.json, e.g. "
                         "smollm2-135m-eagle-deep-ttt or smollm2-135m-medusa) or a draft model's package name, "
                         "Hugging Face id or path")


def tree_draft(name: str, target, head: str | None = None):
    """A drafter by ``TREE_DRAFTS`` name, on an EAGLE head trained for ``target`` under the drafts folder
    (``heads_for``): ``head`` names it, by default ``recommended_eagle``'s. "auto" is the lookup tree for a target
    without one; the others need one."""
    eagle_names = eagle_heads_for(target)
    if head is not None and head not in eagle_names:
        raise ValueError(f"head {head!r} is not an EAGLE head trained for this target under {drafts_dir()}; "
                         f"those are {eagle_names or 'none'}")
    if not eagle_names:
        if name == "auto":
            return LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"])
        raise ValueError(f"draft {name!r} needs an EAGLE head trained for this target under {drafts_dir()}; "
                         "train one (notebooks/00_train_heads.ipynb) or use 'auto' (lookup trees without a head)")
    folder = drafts_dir() / (head or recommended_eagle(eagle_names))
    eagle = load_head(folder, target)
    if name == "eagle-tree":
        return head_tree_drafts(eagle)[name]
    built = head_tree_drafts(eagle, target, default_costs(folder))
    return auto_draft(built, eagle) if name == "auto" else built[name]


def default_costs(head_folder) -> dict:
    """The dynamic-tree costs a head ships for each kind of device ({device class: costs}, ``trees.DEFAULT_COSTS``
    in its folder; {} where it ships none)."""
    path = Path(head_folder) / DEFAULT_COSTS
    return json.loads(path.read_text()) if path.is_file() else {}


def calibrate(target, head: str | None = None, ship: bool = False) -> dict:
    """Measure this machine's dynamic-tree costs for ``target``'s EAGLE head (``head``, by default the recommended
    one) now, and keep them in the cost profiles, where every later load of "auto" and the dynamic trees reads
    them (until then the head's shipped defaults for this kind of device serve). Run it on a quiet machine: a
    measurement that spreads too far is not kept, and says so. ``ship=True`` also writes them into the head's
    folder as the shipped defaults for this device class (for the project's maintainers). Returns the costs."""
    eagle_names = eagle_heads_for(target)
    if not eagle_names:
        raise ValueError(f"no EAGLE head under {drafts_dir()} was trained for this target: nothing to calibrate")
    folder = drafts_dir() / (head or recommended_eagle(eagle_names))
    costs = measured_dynamic_tree(load_head(folder, target), target, remeasure=True).costs
    if ship:
        if costs["file"] is None:
            raise RuntimeError("the measurement was not kept (too noisy, or the cache is read-only): not shipped")
        saved = {**json.loads(Path(costs["file"]).read_text())["costs"],
                 "processor": machine_settings(target)["processor"]}  # where the defaults were measured
        shipped = {**default_costs(folder), device_class(target): saved}
        (folder / DEFAULT_COSTS).write_text(json.dumps(shipped, indent=1, sort_keys=True) + "\n")
    return costs


def auto_draft(built: dict, eagle: EagleDraft) -> ByTemperature:
    """"auto" for a target with an EAGLE head, from what ``head_tree_drafts`` built on it: greedy, the hybrid
    dynamic tree; at T > 0, the head's chain (``eagle`` itself, as ``load_draft`` gives the head). Notebook 03's
    last run (20 prompts, 128 tokens, 2-core AMD EPYC; data/results/task_acceptance_summary.csv), geometric mean
    over tasks: greedy the hybrid dynamic tree 1.54x (1.46x with the retrieval store's branches, which did not pay
    for themselves), at T = 1 the head's chain 1.18x against 1.06x for the hybrid dynamic tree. Nothing but the head
    is read: "auto" is the same installed and in a checkout. The two share the head's caches: a generation runs
    one of them (``ByTemperature``). Both rest while their drafting does not pay by the dynamic tree's cost model
    (``pacing.PacedDraft``): where it loses to plain decoding, "auto" decodes mostly plainly."""
    dynamic = built["dynamic-tree"]
    return ByTemperature(*(PacedDraft(drafter, dynamic.verify_cost, dynamic.head_cost)
                           for drafter in (built["hybrid-dynamic"], eagle)))


def recommended_eagle(eagle_names: list[str]) -> str:
    """The EAGLE head the tree drafts use when none is named: for the embedded target ``EMBEDDED_EAGLE_DEEP_TTT``
    (the best of the heads trained for it on held-out replies and in notebook 03: data/results/heads.csv), for
    another target the first of ``eagle_names``."""
    return EMBEDDED_EAGLE_DEEP_TTT if EMBEDDED_EAGLE_DEEP_TTT in eagle_names else eagle_names[0]


def head_tree_drafts(eagle: EagleDraft, target=None, defaults: dict | None = None) -> dict:
    """The tree drafters built on one EAGLE head, by ``TREE_DRAFTS`` name, with the recommended settings
    (``AUTO_SETTINGS``): "eagle-tree" (its adaptive threshold reads q's entropy at T > 0) and, given ``target``, the
    dynamic trees, shared by both, with this machine's calibrated costs, else the head's shipped ``defaults`` for
    this kind of device, else costs measured once here (``measured_dynamic_tree``)."""
    adaptive = AdaptiveLength(threshold=AUTO_SETTINGS["adaptive_threshold"], entropy=True)
    built = {"eagle-tree": EagleTreeDraft(eagle, width=AUTO_SETTINGS["head_width"], adaptive=adaptive)}
    if target is not None:
        dynamic = measured_dynamic_tree(eagle, target, defaults=defaults)
        built.update({"dynamic-tree": dynamic,
                      "hybrid-dynamic": HybridTreeDraft(LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"]),
                                                        dynamic)})
    return built


def check_draft_name(name_or_path: str) -> None:
    """Refuse, before anything is loaded, a draft name ``load_draft`` could not load (a removed one,
    ``check_not_removed``; else see ``check_model_name``)."""
    check_not_removed(name_or_path)
    if name_or_path in DRAFT_NAMES or is_head_dir(Path(name_or_path).expanduser()):
        return
    resolve_name(name_or_path, also=DRAFT_NAMES)  # refuses an unknown name at once, listing the draft kinds too
    check_model_name(name_or_path)


def load_pair(target: str = EMBEDDED_TARGET, draft: str = EMBEDDED_DRAFT, device: str | torch.device = "auto",
              dtype: str | torch.dtype | None = "auto", **load_options):
    """(target, draft, tokenizer): by default the embedded target and the draft trained for it. ``draft`` is
    anything ``load_draft`` takes (a model, a head, "n-gram", "layer-skip"). An incompatible draft (another
    tokenizer, a head trained for another target) is refused before anything else runs. dtype: as in
    ``load_model`` ("auto" by default); the draft follows the target's. ``load_options`` (``device_map``,
    ``cache``, ``max_cache_len``, ``compile``) go to ``load_model`` for the target; a draft model gets the same
    cache kind, on the device where the target takes its input."""
    if isinstance(draft, str):
        check_draft_name(draft)  # before the target loads: a misspelt draft costs no wait
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


def eagle_heads_for(target) -> list[str]:
    """The EAGLE heads among ``heads_for(target)``: what the token trees draft with."""
    return [name for name in heads_for(target) if read_head_config(drafts_dir() / name).kind == "eagle"]


def head_label(draft) -> str:
    """How results name a head: 'EAGLE head', 'EAGLE-3 head' (features fused from several layers) or 'Medusa
    heads'."""
    if isinstance(draft, MedusaDraft):
        return "Medusa heads"
    return "EAGLE-3 head" if len(draft.feature_layers) > 1 else "EAGLE head"


def labelled_heads(loaded: dict, recommended: str | None) -> dict:
    """{label: head} of the heads ``loaded`` by name: each by its kind (``head_label``), or, where several share a
    kind, by kind and name ("EAGLE head (my-head)"), the ``recommended`` EAGLE head keeping the plain label, so no
    head is dropped and "EAGLE head" is the one the trees use."""
    kinds = {name: head_label(head) for name, head in loaded.items()}
    sharing = Counter(kinds.values())
    return {kind if sharing[kind] == 1 or name == recommended else f"{kind} ({name})": loaded[name]
            for name, kind in kinds.items()}


def one_head_per_kind(loaded: dict, recommended: str | None) -> tuple[dict, list]:
    """(kept, left out) of the heads ``loaded`` by name: the ``recommended`` EAGLE head and the first of each other
    kind."""
    kept, seen = set(), set()
    for name in sorted(loaded, key=lambda n: n != recommended):  # the recommended head first
        kind = head_label(loaded[name])
        if kind not in seen:
            kept.add(name)
            seen.add(kind)
    return {n: h for n, h in loaded.items() if n in kept}, [n for n in loaded if n not in kept]


AUTO_LABEL = "hybrid dynamic tree; at T > 0 EAGLE head (auto)"  # how results name "auto" with an EAGLE head
AUTO_LABEL_WITHOUT_HEAD = "lookup tree (auto)"  # and without one


def drafts_for_pair(target, draft_model=None, heads="auto", layer_skip_exit: int = 0) -> tuple[dict, dict]:
    """Every draft kind that applies to ``target``, by label, and the kinds skipped, with the reason.

    The draft model (if given; labelled "trained draft"), the heads, n-gram prompt lookup, the recommended EAGLE
    head's trees (``TREE_LABELS``: "EAGLE tree", "EAGLE dynamic tree", "hybrid dynamic tree") and "auto"
    (``AUTO_LABEL``; the lookup tree, ``AUTO_LABEL_WITHOUT_HEAD``, when there is no EAGLE head), and layer skip.
    ``heads``: "auto" (of the heads trained for this target, ``heads_for``, one of each kind
    (``one_head_per_kind``), the others listed as skipped; none is not an error), or names/folders (a
    comma-separated string or a list), each refused with the loader's message when it was trained for another
    target. Heads are labelled by ``labelled_heads``.
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
    eagle = loaded[recommended] if recommended else None
    if eagle is not None:  # the trees on the same head, and auto
        folder = drafts_dir() / recommended if is_head_dir(drafts_dir() / recommended) else Path(recommended)
        built = head_tree_drafts(eagle, target, default_costs(folder))
        drafts.update({label: built[name] for name, label in TREE_LABELS.items()})
        drafts[AUTO_LABEL] = auto_draft(built, eagle)
    else:
        skipped["EAGLE tree / dynamic tree / hybrid"] = "no EAGLE head for this target"
        drafts[AUTO_LABEL_WITHOUT_HEAD] = LookupTreeDraft(branches=AUTO_SETTINGS["lookup_branches"])
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
