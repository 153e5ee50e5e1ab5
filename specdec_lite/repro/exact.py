"""Exact laws by enumeration, for small vocabularies (toy models, tiny models).

``exact_speculative_distribution`` walks every branch of the speculative loop (every draft sequence, every
verifier outcome, round after round) and returns the exact probability of each possible sequence of the first
n emitted tokens. It uses the loop's own pieces: the model wrappers, ``probs_from_logits`` and the exact laws of
the loop's ``Verifier`` (built from the same acceptance and residual functions its samplers use).
``exact_target_distribution`` gives the target's own law of the first n tokens. Equal laws = lossless (C1).
Feature-level drafts (``heads.py``) are enumerated through their cache-free ``reference_distributions``, and a
tree drafter that draws its nodes through its ``tree_law`` (SpecInfer's sampled trees); a tree drafter that chooses
its nodes is primed with the target's features, as the loop leaves it, and asked for its one tree. The tests hold
the live drafters to these references.
"""
from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from dataclasses import astuple

import torch

from ..core.decode import EXACT, Verifier
from ..core.drafter import Drafter, ModelDraft, stops_here
from ..core.lm import as_language_model
from ..core.sampling import SamplingParams, probs_from_logits, seen_mask
from ..core.tree import TreeBuilder
from ..drafts.pacing import PacedDraft


def _probs_after(lm, contexts: torch.Tensor, n_positions: int, sampling: SamplingParams) -> torch.Tensor:
    """Next-token probabilities at the last n_positions of each row of contexts (B, L): (B, n_positions, V),
    position j conditioned on contexts[:, :L - n_positions + j + 1] (with its own repetition-penalty prefix)."""
    B, L = contexts.shape
    lm.reset(B)
    logits = lm.feed(contexts)[:, -n_positions:]
    seen = None
    if sampling.repetition_penalty != 1.0:
        prefix_len = torch.full((B,), L - n_positions + 1, dtype=torch.long)
        seen = seen_mask(contexts, prefix_len, contexts[:, L - n_positions + 1:], lm.vocab_size)
    return probs_from_logits(logits.double(), sampling, seen)


def exact_target_distribution(target, prompt, n: int, sampling: SamplingParams = SamplingParams()) -> dict:
    """{tuple of the first n tokens: probability} when the target samples them itself."""
    lm = as_language_model(target)
    V = lm.vocab_size
    prompt = torch.as_tensor(prompt).long().flatten()
    seqs = torch.tensor(list(itertools.product(range(V), repeat=n)), dtype=torch.long)  # (V^n, n)
    contexts = torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1)
    p = _probs_after(lm, contexts[:, :-1], n, sampling)  # (V^n, n, V)
    probs = p.gather(-1, seqs.unsqueeze(-1)).squeeze(-1).prod(dim=1)
    return {tuple(s.tolist()): float(pr) for s, pr in zip(seqs, probs) if pr > 0}


def _node_probs(target_lm, context: torch.Tensor, tree, sampling: SamplingParams) -> torch.Tensor:
    """(n, V): the target's distribution at every node of ``tree`` grown after ``context`` (node 0 = its last
    token), each computed from scratch on the context plus the node's path."""
    rows = []
    for node in range(tree.size):
        path = torch.tensor([int(tree.tokens[i]) for i in tree.path_to(node)], dtype=torch.long)
        rows.append(_probs_after(target_lm, torch.cat([context, path])[None], 1, sampling)[0, 0])
    return torch.stack(rows)


def _primed(target_lm, draft, context: torch.Tensor):
    """A feature-level drafter as the loop leaves it before a round from ``context``: the target has run over all
    of it but its newest token, and the drafter has seen those features."""
    target_lm.reset(1)
    _, hidden = target_lm.feed(context[None, :-1], hidden_layers=draft.feature_layers)
    draft.begin(context[None])
    draft.observe(hidden, 0)
    return draft


def _proposed_trees(target_lm, draft, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                    first_round: bool) -> list:
    """[(tree, probability)] a tree drafter can propose in a round from ``context``: the bare root in a feature
    drafter's first round (the prefill), ``tree_law`` for drafters that draw, else the one tree it proposes."""
    features = getattr(draft, "uses_target_features", False)
    if first_round and features:
        return [(TreeBuilder(int(context[-1])).build(), 1.0)]
    if getattr(draft, "tree_law", None) is not None:
        return draft.tree_law(context, gamma, sampling)
    if features:
        draft = _primed(target_lm, draft, context)
    return [(draft.propose_tree(context[None], torch.tensor([len(context)]), gamma, sampling, None), 1.0)]


def _tree_round_outcomes(target_lm, draft, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                         first_round: bool, verifier: Verifier):
    """Every (emitted tokens, probability) of one token-tree round: over the trees the drafter can propose and
    the verifier's outcomes."""
    trees = _proposed_trees(target_lm, draft, context, gamma, sampling, first_round)
    out = defaultdict(float)
    for tree, weight in trees:
        for tokens, pr in verifier.tree_law(tree, _node_probs(target_lm, context, tree, sampling)).items():
            out[tokens] += weight * pr
    return out


def _adaptive_proposals(draft: ModelDraft, context: torch.Tensor, gamma: int, sampling: SamplingParams):
    """Every proposal (tokens, q rows, probability) of a model draft with an adaptive length, at its current
    threshold: it stops before token i when its untempered probability of its best token is below the threshold."""
    found = []

    def extend(tokens: list, qs: list, prob: float):
        draft.lm.reset(1)
        logits = draft.lm.feed(torch.cat([context, torch.tensor(tokens, dtype=torch.long)])[None])[0, -1]
        if len(tokens) == gamma or stops_here(draft.adaptive, logits[None], sampling):
            found.append((tokens, qs, prob))
            return
        q = probs_from_logits(logits.double(), sampling)
        for v in q.nonzero().flatten().tolist():
            extend(tokens + [v], qs + [q], prob * float(q[v]))

    extend([], [], 1.0)
    return found


def _adaptive_round_outcomes(target_lm, draft: ModelDraft, context, gamma: int, sampling: SamplingParams,
                             verifier: Verifier):
    out = defaultdict(float)
    for tokens, qs, weight in _adaptive_proposals(draft, context, gamma, sampling):
        drafts = torch.tensor([tokens], dtype=torch.long).reshape(1, len(tokens))
        q = torch.stack(qs)[None] if qs else None
        p = _probs_after(target_lm, torch.cat([context[None], drafts], dim=1), len(tokens) + 1, sampling)
        law = verifier.chain_law(drafts, q, p)[0] * weight  # (k+1, V)
        for n_acc, v in law.nonzero().tolist():
            out[tuple(tokens[:n_acc]) + (v,)] += float(law[n_acc, v])
    return out


def _round_outcomes(target_lm, draft, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                    first_round: bool, verifier: Verifier):
    """Every (emitted tokens, probability) of one round from ``context`` (1-D)."""
    V = target_lm.vocab_size
    if getattr(draft, "proposes_trees", False):
        return _tree_round_outcomes(target_lm, draft, context, gamma, sampling, first_round, verifier)
    if isinstance(draft, ModelDraft) and draft.adaptive is not None:
        return _adaptive_round_outcomes(target_lm, draft, context, gamma, sampling, verifier)
    if getattr(draft, "uses_target_features", False):  # heads.py: q from a cache-free reference computation
        g = 0 if first_round else draft.proposal_length(gamma)
        if g == 0:  # the first round is the prefill: nothing is proposed
            drafts, q, weights = torch.zeros(1, 0, dtype=torch.long), None, torch.ones(1, dtype=torch.float64)
        else:
            drafts = torch.tensor(list(itertools.product(range(V), repeat=g)), dtype=torch.long)
            q = draft.reference_distributions(context, drafts, sampling).double().cpu()
            weights = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).prod(dim=1)
    elif isinstance(draft, Drafter):  # deterministic (point-mass) draft: one proposal, q = None
        seq, lengths = context[None, :], torch.tensor([len(context)])
        drafts, q = draft.propose(seq, lengths, gamma, sampling, None)
        if q is not None:
            raise TypeError("enumeration supports model drafts (give the model) and point-mass drafters")
        weights = torch.ones(1, dtype=torch.float64)
    else:  # a model draft: enumerate all V^gamma proposals, weighted by the probability q gives them
        drafts = torch.tensor(list(itertools.product(range(V), repeat=gamma)), dtype=torch.long)
        contexts = torch.cat([context.expand(len(drafts), -1), drafts[:, :-1]], dim=1)
        q = _probs_after(as_language_model(draft), contexts, gamma, sampling)  # (V^g, g, V)
        weights = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).prod(dim=1)
    k = drafts.shape[1]
    p = _probs_after(target_lm, torch.cat([context.expand(len(drafts), -1), drafts], dim=1), k + 1, sampling)
    law = verifier.chain_law(drafts, q, p) * weights[:, None, None]  # (N, k+1, V)
    out = defaultdict(float)
    for i, n_acc, v in law.nonzero().tolist():
        out[tuple(drafts[i, :n_acc].tolist()) + (v,)] += float(law[i, n_acc, v])
    return out


def _paced_round_cost(target_lm, paced: PacedDraft, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                      first_round: bool) -> float | None:
    """The cost ``paced`` gives a drafted round from ``context`` (None: the first round, the prefill, not judged):
    a choosing tree drafter is asked for its one tree; an EAGLE chain runs one head forward per draft."""
    drafter = paced.drafter
    if first_round:
        return None
    if drafter.proposes_trees:
        (tree, _), = _proposed_trees(target_lm, drafter, context, gamma, sampling, first_round)
        return paced.priced(drafter.forwards, tree.size)
    drafts = drafter.proposal_length(gamma)
    return paced.priced(drafts, drafts + 1)


def exact_speculative_distribution(target, draft, prompt, gamma: int, n: int,
                                   sampling: SamplingParams = SamplingParams(), verifier: Verifier = EXACT) -> dict:
    """{tuple of the first n emitted tokens: probability} under speculative decoding with ``verifier`` (the exact
    one unless a test hands in a broken one), over all branches. A ``PacedDraft`` is followed branch by branch: its
    resting rounds are plain steps, and each branch keeps its own pacing state."""
    target_lm = as_language_model(target)
    if isinstance(draft, Drafter):
        draft = draft.at(sampling)  # the drafting that runs under this sampling (``ByTemperature``)
    paced, start = (draft, copy.copy(draft.pacing)) if isinstance(draft, PacedDraft) else (None, None)
    if start is not None:
        start.begin()
    prompt = tuple(torch.as_tensor(prompt).long().flatten().tolist())
    # (emitted so far, its pacing state as a tuple) -> (that state, probability), for branches short of n tokens
    frontier = {((), None if start is None else astuple(start)): (start, 1.0)}
    result = defaultdict(float)
    while frontier:
        nxt = {}
        for (emitted, _), (pacing, prob) in frontier.items():
            context = torch.tensor(prompt + emitted, dtype=torch.long)
            if pacing is not None and not pacing.drafts:  # a resting round: a plain step
                p = _probs_after(target_lm, context[None], 1, sampling)[0, 0]
                outcomes, cost = {(v,): float(p[v]) for v in p.nonzero().flatten().tolist()}, None
            else:
                outcomes = _round_outcomes(target_lm, draft if paced is None else paced.drafter, context, gamma,
                                           sampling, not emitted, verifier)
                cost = None if paced is None else _paced_round_cost(target_lm, paced, context, gamma, sampling,
                                                                    not emitted)
            for tokens, pr in outcomes.items():
                longer = emitted + tokens
                if len(longer) >= n:
                    result[longer[:n]] += prob * pr
                    continue
                after = None if pacing is None else copy.copy(pacing)
                if after is not None and not after.drafts:
                    after.rested()
                elif after is not None and cost is not None:
                    after.drafted(len(tokens), cost)
                key = (longer, None if after is None else astuple(after))
                nxt[key] = (after, nxt.get(key, (None, 0.0))[1] + prob * pr)
        frontier = nxt
    return dict(result)


def total_variation(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def max_abs_difference(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
