"""Drafting beyond a fixed-length chain: adaptive draft length, token trees, hybrid lookup + head drafts.

- ``AdaptiveLength``: a drafter stops proposing when its own confidence in its next token (its probability under
  the draft's untempered softmax) falls below a threshold; the threshold moves after every round from what the
  verifier accepted (a rejection raises it, a fully accepted proposal lowers it), and it may stop before the first
  token (the round is then a plain decoding step). It reads draft-side numbers and past rounds only, so the
  stopping rule is decided before the target runs and verification stays exact (a stopping time of the draft).
- ``EagleTreeDraft``: the EAGLE head's chain (adaptive length) plus, at each depth, the head's next most likely
  tokens as sibling leaves: a wider net for the same number of head steps.
- ``LookupTreeDraft``: prompt lookup with several earlier matches, each continuation a branch; adaptive in the
  match length it requires (the point-mass rule: a longer match, a more reliable continuation).
- ``DynamicTreeDraft``: EAGLE-2's dynamic tree: expanded by path confidence, cut to the node budget and depth that
  the cost model, with this machine's measured v(n), says pay (``measured_dynamic_tree``).
- ``HybridTreeDraft``: lookup branches and a head's tree in one tree, merged where they agree.
- ``SampledTreeDraft``: SpecInfer's sampled trees from a small draft model (siblings drawn i.i.d. from q), recomputed
  from scratch every round: for toy models and exactness checks, not for speed.

Chosen nodes (q one-hot) are exact at any temperature: the verifier samples y from the target at a node and
descends when y is a child (``core/tree.py``). Every node is chosen except the sampled trees', which are drawn and
verified with the q they were drawn from.
"""
from __future__ import annotations

import functools
import itertools
import statistics
from dataclasses import dataclass

import torch

from ..instruments.cost_profiles import kept_or_measured, machine_settings, model_shape
from ..core.drafter import Drafter, confidence_of, stops_here
from ..core.lm import HFCausalLM, as_language_model
from ..core.sampling import SamplingParams, probs_from_logits, sample
from ..instruments.timing import forward_seconds, relative_to_one_token, timed, v_at
from ..core.tree import Tree, TreeBuilder
from .heads import EagleDraft


@dataclass
class AdaptiveLength:
    """Stop drafting when the draft's probability of its next token is below ``threshold`` (with ``entropy``, at
    T > 0: when exp(-H(q)) is, q's spread; ``core.drafter.confidence_of``); move the threshold by ``step`` after
    each round: up after a rejection, down after a fully accepted (or empty) proposal."""

    threshold: float = 0.3  # starting threshold on the draft's own probability of its token
    step: float = 0.05  # change per round
    low: float = 0.0  # bounds of the threshold
    high: float = 0.9
    entropy: bool = False  # at T > 0, judge by q's entropy instead of the top token's probability

    def __post_init__(self):
        if not 0.0 <= self.low <= self.threshold <= self.high <= 1.0 or self.step < 0:
            raise ValueError(f"need 0 <= low <= threshold <= high <= 1 and step >= 0, got {self}")

    def keep_going(self, logits: torch.Tensor, sampling: SamplingParams) -> bool:
        return confidence_of(logits, sampling if self.entropy else None) >= self.threshold

    def update(self, proposed: int, accepted: int) -> None:
        """After a round: ``proposed`` tokens on the drafter's own chain, ``accepted`` of them kept."""
        if proposed == 0 or accepted >= proposed:
            self.threshold = max(self.low, self.threshold - self.step)
        else:
            self.threshold = min(self.high, self.threshold + self.step)


def root_builder(seq, lengths) -> TreeBuilder:
    """A tree under construction whose root is the newest token of the (batch-1) sequence."""
    return TreeBuilder(int(seq[0, int(lengths[0]) - 1]))


class EagleTreeDraft(Drafter):
    """The EAGLE head's chain, adaptive in length, with ``width - 1`` sibling leaves at each step: the next most
    likely tokens, chosen (exact at any temperature). Reuses an ``EagleDraft`` (its caches and feature
    bookkeeping)."""

    uses_target_features = True
    proposes_trees = True

    def __init__(self, eagle: EagleDraft, width: int = 2, adaptive: AdaptiveLength | None = None):
        if not isinstance(eagle, EagleDraft):
            raise TypeError("EagleTreeDraft wraps an EagleDraft (load_draft('smollm2-135m-eagle-deep-ttt', target)), "
                            f"got {type(eagle).__name__}")
        if width < 1:
            raise ValueError(f"width (candidates per depth) must be >= 1, got {width}")
        self.eagle, self.width, self.adaptive = eagle, width, adaptive
        self.vocab_size, self.feature_layers = eagle.vocab_size, eagle.feature_layers
        self._proposed, self._start = 0, 0

    def begin(self, input_ids, padding=None, tokens=None):
        self.eagle.begin(input_ids, padding)

    def observe(self, hidden, first_position: int) -> None:
        self.eagle.observe(hidden, first_position)

    def grow(self, builder: TreeBuilder, seq, lengths, gamma: int, sampling: SamplingParams, generator) -> None:
        """Add the head's chain and its siblings under the root; the chain's length is kept for the adaptive
        rule's update at the rollback."""
        self._proposed, self._start, self.forwards = 0, int(lengths[0]), 0
        if self.eagle.features is None:  # the target has not run yet: nothing to read
            return
        predicted, self.forwards = self.eagle.catch_up(seq), 1
        parent, chain = 0, 0
        for depth in range(gamma):
            logits = self.eagle.output.logits(predicted[0, -1])  # (V,)
            if stops_here(self.adaptive, logits[None], sampling):
                break
            parent, token = self.candidates(builder, parent, logits)
            chain += 1  # the chain goes on under the first candidate
            if depth < gamma - 1:
                predicted = self.eagle.draft_step(predicted, torch.tensor([token], device=seq.device), depth)
                self.forwards += 1
        self._proposed = chain

    def candidates(self, builder: TreeBuilder, parent: int, logits) -> tuple[int, int]:
        """Add the head's ``width`` most likely tokens as children under ``parent``, chosen; returns the first
        one's (node, token)."""
        tokens = logits.topk(self.width).indices.tolist()
        return [builder.add(parent, token) for token in tokens][0], tokens[0]

    @torch.inference_mode()
    def propose_tree(self, seq, lengths, gamma, sampling, generator) -> Tree:
        builder = root_builder(seq, lengths)
        self.grow(builder, seq, lengths, gamma, sampling, generator)
        return builder.build()

    def rollback(self, kept: list[int]) -> None:
        if self.adaptive is not None:
            self.adaptive.update(self._proposed, kept[0] - self._start)
        self.eagle.rollback(kept)


def best_budget(confidences, draft_cost: float, verify_cost) -> tuple[int, float]:
    """(N, speedup): how many candidates to verify, the most confident first, and the cost model's speedup with
    them: the N that maximises (1 + sum of the N largest path confidences) / (draft_cost + verify_cost(N + 1)), the
    path confidence standing for the probability that a node is accepted (EAGLE-2). ``verify_cost(n)``: a target
    forward over n tokens in decode steps, v(n) as measured on the machine; ``draft_cost``: the round's drafting,
    in decode steps."""
    expected = 1 + torch.cat([torch.zeros(1), torch.as_tensor(confidences).sort(descending=True).values.cumsum(0)])
    speed = [e / (draft_cost + verify_cost(n + 1)) for n, e in enumerate(expected.tolist())]
    n = max(range(len(speed)), key=speed.__getitem__)
    return n, speed[n]


@dataclass
class Candidate:
    token: int
    parent: int  # index of the parent candidate, -1 for a child of the root
    depth: int
    confidence: float  # the product of the head's probabilities along the path
    source: torch.Tensor  # (1, 1, H) the predicted feature whose logits proposed it


class DynamicTreeDraft(Drafter):
    """EAGLE-2's dynamic tree on an EAGLE head (Li et al. 2024): from the root, expand the ``top_k`` most confident
    candidates of each depth by their ``top_k`` most likely children (path confidence: the product of the head's
    probabilities along the path), then keep the candidates the cost model says pay (``best_budget`` with the
    machine's v(n)). The depth, at most gamma, is the cost model's too: a round stops expanding when its last
    depth did not raise the best predicted speedup, each depth costing ``head_cost`` decode steps. The candidates
    are chosen, not drawn, so the tree is exact at any temperature (a chosen child is accepted with probability
    r(x)); at T > 0 the path confidence is the tempered distribution's. The head drafts every expansion in one
    forward, each node attending to the real features and its own ancestors. ``measured_dynamic_tree`` builds one
    with this machine's costs."""

    uses_target_features = True
    proposes_trees = True

    def __init__(self, eagle: EagleDraft, verify_cost, head_cost: float, top_k: int = 4, costs: dict | None = None):
        if not isinstance(eagle, EagleDraft):
            raise TypeError(f"DynamicTreeDraft wraps an EagleDraft, got {type(eagle).__name__}")
        if top_k < 1 or head_cost < 0:
            raise ValueError(f"need top_k >= 1 and head_cost >= 0, got {top_k}, {head_cost}")
        self.eagle, self.head_cost, self.top_k = eagle, head_cost, top_k
        self.verify_cost = functools.lru_cache(maxsize=None)(verify_cost)  # asked for the same n every round
        self.costs = costs  # the measured costs, their spread and source (``measured_dynamic_tree``), for reports
        self.vocab_size, self.feature_layers = eagle.vocab_size, eagle.feature_layers

    def begin(self, input_ids, padding=None, tokens=None):
        self.eagle.begin(input_ids, padding)

    def observe(self, hidden, first_position: int) -> None:
        self.eagle.observe(hidden, first_position)

    def rollback(self, kept: list[int]) -> None:
        self.eagle.rollback(kept)

    def children(self, parents: list[int], depth: int, features, candidates: list[Candidate],
                 sampling) -> list[Candidate]:
        """The ``top_k`` most likely children of each of ``parents`` (-1: the root), whose predicted features are
        ``features`` (1, m, H), from one output-layer call over the head's sub-vocabulary (q is zero outside it,
        so its top tokens and their probabilities are those of the full-width q)."""
        logits = self.eagle.output.sub_logits(features[0]).float()  # (m, S)
        probs = torch.softmax(logits, -1) if sampling.greedy else probs_from_logits(logits, sampling)
        top = probs.topk(min(self.top_k, probs.shape[-1]))
        tokens = self.eagle.output.sub_to_full(top.indices).tolist()
        out = []
        for j, (parent, row, values) in enumerate(zip(parents, tokens, top.values.tolist())):
            confidence = candidates[parent].confidence if parent >= 0 else 1.0
            out += [Candidate(token, parent, depth, confidence * p, features[:, j:j + 1])
                    for token, p in zip(row, values) if p > 0]
        return out

    def budget(self, candidates: list[Candidate], depth: int) -> tuple[int, float]:
        """``best_budget`` over the candidates of a round that expanded ``depth`` levels."""
        return best_budget([c.confidence for c in candidates], depth * self.head_cost, self.verify_cost)

    @torch.inference_mode()
    def grow(self, builder: TreeBuilder, seq, lengths, gamma: int, sampling: SamplingParams, generator) -> None:
        """Expand level by level while a level pays (at most gamma), then add the kept candidates under the root."""
        self.forwards = 0
        if self.eagle.features is None:  # the target has not run yet: nothing to read
            return
        candidates, self.forwards = self.children([-1], 1, self.eagle.catch_up(seq), [], sampling), 1
        level, entry = list(range(len(candidates))), {}  # candidate -> its head cache entry once expanded
        depth, (n, speed) = 1, self.budget(candidates, 1)
        while depth < gamma:
            expand = sorted(level, key=lambda i: -candidates[i].confidence)[: self.top_k]
            features = self.expand(seq, expand, entry, candidates, int(lengths[0]) + depth - 2)
            self.forwards += 1
            born = self.children(expand, depth + 1, features, candidates, sampling)
            deeper = candidates + born
            level = list(range(len(candidates), len(deeper)))
            deeper_n, deeper_speed = self.budget(deeper, depth + 1)
            if deeper_speed <= speed:  # this level does not pay for its head step
                break
            candidates, depth, n, speed = deeper, depth + 1, deeper_n, deeper_speed
        self.add_best(builder, candidates, n)

    def propose_tree(self, seq, lengths, gamma, sampling, generator) -> Tree:
        builder = root_builder(seq, lengths)
        self.grow(builder, seq, lengths, gamma, sampling, generator)
        return builder.build()

    def expand(self, seq, indices: list[int], entry: dict, candidates: list[Candidate], position: int):
        """One head forward over the candidates ``indices`` (their source feature and token) at ``position``, each
        seeing the real entries, its expanded ancestors' entries and itself; returns their new features (1, m, H).
        ``entry`` (candidate -> head cache slot) gains theirs."""
        eagle, device = self.eagle, seq.device
        chosen, start = [candidates[i] for i in indices], eagle.cache.length
        allowed = torch.zeros(len(chosen), start + len(chosen), dtype=torch.bool)
        made = eagle.cache.index[0]  # each slot's buffer position (-1: a hole); real entries lie below real_rows
        allowed[:, :start] = (made >= 0) & (made < eagle.real_rows[0])
        for j, c in enumerate(chosen):
            allowed[j, start + j] = True
            parent = c.parent
            while parent >= 0:
                allowed[j, entry[parent]] = True
                parent = candidates[parent].parent
        entry.update({i: start + j for j, i in enumerate(indices)})
        tokens = torch.tensor([[c.token for c in chosen]], device=device)
        sources = torch.cat([c.source[:, -1:] for c in chosen], dim=1)
        positions = torch.full((len(chosen),), position, device=device)
        # predicted entries, recorded at the position they were drafted for: the rollback drops them
        allowed = eagle.cache.admit(torch.full((1, len(chosen)), position), allowed.to(device))
        return eagle.head(sources, eagle.embed(tokens), positions, eagle.cache, allowed)

    @staticmethod
    def add_best(builder: TreeBuilder, candidates: list[Candidate], n: int) -> None:
        """Add the ``n`` most confident candidates; a candidate's path confidence is at most its parent's, so the
        kept set holds every kept node's ancestors."""
        order = sorted(range(len(candidates)), key=lambda i: (-candidates[i].confidence, candidates[i].depth))
        node = {-1: 0}
        for i in sorted(order[:n], key=lambda i: candidates[i].depth):
            if candidates[i].parent in node:
                node[i] = builder.add(node[candidates[i].parent], candidates[i].token)


def round_seconds(drafter: Drafter, target, depth: int, context_len: int = 64, repeats: int = 5) -> float:
    """Median wall time of one drafting round of ``depth`` (``propose_tree``) of a drafter that reads the target's
    features, as the loop runs it: after a target forward over a random context, with two new positions to catch
    up on each time."""
    lm = HFCausalLM(target)
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, drafter.vocab_size, (1, context_len + 1), generator=g).to(lm.device)
    lm.reset(1)
    _, hidden = lm.feed(seq[:, :-1], hidden_layers=drafter.feature_layers)
    drafter.begin(seq)
    drafter.observe(hidden, 0)
    lengths, greedy, times = torch.tensor([context_len + 1]), SamplingParams(temperature=0.0), []
    for r in range(repeats + 1):  # the first is a warm-up
        drafter.rollback([context_len - 2])
        drafter.observe(hidden[:, context_len - 2:], context_len - 2)
        _, seconds = timed(lambda: drafter.propose_tree(seq, lengths, depth, greedy, None), lm.device)
        if r:
            times.append(seconds)
    return statistics.median(times)


def dynamic_tree_profile_key(eagle: EagleDraft, target, top_k: int, max_depth: int, tokens, repeats: int,
                             passes: int) -> dict:
    """What a dynamic tree's measured costs depend on (``instruments.cost_profiles``): this machine and the target's
    settings on it, the target's and the head's shapes, the tree's ``top_k`` and ``max_depth``, and the timings
    taken (the token counts, through the tree forward, ``passes`` of ``repeats`` each)."""
    head = {"class": type(eagle.head).__name__, "parameters": sum(p.numel() for p in eagle.head.parameters()),
            "layers": eagle.cfg.num_layers, "feature_layers": len(eagle.feature_layers),
            "output_rows": eagle.output.weight.shape[0],
            "weights": "int8" if eagle.quantized else str(eagle.head_dtype)}
    return {"machine": machine_settings(target), "target": model_shape(target), "head": head, "top_k": top_k,
            "max_depth": max_depth, "tokens": sorted({1, *tokens}), "verification": "tree forward",
            "repeats": repeats, "passes": passes}


def min_median_max(values) -> list[float]:
    """[min, median, max] of ``values``."""
    return [min(values), statistics.median(values), max(values)]


def measure_dynamic_tree_costs(eagle: EagleDraft, target, top_k: int, max_depth: int, tokens, repeats: int,
                               passes: int) -> dict:
    """The costs of a dynamic tree on this machine, timed in ``passes`` separate passes, each over every quantity
    with ``repeats`` timings (``forward_seconds``, ``round_seconds``): v(n) of ``target``'s tree forward (``tree``:
    padded as a compiled one is) for n in ``tokens`` and 1,
    the head's cost per depth (a round of ``max_depth`` levels over ``max_depth``, in the pass's target decode
    steps) and the target's decode step in seconds. Each is the median over the passes; ``spread`` keeps each
    one's [min, median, max] over them."""
    if passes < 1 or repeats < 1:
        raise ValueError(f"need passes and repeats >= 1, got {passes}, {repeats}")
    probe = DynamicTreeDraft(eagle, verify_cost=lambda n: 1.0, head_cost=0.0, top_k=top_k)  # expands every level
    vs, head_costs, steps = [], [], []
    for _ in range(passes):
        seconds = forward_seconds(target, new_tokens=sorted({1, *tokens}), repeats=repeats, tree=True)
        vs.append(relative_to_one_token(seconds))
        head_costs.append(round_seconds(probe, target, max_depth, repeats=repeats) / max_depth / seconds[1])
        steps.append(seconds[1])
    v_spread = {n: min_median_max([v[n] for v in vs]) for n in vs[0]}
    return {"v": {n: s[1] for n, s in v_spread.items()}, "head_cost": statistics.median(head_costs),
            "target_step_seconds": statistics.median(steps), "passes": passes, "repeats": repeats,
            "spread": {"v": v_spread, "head_cost": min_median_max(head_costs),
                       "target_step_seconds": min_median_max(steps)}}


def dynamic_tree_costs_from_json(saved: dict) -> dict:
    """The costs ``measure_dynamic_tree_costs`` measured, as saved in a profile file (token counts as keys)."""
    def triple(values) -> list[float]:
        low, mid, high = map(float, values)
        if not low <= mid <= high:
            raise ValueError(f"a spread must be [min, median, max], got {values}")
        return [low, mid, high]

    v = {int(n): float(x) for n, x in saved["v"].items()}
    spreads = saved["spread"]
    costs = {"v": v, "head_cost": float(saved["head_cost"]), "target_step_seconds": float(saved["target_step_seconds"]),
             "passes": int(saved["passes"]), "repeats": int(saved["repeats"]),
             "spread": {"v": {int(n): triple(s) for n, s in spreads["v"].items()},
                        "head_cost": triple(spreads["head_cost"]),
                        "target_step_seconds": triple(spreads["target_step_seconds"])}}
    if v.get(1) != 1.0 or set(costs["spread"]["v"]) != set(v) or costs["head_cost"] < 0:
        raise ValueError("v must hold v(1) = 1 and a spread for each n, and the head's cost must be >= 0")
    return costs


DEFAULT_COSTS = "default_costs.json"  # in a head's folder: {device class: dynamic-tree costs}, shipped defaults
COMPILED = "-compiled"  # the device class of a target whose forwards run compiled ends so (``device_class``)


def device_class(target) -> str:
    """The kind of device whose shipped default costs apply to ``target``: its device type and dtype
    ("cpu-bfloat16", "cuda-bfloat16", ...), "-int4" where its linear layers run on 4-bit blocks and "-compiled"
    where its forwards run compiled (its tree forwards are padded, its decode step is faster)."""
    settings = machine_settings(target)
    return (f"{settings['device']}-{settings['dtype']}" + ("-int4" if settings["int4"] else "")
            + (COMPILED if settings["cache"].endswith("compiled") else ""))


def measured_dynamic_tree(eagle: EagleDraft, target, top_k: int = 4, max_depth: int = 8, repeats: int = 5,
                          tokens=(1, 2, 4, 8, 16, 32, 64), passes: int = 3, remeasure: bool = False,
                          defaults: dict | None = None) -> DynamicTreeDraft:
    """A ``DynamicTreeDraft`` with this machine's costs: v(n) of ``target`` for n in ``tokens`` (interpolated by
    ``v_at``) and the head's cost per depth, in the target's decode steps, each the median of ``passes`` passes of
    ``repeats`` timings (``measure_dynamic_tree_costs``). A CPU's v(n) climbs early and keeps trees small; a GPU's
    stays near 1 and lets them grow. Measured once per machine and setting and kept in a profile file
    (``instruments.cost_profiles``: under ``paths.cost_profiles_dir()``, keyed by ``dynamic_tree_profile_key``); a later
    call with the same key reads it, and prints one line naming the file. ``remeasure=True``, or deleting the file,
    measures again. ``defaults`` ({device class: costs}, a head folder's ``DEFAULT_COSTS``): where one is given for
    this device class (``device_class``; for a compiled target without its own, the same device's eager class),
    it serves instead of a first measurement, so every run drafts the same trees until ``remeasure=True``
    (``drafts.loading.calibrate``) keeps this machine's costs. The costs, their
    spread over the passes and where they came from (``source`` "measured", "read" or "default", ``file``,
    ``measured_at``, and the ``load_average`` on ``cpus`` then) are kept in ``costs``."""
    key = dynamic_tree_profile_key(eagle, target, top_k, max_depth, tokens, repeats, passes)

    def measure():
        return measure_dynamic_tree_costs(eagle, target, top_k, max_depth, tokens, repeats, passes)

    kind = device_class(target)
    if kind not in (defaults or {}) and kind.endswith(COMPILED):  # none shipped for it: the eager ones serve
        kind = kind.removesuffix(COMPILED)
    costs = kept_or_measured("dynamic-tree", key, measure, dynamic_tree_costs_from_json, remeasure=remeasure,
                             default=(defaults or {}).get(kind), default_name=kind)
    return DynamicTreeDraft(eagle, functools.partial(v_at, costs["v"]), costs["head_cost"], top_k, costs=costs)


class LookupTreeDraft(Drafter):
    """Prompt lookup with up to ``branches`` distinct continuations of the latest earlier matches of the context's
    last n tokens (n from ``max_ngram`` down to ``min_match``), each up to gamma tokens, merged into a trie.
    ``adaptive``: ``min_match`` moves between ``min_ngram`` and ``max_ngram`` (up after a rejected branch, down
    after a fully accepted one)."""

    proposes_trees = True

    def __init__(self, branches: int = 2, max_ngram: int = 3, min_ngram: int = 1, adaptive: bool = False):
        if not 1 <= min_ngram <= max_ngram or branches < 1:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram and branches >= 1, got {min_ngram}, {max_ngram}, {branches}")
        self.branches, self.max_ngram, self.min_ngram, self.adaptive = branches, max_ngram, min_ngram, adaptive
        self.min_match = min_ngram
        self._proposed, self._start = 0, 0

    def continuations(self, seq, lengths, gamma: int) -> list[list[int]]:
        """Distinct continuations (by first token), latest match first, longest n-gram first."""
        L = int(lengths[0])
        row = seq[0, :L]
        found, firsts = [], set()
        for n in range(self.max_ngram, self.min_match - 1, -1):
            if L <= n:
                continue
            key = row[L - n:]
            windows = row.unfold(0, n, 1)[: L - n]  # windows starting at 0..L-n-1: something follows each
            starts = (windows == key).all(-1).nonzero().flatten().tolist()
            for s in reversed(starts):
                cont = row[s + n: s + n + gamma].tolist()
                if cont and cont[0] not in firsts:
                    firsts.add(cont[0])
                    found.append(cont)
                if len(found) == self.branches:
                    return found
        return found

    def grow(self, builder: TreeBuilder, seq, lengths, gamma: int) -> None:
        """Add the lookup branches under the root; the first branch's length is kept for the adaptive update."""
        branches = self.continuations(seq, lengths, gamma)
        for cont in branches:
            builder.add_chain(0, cont)
        self._proposed, self._start = (len(branches[0]) if branches else 0), int(lengths[0])

    def propose_tree(self, seq, lengths, gamma, sampling, generator) -> Tree:
        builder = root_builder(seq, lengths)
        self.grow(builder, seq, lengths, gamma)
        return builder.build()

    def update(self, accepted: int) -> None:
        if not self.adaptive or self._proposed == 0:
            return
        step = -1 if accepted >= self._proposed else 1
        self.min_match = min(self.max_ngram, max(self.min_ngram, self.min_match + step))

    def rollback(self, kept: list[int]) -> None:
        self.update(kept[0] - self._start)


class HybridTreeDraft(Drafter):
    """Lookup branches and an EAGLE head's tree (its chain with siblings, or the dynamic tree) in one tree, merged
    where they agree."""

    uses_target_features = True
    proposes_trees = True

    def __init__(self, lookup: LookupTreeDraft, head: "EagleTreeDraft | DynamicTreeDraft"):
        self.lookup, self.head = lookup, head
        self.vocab_size, self.feature_layers = head.vocab_size, head.feature_layers

    def begin(self, input_ids, padding=None, tokens=None):
        self.head.begin(input_ids, padding)
        self.lookup.begin(input_ids, padding)

    def observe(self, hidden, first_position: int) -> None:
        self.head.observe(hidden, first_position)

    @property
    def forwards(self) -> int:
        return self.head.forwards

    @torch.inference_mode()
    def propose_tree(self, seq, lengths, gamma, sampling, generator) -> Tree:
        builder = root_builder(seq, lengths)
        self.lookup.grow(builder, seq, lengths, gamma)  # the branches that need no model, fixed by the context
        self.head.grow(builder, seq, lengths, gamma, sampling, generator)
        return builder.build()

    def rollback(self, kept: list[int]) -> None:
        self.lookup.rollback(kept)
        self.head.rollback(kept)


class SampledTreeDraft(Drafter):
    """SpecInfer-style sampled tree from a draft model: at every node of depth < ``depth``, ``width`` children
    drawn i.i.d. (with replacement) from q at that node. q is recomputed from scratch for every node (no cache):
    meant for toy models and the exactness tests."""

    proposes_trees = True

    def __init__(self, draft, width: int = 2, depth: int = 2):
        self.lm = as_language_model(draft, role="draft")
        self.vocab_size = self.lm.vocab_size
        self.width, self.depth = width, depth

    def q_after(self, context: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
        """The draft's q (V,) after the 1-D ``context``."""
        self.lm.reset(1)
        return probs_from_logits(self.lm.feed(context[None])[0, -1].double(), sampling)

    def propose_tree(self, seq, lengths, gamma, sampling, generator) -> Tree:
        L = int(lengths[0])
        builder = root_builder(seq, lengths)
        frontier = [(0, seq[0, :L])]
        for _ in range(min(gamma, self.depth)):
            nxt = []
            for node, context in frontier:
                q = self.q_after(context, sampling)
                for token in sample(q.expand(self.width, -1), generator).tolist():  # i.i.d.
                    child = builder.add(node, token, q)
                    nxt.append((child, torch.cat([context, torch.tensor([token])])))
            frontier = nxt
        return builder.build()

    def tree_law(self, context: torch.Tensor, gamma: int, sampling: SamplingParams):
        """Every tree ``propose_tree`` can return after ``context`` (1-D), with its probability (for exact
        enumeration)."""
        levels = min(gamma, self.depth)
        results = [(TreeBuilder(int(context[-1])), [(0, context)], 1.0)]
        for _ in range(levels):
            grown = []
            for builder, frontier, prob in results:
                options = []
                for node, ctx in frontier:
                    q = self.q_after(ctx, sampling)
                    draws = [d for d in itertools.product(range(self.vocab_size), repeat=self.width)
                             if all(q[t] > 0 for t in d)]
                    options.append([(node, ctx, q, d, float(torch.prod(q[list(d)]))) for d in draws])
                for combo in itertools.product(*options):
                    b = builder.copy()
                    new_frontier, pr = [], prob
                    for node, ctx, q, d, pd in combo:
                        pr *= pd
                        for token in d:
                            new_frontier.append((b.add(node, token, q), torch.cat([ctx, torch.tensor([token])])))
                    grown.append((b, new_frontier, pr))
            results = grown
        return [(b.build(), pr) for b, _, pr in results]
