"""Drafting that rests while it does not pay (``drafts.pacing``): the rule, the plain steps it leaves to the loop,
and the head's caches after a rest. Its exact law is checked with the other EAGLE drafts (``test_trees.py``:
auto's shape drafting and resting in turn, enumerated at three temperatures and run 1,000 times at T = 1)."""
import pytest
import torch

import specdec_lite as sd
from specdec_lite.core.lm import HFCausalLM
from specdec_lite.drafts.pacing import PacedDraft, Pacing
from specdec_lite.repro.exact import _primed

from conftest import tiny_llama
from test_heads import random_head_draft
from test_trees import RESTING_AUTO, eagle_tree, in_turn, losing_dynamic_tree

GREEDY = sd.SamplingParams(temperature=0.0)


def test_pacing_judges_every_drafted_round_so_far_rests_doubles_while_losing_and_resets_when_drafting_pays():
    pacing = Pacing(window=2, first_rest=2, longest_rest=8)
    pacing.drafted(3, 2.0)
    assert pacing.drafts  # judged every window rounds only
    pacing.drafted(1, 2.5)  # 4 tokens for 4.5 steps: drafting lost
    assert not pacing.drafts and pacing.resting == 2
    for _ in range(2):
        pacing.rested()
    assert pacing.drafts
    pacing.drafted(1, 2.0), pacing.drafted(1, 2.0)
    assert pacing.resting == 4  # a second losing judgement in a row: twice as long
    for _ in range(4):
        pacing.rested()
    for losing in range(3):
        pacing.drafted(1, 2.0), pacing.drafted(1, 2.0)
        assert pacing.resting == 8  # at most longest_rest
        for _ in range(8):
            pacing.rested()
    pacing.drafted(10, 1.0), pacing.drafted(10, 1.0)  # 32 tokens for 22.5 steps in all: drafting paid
    assert pacing.drafts and pacing.rest == 2  # the next rest is the first one again
    pacing.drafted(1, 8.0), pacing.drafted(1, 8.0)  # 34 for 38.5
    assert pacing.resting == 2
    pacing.begin()
    assert pacing.drafts and pacing.rest == 2 and pacing.rounds == 0 and pacing.tokens == pacing.cost == 0
    pacing.drafted(5, 2.0), pacing.drafted(5, 2.0)
    pacing.drafted(1, 2.0), pacing.drafted(1, 2.0)  # these two lost, the generation's drafting did not
    assert pacing.drafts
    with pytest.raises(ValueError, match="window >= 1"):
        Pacing(window=0)
    with pytest.raises(ValueError, match="first_rest <= longest_rest"):
        Pacing(first_rest=4, longest_rest=2)


class CountingLM(HFCausalLM):
    """The target's wrapper, counting its plain feeds and its tree forwards."""

    def __init__(self, model):
        super().__init__(model)
        self.feeds = self.trees = 0

    def feed(self, *args, **kwargs):
        self.feeds += 1
        return super().feed(*args, **kwargs)

    def feed_tree(self, *args, **kwargs):
        self.trees += 1
        return super().feed_tree(*args, **kwargs)


def test_a_resting_tree_drafter_leaves_plain_steps_and_decodes_what_plain_decoding_does():
    """Auto's shape on costs by which drafting never pays, drafting and resting in turn, greedy: the tokens of plain
    decoding; every second round proposes nothing and runs as a plain feed (no tree forward, so no padded rows on a
    compiled target), the others as tree forwards."""
    target = tiny_llama(vocab=48, layers=2, seed=5)
    prompt = torch.tensor([[1, 7, 3, 9, 4]])
    plain = sd.autoregressive_generate(target, prompt, max_new_tokens=24, sampling=GREEDY)
    lm = CountingLM(target)
    out = sd.speculative_generate(lm, eagle_tree(RESTING_AUTO, target), prompt, gamma=3, max_new_tokens=24,
                                  sampling=GREEDY)
    assert torch.equal(out.tokens, plain.tokens)
    drafted = out.stats.proposed_lengths
    assert drafted[0] == 0 and all(n > 0 for n in drafted[1::2]) and all(n == 0 for n in drafted[2::2])
    assert lm.trees == len(drafted[1::2]) and lm.feeds == len(drafted[::2])


class RecordingPaced(PacedDraft):
    """A paced drafter that keeps each drafted round's context and proposal."""

    def __init__(self, drafter, verify_cost, head_cost, pacing):
        super().__init__(drafter, verify_cost, head_cost, pacing)
        self.seen = []

    def propose_tree(self, seq, lengths, gamma, sampling, generator):
        tree = super().propose_tree(seq, lengths, gamma, sampling, generator)
        if tree.size > 1:
            self.seen.append((seq[0, : self.context[0]].clone(), tree))
        return tree

    def propose(self, seq, lengths, gamma, sampling, generator):
        drafts, q = super().propose(seq, lengths, gamma, sampling, generator)
        if drafts.shape[1]:
            self.seen.append((seq[0, : self.context[0]].clone(), drafts))
        return drafts, q


def test_after_a_rest_the_head_drafts_what_a_fresh_head_drafts_on_the_same_context():
    """The head's features keep arriving while it rests, and its first round after a rest catches up on all of
    them: every tree proposed after a rest (greedy, drafting and resting in turn) is the one a fresh drafter
    proposes when primed with the whole context, and every chain's drafts are the greedy choices of the head's
    cache-free reference. A drafter that skipped the rested positions' features would be refused (``observe``) or
    would draft from a shorter context."""
    target = tiny_llama(vocab=48, layers=2, seed=5)
    prompt = torch.tensor([[1, 7, 3, 9, 4]])

    def hybrid():
        return sd.HybridTreeDraft(sd.LookupTreeDraft(branches=2),
                                  losing_dynamic_tree(random_head_draft(target, "eagle3", seed=3)))

    dynamic = losing_dynamic_tree(random_head_draft(target, "eagle3", seed=3))
    tree = RecordingPaced(hybrid(), dynamic.verify_cost, dynamic.head_cost, in_turn())
    sd.speculative_generate(target, tree, prompt, gamma=3, max_new_tokens=24, sampling=GREEDY)
    assert len(tree.seen) >= 5
    lm = HFCausalLM(target)
    for context, proposed in tree.seen[1:]:  # each after a rest
        again = _primed(lm, hybrid(), context).propose_tree(context[None], torch.tensor([len(context)]), 3, GREEDY,
                                                             None)
        assert again.token_list == proposed.token_list and again.parent_list == proposed.parent_list

    chain = RecordingPaced(random_head_draft(target, "eagle3", seed=3), dynamic.verify_cost, dynamic.head_cost,
                           in_turn())
    sd.speculative_generate(target, chain, prompt, gamma=3, max_new_tokens=24, sampling=GREEDY)
    assert len(chain.seen) >= 5
    for context, drafts in chain.seen[1:]:
        reference = chain.drafter.reference_logits(context, drafts).argmax(-1)
        assert torch.equal(reference, drafts)


def test_a_resting_chain_decodes_a_padded_batch_as_plain_decoding_does():
    """The paced head's chain on a left-padded batch whose rows end at different lengths (an EOS ends one), greedy,
    drafting and resting in turn: each row's tokens are those of its prompt decoded plainly, alone."""
    target = tiny_llama(vocab=48, layers=2, seed=5)
    prompts = [[1, 7, 3, 9, 4], [5, 2]]
    alone = [sd.autoregressive_generate(target, torch.tensor([p]), max_new_tokens=20, sampling=GREEDY).tokens
             for p in prompts]
    target.generation_config.eos_token_id = int(alone[1][6])  # the second row ends early
    ids = torch.tensor([prompts[0], [0, 0, 0, *prompts[1]]])
    mask = torch.tensor([[1] * 5, [0, 0, 0, 1, 1]])
    dynamic = losing_dynamic_tree(random_head_draft(target, "eagle3", seed=3))
    chain = PacedDraft(random_head_draft(target, "eagle3", seed=3), dynamic.verify_cost, dynamic.head_cost,
                       in_turn())
    out = sd.speculative_generate(target, chain, ids, attention_mask=mask, gamma=3, max_new_tokens=20,
                                  sampling=GREEDY)
    assert 0 in out.stats.proposed_lengths[2:]  # it rested
    for row, expected in zip(out.sequences, alone):
        end = (expected == target.generation_config.eos_token_id).nonzero()
        assert torch.equal(row, expected if not len(end) else expected[: int(end[0]) + 1])
