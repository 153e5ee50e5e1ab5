"""Draft proposers behind one interface.

``begin(input_ids, padding=None, tokens=None)`` prepares for new prompts (``padding``: each row's count of left
pads, Python ints, or None when no row has any; ``tokens``: the most a row of the loop's buffer will hold);
``propose(seq, lengths, gamma, sampling, generator)`` returns ``(tokens (B, k), q)`` with k <= gamma and q (B, k, V) the distribution each token was drawn from, or None for
point-mass drafts; ``rollback(kept)`` tells the drafter that row b's context is now ``seq[b, :kept[b] + 1]`` and
that its cache may keep at most the first ``kept[b]`` tokens (the newest token has not been fed to anyone).

``seq`` (B, T) is the loop's token buffer; row b is valid up to ``lengths[b]`` ((B,), on seq's device). ``kept``
is a list of Python ints: the loop knows its lengths on the host, and a drafter that needs its context's length
as a number takes it from ``begin`` and ``rollback`` rather than reading ``lengths`` (on a GPU a read waits for the
device).

Feature-level drafts (``drafts/heads.py``) set ``uses_target_features``; the loop then also calls
``observe(hidden, first_position)`` after each target forward with the target's hidden states at the drafter's
``feature_layers`` (B, n, layers x H) of the positions it fed, ``first_position`` onwards: a list of ints from a
chain round (row b's first fed position; rows of a batch may start at different positions), an int from a tree
round (batch 1). The rollback that follows says which of them were kept.
"""
from __future__ import annotations

import copy
from typing import Protocol

import torch

from .lm import LanguageModel, as_language_model, feed_unseen
from .sampling import SamplingParams, probs_from_logits, sample, seen_mask


class Drafter:
    """Base class: a draft that proposes nothing (every round is then a plain target step)."""

    vocab_size: int | None = None
    uses_target_features = False
    feature_layers = (-1,)  # with uses_target_features: the target's hidden states it reads (-1: the last)
    proposes_trees = False  # True: the loop calls propose_tree(seq, lengths, gamma, sampling, generator) -> Tree
    forwards = 0  # the draft model's forwards in the last proposal (``drafts.pacing`` prices a round with them)

    def begin(self, input_ids: torch.Tensor, padding: list[int] | None = None, tokens: int | None = None) -> None:
        pass

    def observe(self, hidden: torch.Tensor, first_position: int | list[int]) -> None:
        pass

    def propose(self, seq, lengths, gamma, sampling, generator):
        return seq.new_zeros(seq.shape[0], 0), None

    def rollback(self, kept: list[int]) -> None:
        pass

    def at(self, sampling: SamplingParams) -> "Drafter":
        """The drafter that proposes under ``sampling``, asked once per generation: itself (``ByTemperature``
        holds one for greedy decoding and one for T > 0)."""
        return self


class ByTemperature(Drafter):
    """Two draftings for one target: ``greedy`` for greedy decoding, ``sampled`` for T > 0 (``load_draft("auto")``,
    built by ``drafts.loading.auto_draft``: a tree greedy, a chain at T > 0). The loop and the exact enumeration run
    the one ``at`` returns for the whole generation, so the two may share a head's caches; exactness is each one's
    own."""

    def __init__(self, greedy: Drafter, sampled: Drafter):
        self.greedy, self.sampled = greedy, sampled

    def at(self, sampling: SamplingParams) -> Drafter:
        return self.greedy if sampling.greedy else self.sampled

    def begin(self, input_ids: torch.Tensor, padding: list[int] | None = None, tokens: int | None = None) -> None:
        raise TypeError("ByTemperature holds two draftings: run the one at(sampling) returns "
                        "(speculative_generate does)")


def confidence_of(logits: torch.Tensor, sampling: SamplingParams | None = None) -> float:
    """How sure the draft is of its next token, known before the target runs (the least over the rows of a
    batch): its probability of its most likely token under its untempered softmax; given ``sampling`` at T > 0,
    exp(-H(q)) instead, q its sampling distribution (1 for a certain token, 1/k for k equally likely ones), since
    a sampled draft is accepted less often the more spread q is."""
    if sampling is None or sampling.greedy:
        return float(torch.softmax(logits.float(), dim=-1).max(-1).values.min())
    q = probs_from_logits(logits.float(), sampling)
    entropy = -(q * q.clamp_min(1e-30).log()).sum(-1)
    return float(torch.exp(-entropy).min())


class LengthPolicy(Protocol):
    """When a drafter stops within a round (``drafts.trees.AdaptiveLength``): ``keep_going`` reads the draft's
    next-token logits before it drafts from them; ``update`` learns from how many proposed tokens were kept."""

    def keep_going(self, logits: torch.Tensor, sampling: SamplingParams) -> bool: ...

    def update(self, proposed: int, accepted: int) -> None: ...


def stops_here(policy: LengthPolicy | None, logits: torch.Tensor, sampling: SamplingParams) -> bool:
    """The adaptive stop, before drafting from ``logits`` (B, V): a policy is given and it says stop."""
    return policy is not None and not policy.keep_going(logits, sampling)


def draw(logits, seq, lengths, drafted: list, sampling: SamplingParams, generator):
    """One draft token per row from next-token logits (B, V), after the tokens ``drafted`` so far this round:
    (token (B,), the distribution q (B, V) it was drawn from, under the same sampling settings as the target)."""
    seen = None
    if sampling.repetition_penalty != 1.0:
        so_far = torch.stack(drafted, 1) if drafted else seq.new_zeros(seq.shape[0], 0)
        seen = seen_mask(seq, lengths, so_far, logits.shape[-1])[:, -1]
    q = probs_from_logits(logits, sampling, seen)
    # greedy q is one-hot: its argmax is the draw, without a multinomial over the whole vocabulary; a drawn q is
    # checked by the verifier, with the round's read (``verify``)
    return (q.argmax(-1) if sampling.greedy else sample(q, generator, check=False)), q


class ModelDraft(Drafter):
    """An independent draft model with its own KV cache: samples gamma tokens autoregressively from q. Its
    context's length is what ``begin`` and ``rollback`` say, kept in Python ints."""

    def __init__(self, model, adaptive: LengthPolicy | None = None):
        self.lm = as_language_model(model, role="draft")
        self.vocab_size = self.lm.vocab_size
        self.adaptive = adaptive  # when to stop drafting within a round (None: always gamma tokens)
        self._proposed, self._start, self._context = 0, None, []

    def begin(self, input_ids: torch.Tensor, padding: list[int] | None = None, tokens: int | None = None) -> None:
        self.lm.reset(input_ids.shape[0], padding=padding, tokens=tokens)  # it masks the pads, as the target does
        self._context = [input_ids.shape[1]] * input_ids.shape[0]  # buffer lengths: the pads count

    def propose(self, seq, lengths, gamma, sampling: SamplingParams, generator):
        # catch up on what the cache has not seen: the prompt in the first round (the prefill), then 1 token
        # after a rejection or 2 after a full acceptance
        logits = feed_unseen(self.lm, seq, self._context, num_logits=1)[:, -1]  # (B, V)
        tokens, qs = [], []
        for i in range(gamma):
            if stops_here(self.adaptive, logits, sampling):
                break  # the draft's own probability of its next token is too low: stop here
            x_i, q_i = draw(logits, seq, lengths, tokens, sampling, generator)
            tokens.append(x_i)
            qs.append(q_i)
            if i < gamma - 1:
                logits = self.lm.feed(x_i[:, None])[:, -1]
        self._proposed, self._start, self.forwards = len(tokens), list(self._context), 1 + min(len(tokens), gamma - 1)
        if not tokens:
            return seq.new_zeros(seq.shape[0], 0), None
        return torch.stack(tokens, 1), torch.stack(qs, 1)

    def rollback(self, kept: list[int]) -> None:
        if self.adaptive is not None and self._start is not None:
            self.adaptive.update(self._proposed, min(k - start for k, start in zip(kept, self._start)))
        self.lm.crop([min(have, k) for have, k in zip(self.lm.cache_lengths(), kept)])
        self._context = [k + 1 for k in kept]


def as_drafter(draft, target=None) -> Drafter:
    """Drafter objects pass through; models (Hugging Face or toy) become a ``ModelDraft``. A wrapper object
    given as both target and draft is copied, so that each role has its own cache."""
    if isinstance(draft, Drafter):
        return draft
    if isinstance(draft, LanguageModel) and draft is target:
        return ModelDraft(copy.copy(draft))
    if isinstance(draft, LanguageModel) or isinstance(draft, torch.nn.Module):
        return ModelDraft(draft)
    raise TypeError(f"draft must be a Hugging Face causal LM, a toy model or a Drafter, got {type(draft).__name__}")
