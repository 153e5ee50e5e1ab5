"""Deliberately broken verifiers, for the mutation check: the unbiasedness tests must reject each of them.

Each ``*_verify`` has the signature of ``verify`` (for the loop); each ``*_outcomes`` the signature of
``outcome_distribution`` (for exact enumeration); the two "piece" mutants replace one building block of the
verifier. They are never used for generation.
"""
from __future__ import annotations

import importlib

import torch

_verify = importlib.import_module("specdec_lite.core.verify")


def _bonus_from_position_gamma(p: torch.Tensor) -> torch.Tensor:
    p = p.clone()
    p[:, -1] = p[:, -2]
    return p


def wrong_bonus_verify(drafts, q, p, generator=None):
    """Bug: the bonus token is drawn from p at position gamma (the last draft's) instead of gamma+1."""
    return _verify.verify(drafts, q, _bonus_from_position_gamma(p), generator)


def wrong_bonus_outcomes(drafts, q, p):
    return _verify.outcome_distribution(drafts, q, _bonus_from_position_gamma(p))


def bonus_after_last_rejection_verify(drafts, q, p, generator=None):
    """Bug: when the last draft is rejected, emit the corrected token and then a bonus from p[:, gamma] too
    (the bonus is conditioned on the rejected draft, not on the corrected token)."""
    n, nxt = _verify.verify(drafts, q, p, generator)
    gamma = drafts.shape[1]
    hit = n == gamma - 1
    if gamma and hit.any():
        bonus = torch.multinomial(p[:, gamma].float(), 1, generator=generator).squeeze(-1)
        drafts[hit, gamma - 1] = nxt[hit]  # the corrected token takes the rejected draft's place ...
        n = torch.where(hit, gamma, n)
        nxt = torch.where(hit, bonus, nxt)  # ... and a bonus follows it
    return n, nxt


def residual_from_p(p_row, q_row):
    """Bug (replaces ``residual_distribution``): resample from p instead of norm((p - q)+)."""
    return p_row / p_row.sum(-1, keepdim=True)


def inverted_ratio(p_x, q_x):
    """Bug (replaces ``acceptance_probability``): accept with min(1, q/p)."""
    return torch.where(p_x > 0, (q_x / p_x.clamp_min(1e-38)).clamp(max=1.0), torch.zeros_like(p_x))


# name: (patches for the loop, patches for exact enumeration or None); a patch is (module, attribute, value)
MUTANTS = {
    "bonus from wrong position": ([("specdec_lite.core.decode", "verify", wrong_bonus_verify)],
                                  [("specdec_lite.repro.exact", "outcome_distribution", wrong_bonus_outcomes)]),
    "residual from p": ([("specdec_lite.core.verify", "residual_distribution", residual_from_p)],
                        [("specdec_lite.core.verify", "residual_distribution", residual_from_p)]),
    "inverted ratio q/p": ([("specdec_lite.core.verify", "acceptance_probability", inverted_ratio)],
                           [("specdec_lite.core.verify", "acceptance_probability", inverted_ratio)]),
    "bonus after last-position rejection": ([("specdec_lite.core.decode", "verify", bonus_after_last_rejection_verify)],
                                            None),
}


class patched:
    """Context manager applying a mutant's patches, restoring the originals on exit."""

    def __init__(self, patches):
        self.patches = [(importlib.import_module(m), name, value) for m, name, value in patches or []]

    def __enter__(self):
        self.saved = [(module, name, getattr(module, name)) for module, name, _ in self.patches]
        for module, name, value in self.patches:
            setattr(module, name, value)
        return self

    def __exit__(self, *exc):
        for module, name, value in reversed(self.saved):
            setattr(module, name, value)
        return False


# ------------------------------------------------------------------------------------------ token-tree mutants


def residual_not_updated(r, p_node, q_c):
    """Bug (replaces ``tree.sibling_residual``): after a rejected sibling, the next one competes for r again."""
    return r


def siblings_against_p(r, p_node, q_c):
    """Bug: each sibling's residual is taken from the node's p, forgetting earlier rejected siblings, so a
    repeated sibling gets the same chance twice."""
    return _verify.residual_distribution(p_node.to(r.dtype), q_c)


def bonus_at_parent(tree, p, node):
    """Bug (replaces ``tree.node_distribution``): a leaf's bonus token is drawn from its parent's p."""
    return p[int(tree.parents[node])] if node > 0 and not tree.children(node) else p[node]


def compaction_keeps_first_slots(path, start):
    """Bug (replaces ``tree.compact_indices``): keeps the first slots after the root instead of the accepted path,
    so a rejected branch's keys and values can stay in the cache."""
    return start + torch.arange(len(path) + 1)


_TREE = "specdec_lite.core.tree"
TREE_MUTANTS = {  # name: patches, for the loop and exact enumeration alike
    "residual not updated between siblings": [(_TREE, "sibling_residual", residual_not_updated)],
    "siblings tried against p (a repeated sibling counted twice)": [(_TREE, "sibling_residual", siblings_against_p)],
    "bonus drawn at the parent instead of the accepted leaf": [(_TREE, "node_distribution", bonus_at_parent)],
    "compaction keeps the first slots, not the accepted path": [("specdec_lite.core.decode", "compact_indices",
                                                                 compaction_keeps_first_slots)],
}
