"""Token trees and adaptive draft length: exact laws, the real loop, broken verifiers, caches, greedy identity."""
import numpy as np
import pytest
import torch

import specdec_lite as sd
from specdec_lite.core import tree as tree_module
from specdec_lite.core.decode import EXACT
from specdec_lite.core.drafter import ByTemperature, ModelDraft
from specdec_lite.core.tree import Tree, TreeBuilder, tree_outcome_distribution
from specdec_lite.drafts.trees import (AdaptiveLength, DynamicTreeDraft, EagleTreeDraft, HybridTreeDraft,
                                      LookupTreeDraft, best_budget, SampledTreeDraft, measured_dynamic_tree)
from specdec_lite.drafts.loading import auto_draft
from specdec_lite.drafts.pacing import PacedDraft, Pacing
from specdec_lite.repro.exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference
from specdec_lite.repro.mutants import TREE_MUTANTS
from specdec_lite.repro.stats import chi_square_power, chi_square_pvalue
from specdec_lite.repro.toy import random_pair

from conftest import DEVICE, tiny_llama

SETTINGS = [sd.SamplingParams(temperature=1.0), sd.SamplingParams(temperature=0.7, top_k=3, top_p=0.9),
            sd.SamplingParams(temperature=0.0)]
PROMPT = [0, 1, 0, 1, 2]  # repeats, so lookup drafts find matches


def toy(vocab=4, seed=3):
    return random_pair(vocab=vocab, concentration=0.7, seed=seed)


@pytest.mark.parametrize("sampling", SETTINGS, ids=["T1", "T0.7-topk-topp", "greedy"])
@pytest.mark.parametrize("kind", ["lookup tree", "sampled tree", "adaptive chain"])
def test_exact_law_of_first_three_tokens(kind, sampling):
    """Every branch enumerated: the law of the first 3 emitted tokens equals the target's to 1e-9."""
    target, draft = toy(vocab=3) if kind == "sampled tree" else toy()  # sampled trees: every draw enumerated
    drafters = {"lookup tree": lambda: LookupTreeDraft(branches=2, max_ngram=2),
                "sampled tree": lambda: SampledTreeDraft(draft, width=2, depth=2),
                "adaptive chain": lambda: ModelDraft(draft, adaptive=AdaptiveLength(threshold=0.45, step=0.0))}
    want = exact_target_distribution(target, PROMPT, 3, sampling)
    got = exact_speculative_distribution(target, drafters[kind](), PROMPT, gamma=2, n=3, sampling=sampling)
    assert abs(sum(got.values()) - 1) < 1e-9
    assert max_abs_difference(got, want) < 1e-9


@pytest.mark.parametrize("entropy", [False, True], ids=["top token", "entropy"])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.6, 1.0])
def test_adaptive_length_exact_at_every_threshold(threshold, entropy):
    """The adaptive rule is exact at any threshold, including one that proposes nothing (1.0) or everything (0.0),
    whether it reads the top token's probability or q's entropy; the threshold moving between rounds is a function
    of past rounds only, so each round is one of these cases."""
    target, draft = toy(seed=5)
    drafter = ModelDraft(draft, adaptive=AdaptiveLength(threshold=threshold, step=0.0, high=1.0, entropy=entropy))
    sampling = sd.SamplingParams(temperature=1.0)
    want = exact_target_distribution(target, PROMPT, 3, sampling)
    got = exact_speculative_distribution(target, drafter, PROMPT, gamma=3, n=3, sampling=sampling)
    assert max_abs_difference(got, want) < 1e-9


def test_entropy_confidence_is_exp_minus_entropy_at_t_above_0():
    """exp(-H(q)): 1/4 for four equally likely tokens, 1 for a certain one; greedy (or no sampling given) it is the
    top token's untempered probability."""
    uniform, certain = torch.zeros(1, 4), torch.tensor([[0.0, -1e4, -1e4, -1e4]])
    t1 = sd.SamplingParams(temperature=1.0)
    assert sd.core.drafter.confidence_of(uniform, t1) == pytest.approx(0.25)
    assert sd.core.drafter.confidence_of(certain, t1) == pytest.approx(1.0)
    peaked = torch.tensor([[2.0, 0.0, 0.0, 0.0]])  # p = e^2 / (e^2 + 3) = 0.711 at the top
    assert sd.core.drafter.confidence_of(peaked) == pytest.approx(0.7112, abs=1e-4)
    # at T = 1: H = -(0.7112 ln 0.7112 + 3 x 0.0963 ln 0.0963) = 0.2422 + 0.6761 = 0.9183 nats, exp(-H) = 0.399
    assert sd.core.drafter.confidence_of(peaked, t1) == pytest.approx(0.3991, abs=2e-4)


def test_adaptive_threshold_moves_and_falls_back_to_plain_steps():
    rule = AdaptiveLength(threshold=0.5, step=0.1)
    rule.update(proposed=3, accepted=1)
    assert rule.threshold == pytest.approx(0.6)
    rule.update(proposed=2, accepted=2)
    assert rule.threshold == pytest.approx(0.5)
    target, draft = toy()
    never = ModelDraft(draft, adaptive=AdaptiveLength(threshold=1.0, step=0.0, high=1.0))
    out = sd.speculative_generate(target, never, torch.tensor(PROMPT), gamma=4, max_new_tokens=5)
    assert out.stats.drafted == 0 and out.stats.rounds == 5  # every round a plain step
    with pytest.raises(ValueError, match="threshold"):
        AdaptiveLength(threshold=1.5)


def test_deterministic_children_are_sampling_from_p():
    """Chosen (one-hot) children tried in turn = draw y from p and descend if y is a child, duplicates included."""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0], [1.0, 0, 0, 0]],
                     dtype=torch.float64)
    tree = Tree(torch.tensor([0, 2, 3, 2]), torch.tensor([-1, 0, 0, 0]))  # node 3 repeats node 1's token
    law = tree_outcome_distribution(tree, p)
    assert law[(2, 0)] == pytest.approx(0.3 * 0.25) and law[(3, 0)] == pytest.approx(0.4 * 0.5)
    assert law[(0,)] == pytest.approx(0.1) and law[(1,)] == pytest.approx(0.2)
    assert abs(sum(law.values()) - 1) < 1e-12


def test_tree_builder_merges_chosen_branches():
    b = TreeBuilder(7)
    b.add_chain(0, [1, 2, 3])
    b.add_chain(0, [1, 2, 4])
    b.add_chain(0, [5])
    tree = b.build()
    assert tree.tokens.tolist() == [7, 1, 2, 3, 4, 5] and tree.parents.tolist() == [-1, 0, 1, 2, 2, 0]
    assert tree.depths().tolist() == [0, 1, 2, 3, 3, 1]
    with pytest.raises(ValueError, match="parent"):
        Tree(torch.tensor([0, 1]), torch.tensor([-1, 1]))


MUTATED_TREE = dict(gamma=2, n=3, sampling=sd.SamplingParams(temperature=1.0))


@pytest.mark.parametrize("name", [name for name in TREE_MUTANTS if "compaction" not in name])
def test_exact_enumeration_rejects_broken_tree_verifiers(name):
    """Each broken tree verifier changes the law of the first 3 tokens by far more than the 1e-9 tolerance."""
    target, draft = toy(vocab=3)
    want = exact_target_distribution(target, PROMPT, 3, MUTATED_TREE["sampling"])
    got = exact_speculative_distribution(target, SampledTreeDraft(draft, width=2, depth=2), PROMPT, **MUTATED_TREE,
                                         verifier=TREE_MUTANTS[name])
    assert max_abs_difference(got, want) > 1e-3


def _first_two(target, drafter, runs, seed0=0, verifier=EXACT):
    rows = []
    for seed in range(seed0, seed0 + runs):
        rows.append(sd.speculative_generate(target, drafter, torch.tensor(PROMPT), gamma=2, max_new_tokens=2,
                                            seed=seed, verifier=verifier).tokens.tolist())
    return np.array(rows)


def test_chi_square_through_the_real_loop_and_its_power():
    """n = 2,000 runs of the real loop with a sampled tree (SpecInfer siblings); the law of the first two tokens
    (9 cells) is tested at level 1e-3. The same test has power > 0.99 against the law of the 'residual not
    updated between siblings' mutant (its exact law by enumeration), and rejects that mutant run through the loop.
    """
    target, draft = toy(vocab=3)
    sampling = sd.SamplingParams(temperature=1.0)
    want = exact_target_distribution(target, PROMPT, 2, sampling)
    n = 2000
    assert chi_square_pvalue(_first_two(target, SampledTreeDraft(draft, width=2, depth=2), n), want) > 1e-3
    name = "residual not updated between siblings"
    broken = exact_speculative_distribution(target, SampledTreeDraft(draft, width=2, depth=2), PROMPT,
                                            gamma=2, n=2, sampling=sampling, verifier=TREE_MUTANTS[name])
    assert chi_square_power(want, broken, n, level=1e-3) > 0.99
    samples = _first_two(target, SampledTreeDraft(draft, width=2, depth=2), n, 10_000, TREE_MUTANTS[name])
    assert chi_square_pvalue(samples, want) < 1e-3


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_llama(vocab=48, layers=3, seed=4), tiny_llama(vocab=48, layers=1, seed=5)


def _repetitive_prompt():
    return torch.tensor([3, 9, 4, 7, 3, 9, 5, 1, 3, 9, 6, 2, 3, 9])  # "3 9" was followed by 4, 5 and 6


def _hand_tree_round(target, compact_indices):
    """One lookup-tree round by hand; the accepted path is the last branch's first node (a rejected sibling sits
    before it). Returns (the cache's next logits after compaction, a fresh recompute's)."""
    prompt, greedy = _repetitive_prompt(), sd.SamplingParams(temperature=0.0)
    lm = sd.HFCausalLM(target)
    lm.reset(1)
    lm.feed(prompt[None, :-1])
    tree = LookupTreeDraft(branches=3, max_ngram=2).propose_tree(prompt[None], torch.tensor([len(prompt)]), 3,
                                                                 greedy, None)
    assert len(tree.children(0)) == 3
    cached = int(lm.cache_lengths()[0])
    mask = tree_module.attention_mask(tree, cached, 1, target.dtype, "cpu")
    lm.feed_tree(torch.cat([prompt[-1:], tree.tokens[1:]])[None], mask, tree_module.positions(tree, cached, 1, "cpu"))
    path = [tree.children(0)[-1]]
    lm.compact(compact_indices(path, cached))
    kept = torch.cat([prompt, tree.tokens[path]])
    assert lm.cache_seq_length() == len(kept)
    nxt = lm.feed(torch.tensor([[5]]))[0, -1]
    with torch.no_grad():
        fresh = target(input_ids=torch.cat([kept, torch.tensor([5])])[None]).logits[0, -1]
    return nxt, fresh


def test_greedy_identity_and_cache_truth_on_a_tiny_llama(tiny_pair):
    """Lookup trees with several branches on a tiny random Llama: greedy output equals plain greedy output, and
    after a compaction that keeps a later branch the cache gives the logits of a fresh recompute."""
    target, _ = tiny_pair
    prompt = _repetitive_prompt()
    greedy = sd.SamplingParams(temperature=0.0)
    want = sd.autoregressive_generate(target, prompt, max_new_tokens=24, sampling=greedy).tokens
    out = sd.speculative_generate(target, LookupTreeDraft(branches=3, max_ngram=2), prompt, gamma=3,
                                  max_new_tokens=24, sampling=greedy)
    assert torch.equal(out.tokens, want)
    assert max(out.stats.proposed_lengths) > max(out.stats.tree_depths)  # some round really had branches
    nxt, fresh = _hand_tree_round(target, tree_module.compact_indices)
    assert torch.allclose(nxt, fresh, atol=1e-4)


def test_compaction_that_keeps_a_rejected_branch_is_caught(tiny_pair):
    """The mutation check for compaction: keeping the first slots instead of the accepted path leaves a rejected
    branch's keys and values in the cache, and the cache-truth comparison sees it."""
    target, _ = tiny_pair
    broken = TREE_MUTANTS["compaction keeps the first slots, not the accepted path"]
    nxt, fresh = _hand_tree_round(target, broken.keep)
    assert not torch.allclose(nxt, fresh, atol=1e-2)


def test_tree_requests_are_checked():
    target, draft = toy()
    with pytest.raises(NotImplementedError, match="one prompt at a time"):
        sd.speculative_generate(target, LookupTreeDraft(), torch.tensor([PROMPT, PROMPT]), gamma=2, max_new_tokens=2)
    with pytest.raises(NotImplementedError, match="repetition_penalty"):
        sd.speculative_generate(target, LookupTreeDraft(), torch.tensor(PROMPT), gamma=2, max_new_tokens=2,
                                sampling=sd.SamplingParams(repetition_penalty=1.2))


# ---------------------------------------------------------------- T = 1 through a Hugging Face tree forward
class NodesSeeAllNodesLM(sd.HFCausalLM):
    """A deliberately wrong tree forward: the mask among the draft nodes is left open, so every node also sees its
    siblings and their subtrees (the prefix rows keep their causal mask)."""

    def __init__(self, model, prefix: int):
        super().__init__(model)
        self.prefix = prefix  # tokens fed before the nodes (the prompt, in the first round)

    def feed_tree(self, tokens, mask, position_ids, hidden_layers=None):
        mask = mask.clone()
        fed, total = mask.shape[-2:]
        mask[..., self.prefix:, total - fed + self.prefix:] = 0.0
        return super().feed_tree(tokens, mask, position_ids, hidden_layers)


def _tree_forward_law(lm, drafter, prompt, sampling):
    """The exact law of the first two tokens of the loop when its first round scores each possible tree through
    ``lm.feed_tree`` (the loop's mask and positions). After a one-token round the second token comes from a
    prefix forward, which the mask does not touch: the target's own p."""
    prompt_t = torch.tensor(prompt)
    target_p = exact_target_distribution(lm.model, prompt, 2, sampling)
    after_first = {a: {b: pr / sum(v for (x, _), v in target_p.items() if x == a)
                       for (x, b), pr in target_p.items() if x == a} for a, _ in target_p}
    law = {}
    for tree, weight in drafter.tree_law(prompt_t, 2, sampling):
        lm.reset(1)
        tokens = torch.cat([prompt_t, tree.tokens[1:]])[None]
        mask = tree_module.attention_mask(tree, 0, len(prompt), lm.model.dtype, "cpu")
        logits = lm.feed_tree(tokens, mask, tree_module.positions(tree, 0, len(prompt), "cpu"))
        p = sd.core.sampling.probs_from_logits(logits[0, len(prompt) - 1:].double(), sampling)
        for emitted, pr in tree_outcome_distribution(tree, p).items():
            tails = {emitted[1]: 1.0} if len(emitted) > 1 else after_first[emitted[0]]
            for b, pb in tails.items():
                law[(emitted[0], b)] = law.get((emitted[0], b), 0.0) + weight * pr * pb
    return law


def test_t1_sampled_tree_through_a_tiny_llama_tree_forward():
    """A sampled tree (width 2, depth 2, drafts drawn from q) verified at T = 1 through a tiny Llama's feed_tree,
    where the mask and the positions matter (the toy models ignore both): ``check_sampled_tree_law``."""
    check_sampled_tree_law(tiny_llama(vocab=3, layers=2, seed=11), tiny_llama(vocab=3, layers=2, seed=11).double())


def check_sampled_tree_law(target, exact_target):
    """The checks of a sampled tree (width 2, depth 2) at T = 1 through ``target``'s tree forward (a tiny Llama of
    vocabulary 3, seed 11; ``exact_target`` the same in float64):
    - Exact (float64): the first round's law, built from feed_tree's own node distributions, is the target's law of the
      first two tokens to 1e-9; with the mask among the nodes left open it is off by 0.049.
    - Statistical: n = 2,000 runs of the real loop; chi-square of the first two tokens (9 cells) at level 1e-3.
      Its power against the open-mask law is > 0.99 at this n, and it rejects the loop run with that mask.
      Subtler mask errors are below this test's reach: a plain causal mask (a node also sees its earlier
      siblings) moves this law by 0.004, power 0.001."""
    prompt, sampling = [0, 2], sd.SamplingParams(temperature=1.0)
    drafter = SampledTreeDraft(tiny_llama(vocab=3, layers=1, seed=12), width=2, depth=2)
    want = exact_target_distribution(target, prompt, 2, sampling)
    # the exact law in float64: a float32 tree forward rounds differently from the causal one (3e-8 on some CPUs)
    assert max_abs_difference(_tree_forward_law(sd.HFCausalLM(exact_target), drafter, prompt, sampling),
                              exact_target_distribution(exact_target, prompt, 2, sampling)) < 1e-9
    broken = _tree_forward_law(NodesSeeAllNodesLM(target, len(prompt)), drafter, prompt, sampling)
    assert max_abs_difference(broken, want) > 0.04
    n = 2000
    assert chi_square_power(want, broken, n, level=1e-3) > 0.99

    def first_two(lm, seed0):
        return np.array([sd.speculative_generate(lm, drafter, torch.tensor(prompt), gamma=2, max_new_tokens=2,
                                                 sampling=sampling, seed=seed).tokens.tolist()
                         for seed in range(seed0, seed0 + n)])

    assert chi_square_pvalue(first_two(sd.HFCausalLM(target), 0), want) > 1e-3
    assert chi_square_pvalue(first_two(NodesSeeAllNodesLM(target, len(prompt)), n), want) < 1e-3


def small_dynamic_tree(head) -> DynamicTreeDraft:
    """EAGLE-2's dynamic tree at the tiny targets' scale: top 2 a node, a made-up cost that keeps trees small."""
    return DynamicTreeDraft(head, verify_cost=lambda n: 1 + 0.1 * n, head_cost=0.1, top_k=2)


EAGLE_TREES = {
    "EAGLE tree, entropy-adaptive": lambda head: EagleTreeDraft(
        head, width=2, adaptive=AdaptiveLength(threshold=0.6, step=0.0, entropy=True)),
    "dynamic tree": small_dynamic_tree,
    "chosen adaptive EAGLE tree": lambda head: EagleTreeDraft(head, width=2,
                                                               adaptive=AdaptiveLength(threshold=0.5, step=0.0)),
    "dynamic hybrid tree": lambda head: HybridTreeDraft(LookupTreeDraft(branches=2), small_dynamic_tree(head)),
    "EAGLE chain": lambda head: head,
}
EAGLE_TREES["dynamic hybrid tree, two-layer head"] = EAGLE_TREES["dynamic hybrid tree"]
AUTO_SHAPE = "auto's shape: the dynamic hybrid tree greedy, the head's chain at T > 0"
RESTING_AUTO = "auto's shape, drafting and resting in turn"
RESTING_HYBRID = "dynamic hybrid tree, drafting and resting in turn"


def auto_shape(head, dynamic=None) -> ByTemperature:
    """As ``load_draft("auto")`` builds it (``auto_draft``): lookup branches and the dynamic tree greedy, the head
    itself (its chain) at T > 0, both paced by the dynamic tree's costs."""
    dynamic = dynamic or small_dynamic_tree(head)
    return auto_draft({"hybrid-dynamic": HybridTreeDraft(LookupTreeDraft(branches=2), dynamic),
                       "dynamic-tree": dynamic}, head)


def losing_dynamic_tree(head) -> DynamicTreeDraft:
    """The small dynamic tree on costs by which drafting never pays: a verification costs 10 decode steps."""
    return DynamicTreeDraft(head, verify_cost=lambda n: 10.0, head_cost=0.1, top_k=2)


def in_turn() -> Pacing:
    """Every drafted round judged alone and every rest one round long: on costs by which drafting never pays, a
    paced drafter drafts and rests in turn from its second round on (the first is the prefill)."""
    return Pacing(window=1, first_rest=1, longest_rest=1)


def resting_hybrid_tree(head) -> PacedDraft:
    dynamic = losing_dynamic_tree(head)
    hybrid = HybridTreeDraft(LookupTreeDraft(branches=2), dynamic)
    return PacedDraft(hybrid, dynamic.verify_cost, dynamic.head_cost, in_turn())


def resting_auto_shape(head) -> ByTemperature:
    shape = auto_shape(head, losing_dynamic_tree(head))
    for paced in (shape.greedy, shape.sampled):
        paced.pacing = in_turn()
    return shape


EAGLE_TREES[AUTO_SHAPE] = auto_shape
EAGLE_TREES[RESTING_AUTO] = resting_auto_shape
EAGLE_TREES[RESTING_HYBRID] = resting_hybrid_tree
EAGLE_PROMPT = [0, 2]


def eagle_tree(kind, target):
    """A fresh ``kind`` of EAGLE tree on a random head for ``target`` (the same head every time): EAGLE-3-style,
    or of two decoder layers where the kind says so."""
    from test_heads import random_head_draft

    head = "eagle-deep" if kind.endswith("two-layer head") else "eagle3"
    return EAGLE_TREES[kind](random_head_draft(target, head, seed=3))


@pytest.mark.parametrize("sampling", SETTINGS, ids=["T1", "T0.7-topk-topp", "greedy"])
@pytest.mark.parametrize("kind", EAGLE_TREES)
def test_exact_law_of_eagle_trees(kind, sampling):
    """The one tree a choosing drafter proposes (from the live drafter primed as the loop leaves it; the chain:
    every proposal, weighted by q from the head's cache-free reference) and every verifier outcome, round after
    round: the law of the first 3 tokens is the target's to 1e-9 (float64 tiny Llama target)."""
    target = tiny_llama(vocab=3, layers=2, seed=11).double()
    want = exact_target_distribution(target, EAGLE_PROMPT, 3, sampling)
    got = exact_speculative_distribution(target, eagle_tree(kind, target), EAGLE_PROMPT, gamma=2, n=3,
                                         sampling=sampling)
    assert abs(sum(got.values()) - 1) < 1e-9
    assert max_abs_difference(got, want) < 1e-9


@pytest.mark.parametrize("name", [name for name in TREE_MUTANTS if "compaction" not in name and "bonus" not in name])
def test_enumeration_rejects_broken_verifiers_of_the_hybrid_tree(name):
    """Lookup branches and the dynamic tree's candidates under the same parents (auto's greedy drafting, here at
    T = 1): each broken tree verifier its chosen nodes can expose moves the law of the first 3 tokens by more than
    1e-3 (the exact verifier: 1e-9, above). The bonus drawn at the parent leaves this law as it is (chosen nodes,
    gamma 2); the sampled trees expose it (``test_exact_enumeration_rejects_broken_tree_verifiers``)."""
    kind = "dynamic hybrid tree"
    target = tiny_llama(vocab=3, layers=2, seed=11).double()
    sampling = sd.SamplingParams(temperature=1.0)
    want = exact_target_distribution(target, EAGLE_PROMPT, 3, sampling)
    got = exact_speculative_distribution(target, eagle_tree(kind, target), EAGLE_PROMPT, gamma=2,
                                         n=3, sampling=sampling, verifier=TREE_MUTANTS[name])
    assert max_abs_difference(got, want) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dynamic tree", "dynamic hybrid tree", "dynamic hybrid tree, two-layer head",
                                  RESTING_HYBRID])
def test_t1_eagle_trees_keep_the_target_law(kind):
    """The EAGLE head's trees at T = 1, gamma 2, on a tiny Llama (its tree forward: mask and positions) with a
    random EAGLE-3-style head: EAGLE-2's dynamic tree (chosen candidates), or the dynamic tree with lookup branches
    (auto's greedy drafting), also on a head of two decoder layers (the chain with siblings moves the broken law
    too little for this test's power: its exact law is checked above), and paced to draft and rest in turn (its
    third round is a plain step where the second kept no draft). The first round is the prefill, so the
    first three tokens are where the tree acts. n = 600 runs of the real loop; chi-square of the first three
    tokens (27 cells) against the target's exact law at level 1e-3. Against the loop with the residual left out of
    the verifier the test's power, from that loop's law by enumeration, is > 0.9999 for each kind (0.99 is reached
    from n = 400 for the two-layer head, 300 for the others), and it rejects that loop run."""
    target = tiny_llama(vocab=3, layers=2, seed=11)
    sampling, n = sd.SamplingParams(temperature=1.0), 600
    want = exact_target_distribution(target, EAGLE_PROMPT, 3, sampling)
    broken_verifier = TREE_MUTANTS["residual not updated between siblings"]
    broken = exact_speculative_distribution(target, eagle_tree(kind, target), EAGLE_PROMPT, gamma=2, n=3,
                                            sampling=sampling, verifier=broken_verifier)
    assert chi_square_power(want, broken, n, level=1e-3) > 0.9999

    def first_three(verifier, seed0):
        drafter = eagle_tree(kind, target)
        return np.array([sd.speculative_generate(target, drafter, torch.tensor(EAGLE_PROMPT), gamma=2,
                                                 max_new_tokens=3, sampling=sampling, seed=s,
                                                 verifier=verifier).tokens.tolist()
                         for s in range(seed0, seed0 + n)])

    assert chi_square_pvalue(first_three(EXACT, 0), want) > 1e-3
    assert chi_square_pvalue(first_three(broken_verifier, n), want) < 1e-3


def test_by_temperature_runs_the_drafting_of_the_generation_s_temperature():
    """``ByTemperature`` (auto's shape) runs its greedy drafting greedy and its other one at T > 0: the same tokens
    and the same rounds, seed for seed, as each drafting alone; it cannot be run without being asked which."""
    target = tiny_llama(vocab=3, layers=2, seed=11)
    alone = {0.0: "dynamic hybrid tree", 1.0: "EAGLE chain"}
    differ = False
    for temperature, kind in alone.items():
        sampling = sd.SamplingParams(temperature=temperature)
        for seed in range(4):
            runs = [sd.speculative_generate(target, eagle_tree(k, target), torch.tensor(EAGLE_PROMPT), gamma=2,
                                            max_new_tokens=10, sampling=sampling, seed=seed)
                    for k in (AUTO_SHAPE, kind, alone[1.0 - temperature])]
            assert torch.equal(runs[0].tokens, runs[1].tokens)
            assert runs[0].stats.accepted_lengths == runs[1].stats.accepted_lengths
            assert runs[0].stats.drafted == runs[1].stats.drafted
            differ |= runs[0].stats.drafted != runs[2].stats.drafted  # the other drafting would show
    assert differ
    with pytest.raises(TypeError, match="at\\(sampling\\)"):
        eagle_tree(AUTO_SHAPE, target).begin(torch.tensor([EAGLE_PROMPT]))


def test_the_node_budget_keeps_what_pays_by_the_cost_model():
    """Confidences 0.9, 0.5, 0.1, no draft cost, v(n) = 1 + 0.2 (n - 1): the speedup (1 + sum) / v(N + 1) is
    1, 1.9/1.2 = 1.58, 2.4/1.4 = 1.71, 2.5/1.6 = 1.56 for N = 0..3, so two nodes; a flat v keeps all three; a
    draft cost of 10 steps makes a node's verification matter less, and the third pays: 2.5/11.6 = 0.216 against
    2.4/11.4 = 0.211."""
    v = lambda n: 1 + 0.2 * (n - 1)  # noqa: E731
    assert best_budget([0.1, 0.9, 0.5], 0.0, v)[0] == 2
    assert best_budget([0.1, 0.9, 0.5], 0.0, lambda n: 1.0)[0] == 3
    assert best_budget([0.1, 0.9, 0.5], 10.0, v)[0] == 3
    assert best_budget([], 0.0, v) == (0, 1.0)


def _observed(target, eagle, prompt):
    """``eagle`` after the target's forward over the prompt but its last token, as the loop leaves it."""
    lm = sd.HFCausalLM(target)
    lm.reset(1)
    _, hidden = lm.feed(prompt[:, :-1], hidden_layers=eagle.feature_layers)
    eagle.begin(prompt)
    eagle.observe(hidden, 0)
    return eagle


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "eagle-deep"])
def test_dynamic_tree_expansions_are_the_chains_of_their_paths(kind):
    """Each expanded node's children in the dynamic tree are the head's top tokens after the node's path as a
    cache-free chain computes it (``reference_logits``): the head's tree attention and positions are right. A
    flat verification cost keeps every candidate; greedy output is the target's own."""
    from test_heads import random_head_draft

    target = tiny_llama(vocab=64, seed=0)
    prompt = torch.tensor([[5, 9, 11, 3, 7]])
    eagle = _observed(target, random_head_draft(target, kind), prompt)
    drafter = DynamicTreeDraft(eagle, verify_cost=lambda n: 1.0, head_cost=0.0, top_k=3)
    greedy = sd.SamplingParams(temperature=0)
    tree = drafter.propose_tree(prompt, torch.tensor([prompt.shape[1]]), 4, greedy, None)
    assert tree.size == 1 + 3 + 3 * 9  # depth 1: 3; then 3 expanded per depth, 3 children each
    expanded = [u for u in range(tree.size) if tree.children(u)]
    assert len(expanded) == 1 + 3 * 3
    for u in expanded:
        path = [int(tree.tokens[i]) for i in tree.path_to(u)]
        logits = eagle.reference_logits(prompt[0], torch.tensor([path + [0]]))[0, len(path)]
        want = set(logits.topk(3).indices.tolist())
        assert {int(tree.tokens[c]) for c in tree.children(u)} == want, path
    base = sd.autoregressive_generate(target, prompt, max_new_tokens=40, sampling=greedy).tokens
    fresh = DynamicTreeDraft(random_head_draft(target, kind), lambda n: 1 + 0.05 * n, 0.1, top_k=3)
    out = sd.speculative_generate(target, fresh, prompt, gamma=4, max_new_tokens=40, sampling=greedy)
    assert torch.equal(out.tokens, base)


def test_dynamic_tree_depth_is_what_the_cost_model_pays_for():
    """The dynamic tree stops expanding when a level does not raise the predicted speedup: with free head steps
    and a flat v every level pays (depth gamma); with a head step costing 100 decode steps none beyond the first
    does (depth 1); ``best_budget``'s speedup is the cost model's for the kept nodes."""
    from test_heads import random_head_draft

    target = tiny_llama(vocab=64, seed=0)
    prompt = torch.tensor([[5, 9, 11, 3, 7]])
    greedy = sd.SamplingParams(temperature=0)

    def depth(head_cost):
        eagle = _observed(target, random_head_draft(target, "eagle3"), prompt)
        tree = DynamicTreeDraft(eagle, lambda n: 1.0, head_cost, top_k=3).propose_tree(
            prompt, torch.tensor([prompt.shape[1]]), 4, greedy, None)
        return max(len(tree.path_to(u)) for u in range(tree.size))

    assert depth(0.0) == 4
    assert depth(100.0) == 1
    n, speed = best_budget([0.9, 0.5, 0.1], 1.0, lambda n: 1 + 0.2 * (n - 1))
    assert n == 2 and speed == pytest.approx((1 + 0.9 + 0.5) / (1.0 + 1.4))


def test_measured_dynamic_tree_reads_this_machines_costs(tmp_path, monkeypatch):
    """``measured_dynamic_tree`` times the target over 1..8 tokens and a drafting round: v(1) = 1, v(n) is the
    interpolation of what it measured (each point at least the largest before it: a tiny model's timings are
    noise), the head's cost per level is positive, and the tree it drafts keeps greedy output the target's own.
    (Its profile file goes to a fresh cache: ``tests/test_cost_profiles.py`` tests the keeping.)"""
    from test_heads import random_head_draft

    monkeypatch.setenv("SPECDEC_LITE_CACHE", str(tmp_path))
    target = tiny_llama(vocab=64, seed=0)
    drafter = measured_dynamic_tree(random_head_draft(target, "eagle3"), target, top_k=2, max_depth=3, repeats=2,
                                    tokens=(1, 2, 8))
    v = drafter.costs["v"]
    assert set(v) == {1, 2, 8} and v[1] == 1.0
    v2, v8 = max(1.0, v[2]), max(1.0, v[2], v[8])
    assert drafter.verify_cost(5) == pytest.approx(v2 + (v8 - v2) / 2)
    assert drafter.head_cost > 0 and drafter.costs["target_step_seconds"] > 0
    prompt, greedy = torch.tensor([[5, 9, 11, 3, 7]]), sd.SamplingParams(temperature=0)
    base = sd.autoregressive_generate(target, prompt, max_new_tokens=30, sampling=greedy).tokens
    out = sd.speculative_generate(target, drafter, prompt, gamma=4, max_new_tokens=30, sampling=greedy)
    assert torch.equal(out.tokens, base)


def test_a_tree_built_on_the_cpu_is_verified_where_the_target_runs():
    """Drafters build trees on the CPU, the target's p lives on the model's device: a drawn and a chosen child
    verified against p there (``make gpu-check`` runs this on CUDA, where T > 0 trees once failed) follow the
    exact law, 4000 draws within 0.03 of each outcome's probability (a standard deviation is at most 0.008)."""
    g = torch.Generator().manual_seed(0)
    builder = TreeBuilder(0)
    q = torch.softmax(torch.randn(4, generator=g, dtype=torch.float64), -1)
    builder.add(0, 2, q=q)  # drawn
    builder.add(0, 1)  # chosen
    tree = builder.build()
    p = torch.softmax(torch.randn(3, 4, generator=g, dtype=torch.float64), -1)
    exact = tree_outcome_distribution(tree, p)
    on_device = p.to(DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    counts = {}
    for _ in range(4000):
        path, token = tree_module.verify_tree(tree, on_device, generator)
        outcome = (*(int(tree.tokens[i]) for i in path), token)
        counts[outcome] = counts.get(outcome, 0) + 1
    assert set(counts) <= set(exact)
    assert max(abs(counts.get(k, 0) / 4000 - v) for k, v in exact.items()) < 0.03
