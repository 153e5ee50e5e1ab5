"""Drafting that rests while it does not pay: ``PacedDraft`` wraps the drafting ``auto`` runs.

Speculative decoding pays only where a round's tokens outnumber its cost in target decode steps. Where the
target's decode step is fast against its verification forward and the head's steps (a 4-bit target compiled on a
CPU: docs/INT4.md), drafting loses to plain decoding, and a user who asked for the recommended setting would be
slower than without it. ``PacedDraft`` prices every drafted round with the same cost model that sizes the dynamic
tree (the machine's v(n) and the head's cost per forward, in decode steps: ``trees.measured_dynamic_tree``) and
counts the tokens the round emitted. Every ``window`` drafted rounds it judges all the generation's drafted rounds
so far: where their tokens fell short of their cost, it rests for ``rest`` rounds, proposing nothing (each is
then a plain decoding step, and the head's features keep arriving, so its first round after the rest catches up
on them in one forward); each further losing judgement doubles the next rest, up to ``longest_rest``, and a paying
judgement resets it. Judging every drafted round so far, not the last few, keeps chance from resting a drafting
that pays on average: at T = 1 the tokens a round keeps vary widely, and a few rounds judged alone fall short of
their cost by chance (docs/INT4.md measures both rules).

Exactness: whether a round drafts is decided from the tokens already emitted and the shipped or calibrated costs,
never from the target's distribution at the round's positions, so every round, drafted or plain, emits from the
target's law (a plain step is one). The costs are numbers, not timings: two processes pace the same prompts alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.drafter import Drafter
from ..core.tree import Tree, TreeBuilder


@dataclass
class Pacing:
    """The resting rule: every ``window`` drafted rounds, judge all the drafted rounds so far; rest ``first_rest``
    plain rounds after a judgement that they cost more decode steps than the tokens they emitted, twice as long
    after each further losing judgement (at most ``longest_rest``)."""

    window: int = 8
    first_rest: int = 16
    longest_rest: int = 256
    tokens: float = field(init=False, default=0.0)  # emitted by the generation's drafted rounds
    cost: float = field(init=False, default=0.0)  # their cost in decode steps
    rounds: int = field(init=False, default=0)
    resting: int = field(init=False, default=0)  # plain rounds left in the current rest
    rest: int = field(init=False, default=0)  # the length of the next rest

    def __post_init__(self):
        if not 1 <= self.window or not 1 <= self.first_rest <= self.longest_rest:
            raise ValueError(f"need window >= 1 and 1 <= first_rest <= longest_rest, got {self}")
        self.begin()

    def begin(self) -> None:
        """A new generation: nothing judged, not resting."""
        self.tokens, self.cost, self.rounds, self.resting, self.rest = 0.0, 0.0, 0, 0, self.first_rest

    @property
    def drafts(self) -> bool:
        return self.resting == 0

    def rested(self) -> None:
        """After a plain round of a rest."""
        self.resting -= 1

    def drafted(self, tokens: float, cost: float) -> None:
        """After a drafted round that emitted ``tokens`` (per running row) and cost ``cost`` decode steps."""
        self.tokens, self.cost, self.rounds = self.tokens + tokens, self.cost + cost, self.rounds + 1
        if self.rounds % self.window:
            return
        if self.tokens < self.cost:
            self.resting, self.rest = self.rest, min(2 * self.rest, self.longest_rest)
        else:
            self.rest = self.first_rest


class PacedDraft(Drafter):
    """``drafter`` (a chain or a tree drafter) resting while it does not pay (``Pacing``). A round's cost is the
    drafter's forwards (``Drafter.forwards``) times ``head_cost`` plus ``verify_cost(n)``, n the tokens the target
    verifies (the drafts and the newest token): the dynamic tree's cost model (``trees.DynamicTreeDraft``), whose v(n)
    is timed through tree forwards (a chain's forward costs no more). A resting round still rolls ``drafter`` back,
    so a drafter that learns from its rollbacks (``trees.AdaptiveLength``, an adaptive lookup) would learn from
    rounds it did not propose: ``auto`` paces drafters without such rules."""

    def __init__(self, drafter: Drafter, verify_cost, head_cost: float, pacing: Pacing | None = None):
        self.drafter, self.verify_cost, self.head_cost = drafter, verify_cost, head_cost
        self.pacing = pacing or Pacing()
        self.vocab_size, self.feature_layers = drafter.vocab_size, drafter.feature_layers
        self.uses_target_features, self.proposes_trees = drafter.uses_target_features, drafter.proposes_trees
        self.context, self.round_cost = [], None  # each row's context length; the last round's cost (None: rested)

    def begin(self, input_ids, padding=None, tokens=None):
        self.drafter.begin(input_ids, padding, tokens)
        self.pacing.begin()
        self.context, self.round_cost = [input_ids.shape[1]] * input_ids.shape[0], None

    def observe(self, hidden, first_position) -> None:
        self.drafter.observe(hidden, first_position)

    def priced(self, forwards: int, verified: int) -> float | None:
        """A drafted round's cost in decode steps: ``forwards`` of the head, then the target's forward over
        ``verified`` tokens; None where nothing was drafted (the first round, whose forward is the prompt's)."""
        if forwards == 0 and verified == 1:
            return None
        return forwards * self.head_cost + self.verify_cost(verified)

    def propose(self, seq, lengths, gamma, sampling, generator):
        if not self.pacing.drafts:
            self.round_cost = None
            return seq.new_zeros(seq.shape[0], 0), None
        drafts, q = self.drafter.propose(seq, lengths, gamma, sampling, generator)
        self.round_cost = self.priced(self.drafter.forwards, drafts.shape[1] + 1)
        return drafts, q

    def propose_tree(self, seq, lengths, gamma, sampling, generator) -> Tree:
        if not self.pacing.drafts:
            self.round_cost = None
            return TreeBuilder(int(seq[0, self.context[0] - 1])).build()  # the root alone: a plain step
        tree = self.drafter.propose_tree(seq, lengths, gamma, sampling, generator)
        self.round_cost = self.priced(self.drafter.forwards, tree.size)
        return tree

    def rollback(self, kept: list[int]) -> None:
        self.drafter.rollback(kept)
        emitted = [k + 1 - before for k, before in zip(kept, self.context)]
        running = [n for n in emitted if n > 0]  # a finished row emits nothing
        if not self.pacing.drafts:
            self.pacing.rested()
        elif self.round_cost is not None and running:
            self.pacing.drafted(sum(running) / len(running), self.round_cost)
        self.context = [k + 1 for k in kept]
