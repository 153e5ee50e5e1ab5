"""Token trees on the static cache (preallocated, the path that compiles and, on a GPU, replays CUDA graphs): the
tree forward and its compaction, auto's greedy identity, the exact law and the chi-square through it, the features
a head keeps after every tree round (both caches), and compiled forwards that stay compiled."""
import pytest
import torch
import torch._dynamo.utils

import specdec_lite as sd
from specdec_lite.core import tree as tree_module
from specdec_lite.core.drafter import ModelDraft
from specdec_lite.core.lm import TREE_ROWS, static_state, use_static_cache
from specdec_lite.drafts.trees import HybridTreeDraft, LookupTreeDraft
from specdec_lite.repro.mutants import TREE_MUTANTS

from conftest import tiny_llama
from test_heads import random_head_draft
from test_trees import (_hand_tree_round, _repetitive_prompt, auto_shape, check_sampled_tree_law, resting_auto_shape,
                        small_dynamic_tree)

GREEDY = sd.SamplingParams(temperature=0)


def static(model, max_length=256, compile=False):
    return use_static_cache(model, max_length=max_length, compile=compile)


def test_a_tree_round_on_the_static_cache_keeps_the_cache_true():
    """The hand-made lookup-tree round of test_trees, on a static cache: after a compaction that keeps a later
    branch the cache gives a fresh recompute's logits; a compaction that keeps the first slots is caught."""
    target = static(tiny_llama(vocab=48, layers=3, seed=4), max_length=64)
    nxt, fresh = _hand_tree_round(target, tree_module.compact_indices)
    assert torch.allclose(nxt, fresh, atol=1e-4)
    broken = TREE_MUTANTS["compaction keeps the first slots, not the accepted path"]
    nxt, fresh = _hand_tree_round(target, broken.keep)
    assert not torch.allclose(nxt, fresh, atol=1e-2)


@pytest.mark.parametrize("drafting", ["lookup tree", "auto"])
def test_trees_on_the_static_cache_give_plain_greedy_decoding(drafting):
    """float32: lookup trees with several branches, and auto's greedy drafting (lookup branches and EAGLE-2's
    dynamic tree on a random head), on the static cache give the tokens of plain greedy decoding, twice over the
    same preallocated tensors."""
    target = tiny_llama(vocab=48, layers=3, seed=4)
    prompt = _repetitive_prompt()
    want = sd.autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY).tokens
    static(target)
    for _ in range(2):
        drafter = (LookupTreeDraft(branches=3, max_ngram=2) if drafting == "lookup tree"
                   else auto_shape(random_head_draft(target, "eagle3", seed=3)))
        out = sd.speculative_generate(target, drafter, prompt, gamma=3, max_new_tokens=40, sampling=GREEDY)
        assert torch.equal(out.tokens, want)
        assert max(out.stats.proposed_lengths) > max(out.stats.tree_depths)  # some round really branched
    assert list(static_state(target).caches) == [("target", 1, 256)]  # one preallocated cache, used twice


def test_the_tree_law_through_the_static_cache():
    """test_trees' checks of a sampled tree at T = 1 (``check_sampled_tree_law``: the exact law in float64 to 1e-9,
    and a chi-square over 2,000 runs of the loop with power > 0.99 against a mask left open among the nodes), through
    the tree forward on the static cache (the mask spans the preallocated length)."""
    check_sampled_tree_law(static(tiny_llama(vocab=3, layers=2, seed=11), max_length=32),
                           static(tiny_llama(vocab=3, layers=2, seed=11).double(), max_length=32))


class ShiftedFeatures(HybridTreeDraft):
    """A deliberately wrong drafter: it keeps the target's features one row late (a silent loss of acceptance, not
    of exactness)."""

    def observe(self, hidden, first_position):
        super().observe(torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1), first_position)


def feature_errors(target, drafting=HybridTreeDraft) -> list[float]:
    """auto's greedy drafting (lookup branches and the dynamic tree on a random head) on ``target``: after every
    round, the largest difference between the features the head keeps and a fresh forward's over the emitted
    text (``FeatureDraft.context_features``); the head must keep every position but the newest token's."""
    eagle = random_head_draft(tiny_llama(vocab=48, layers=3, seed=4), "eagle3", seed=3)
    prompt, errors = _repetitive_prompt(), []

    def check(emitted):  # the last round's text is cut at max_new_tokens: its features reach further
        context = torch.cat([prompt, emitted[0]])
        kept = eagle.features.shape[1]
        assert kept == len(context) - 1 or (kept > len(context) - 1 and len(emitted[0]) == 30)
        with torch.inference_mode():
            fresh = eagle.context_features(context, 1)
        errors.append(float((eagle.features[:, : fresh.shape[1]] - fresh).abs().max()))

    drafter = drafting(LookupTreeDraft(branches=2), small_dynamic_tree(eagle))
    out = sd.speculative_generate(target, drafter, prompt, gamma=3, max_new_tokens=30, sampling=GREEDY,
                                  on_round=check)
    assert max(out.stats.proposed_lengths) > max(out.stats.tree_depths)  # some round really branched
    return errors


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_the_features_a_head_keeps_after_every_tree_round_are_the_targets(cache):
    """float32, after every round of auto's greedy drafting: the head's kept features equal a fresh forward's hidden
    states to 1e-4; a drafter that keeps them one row late is caught."""
    target = tiny_llama(vocab=48, layers=3, seed=4)
    if cache == "static":
        static(target)
    errors = feature_errors(target)
    assert len(errors) > 3 and max(errors) < 1e-4
    assert max(feature_errors(target, ShiftedFeatures)) > 1e-2


def compiled_frames() -> tuple[int, int]:
    """(frames compiled, distinct graphs) so far, from torch._dynamo's counters: a recompilation adds a frame."""
    counters = torch._dynamo.utils.counters
    return counters["frames"]["ok"], counters["stats"]["unique_graphs"]


def test_compiled_forwards_stay_compiled_over_200_rounds():
    """compile=True (inductor on the CPU; CUDA graphs on a GPU), float32, gamma 2: plain decoding, a chain drafted by
    a small model, auto's greedy trees (padded to the node budget ``TREE_ROWS``) and auto's shape drafting and
    resting in turn. After one warm-up run of each, 200 rounds more recompile nothing, and the target's compiled
    shapes are at most gamma + 3 (the EAGLE head's, compiled beside it with dynamic sizes, are one per kind of shape
    its compile log announced, at most 4), with one graph for every one-token forward (plain steps, resting rounds);
    the tokens are plain greedy decoding's."""
    target, gamma = tiny_llama(vocab=48, layers=1, seed=4), 2
    prompt = _repetitive_prompt()
    want = sd.autoregressive_generate(target, prompt, max_new_tokens=120, sampling=GREEDY).tokens
    static(target, max_length=256, compile=True)
    chain = ModelDraft(tiny_llama(vocab=48, layers=1, seed=5))
    eagle = random_head_draft(target, "eagle", seed=3)  # one feature layer: the 1-layer target has few
    tree, resting = auto_shape(eagle), resting_auto_shape(eagle)
    torch._dynamo.reset()
    before = compiled_frames()
    assert torch.equal(sd.autoregressive_generate(target, prompt, max_new_tokens=120, sampling=GREEDY).tokens, want)
    for drafter in (chain, tree, resting):  # warm-up: every shape the runs below use
        assert torch.equal(sd.speculative_generate(target, drafter, prompt, gamma=gamma, max_new_tokens=120,
                                                   sampling=GREEDY).tokens, want)
    warm = compiled_frames()
    assert len({shape for shape in static_state(target).log.seen if shape[2] == 1}) == 1
    rounds = 0
    while rounds < 200:
        for drafter in (chain, tree, resting):
            out = sd.speculative_generate(target, drafter, prompt, gamma=gamma, max_new_tokens=120, sampling=GREEDY)
            assert torch.equal(out.tokens, want)
            rounds += len(out.stats.accepted_lengths)
    assert compiled_frames() == warm, "a forward recompiled after warm-up"
    head_graphs = len(eagle.head.compile_log.seen)
    assert 0 < head_graphs <= 4 and 0 < warm[1] - before[1] - head_graphs <= gamma + 3, (warm, head_graphs)
    assert len(TREE_ROWS) <= 3
