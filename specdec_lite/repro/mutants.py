"""Deliberately broken verifiers, for the mutation check: the unbiasedness tests must reject each of them.

Each mutant is a ``Verifier`` (``core/decode.py``), handed to the loop (``speculative_generate(...,
verifier=...)``) and to the exact enumeration (``exact_speculative_distribution(..., verifier=...)``); nothing is
patched. A mutant breaks either a whole function (the bonus position, the cache slots a tree keeps) or one piece
of the ``Rule`` the verifiers share (the acceptance ratio, the residual). They are never used for generation.
"""
from __future__ import annotations

from functools import partial

import torch

from ..core.decode import Verifier
from ..core.tree import Tree, tree_outcome_distribution, verify_tree
from ..core.verify import Rule, outcome_distribution, verify


def with_rule(rule: Rule) -> Verifier:
    """A verifier whose chain and tree samplers and exact laws all use ``rule``."""
    return Verifier(chain=partial(verify, rule=rule), chain_law=partial(outcome_distribution, rule=rule),
                    tree=partial(verify_tree, rule=rule), tree_law=partial(tree_outcome_distribution, rule=rule))


# ------------------------------------------------------------------------------------------ broken pieces
def residual_from_p(p_row, q_row):
    """Bug: resample from p instead of norm((p - q)+). In a tree: after a rejected sibling, the next one
    competes for the same r again (the residual is never updated)."""
    return p_row / p_row.sum(-1, keepdim=True)


def inverted_ratio(p_x, q_x):
    """Bug: accept with min(1, q/p)."""
    return torch.where(p_x > 0, (q_x / p_x.clamp_min(1e-38)).clamp(max=1.0), torch.zeros_like(p_x))


# ------------------------------------------------------------------------------------------ broken chains
def _bonus_from_position_gamma(p: torch.Tensor) -> torch.Tensor:
    p = p.clone()
    p[:, -1] = p[:, -2]
    return p


def wrong_bonus_verify(drafts, q, p, generator=None):
    """Bug: the bonus token is drawn from p at position gamma (the last draft's) instead of gamma+1."""
    return verify(drafts, q, _bonus_from_position_gamma(p), generator)


def wrong_bonus_outcomes(drafts, q, p):
    return outcome_distribution(drafts, q, _bonus_from_position_gamma(p))


def bonus_after_last_rejection_verify(drafts, q, p, generator=None):
    """Bug: when the last draft is rejected, emit the corrected token and then a bonus from p[:, gamma] too
    (the bonus is conditioned on the rejected draft, not on the corrected token)."""
    n, nxt = verify(drafts, q, p, generator)
    gamma = drafts.shape[1]
    hit = n == gamma - 1
    if gamma and hit.any():
        bonus = torch.multinomial(p[:, gamma].float(), 1, generator=generator).squeeze(-1)
        drafts[hit, gamma - 1] = nxt[hit]  # the corrected token takes the rejected draft's place ...
        n = torch.where(hit, gamma, n)
        nxt = torch.where(hit, bonus, nxt)  # ... and a bonus follows it
    return n, nxt


MUTANTS = {
    "bonus from wrong position": Verifier(chain=wrong_bonus_verify, chain_law=wrong_bonus_outcomes),
    "residual from p": with_rule(Rule(residual=residual_from_p)),
    "inverted ratio q/p": with_rule(Rule(accept=inverted_ratio)),
    "bonus after last-position rejection": Verifier(chain=bonus_after_last_rejection_verify),
}
NO_EXACT_LAW = {"bonus after last-position rejection"}  # its law is not enumerated: the loop alone shows the bug


# ------------------------------------------------------------------------------------------ broken trees
def _leaves_get_parents_p(tree: Tree, p: torch.Tensor) -> torch.Tensor:
    """p with each leaf's row replaced by its parent's (a leaf's row is used only for its bonus token)."""
    p = p.clone()
    for node in range(1, tree.size):
        if not tree.children(node):
            p[node] = p[int(tree.parents[node])]
    return p


def bonus_at_parent_verify(tree, p, generator=None):
    """Bug: a leaf's bonus token is drawn from its parent's p."""
    return verify_tree(tree, _leaves_get_parents_p(tree, p), generator)


def bonus_at_parent_outcomes(tree, p):
    return tree_outcome_distribution(tree, _leaves_get_parents_p(tree, p))


def compaction_keeps_first_slots(path, start):
    """Bug: keeps the first slots after the root instead of the accepted path, so a rejected branch's keys and
    values can stay in the cache."""
    return start + torch.arange(len(path) + 1)


TREE_MUTANTS = {
    "residual not updated between siblings": MUTANTS["residual from p"],
    "inverted ratio q/p": MUTANTS["inverted ratio q/p"],
    "bonus drawn at the parent instead of the accepted leaf": Verifier(tree=bonus_at_parent_verify,
                                                                       tree_law=bonus_at_parent_outcomes),
    "compaction keeps the first slots, not the accepted path": Verifier(keep=compaction_keeps_first_slots),
}
