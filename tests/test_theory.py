"""theory.py: the closed forms, checked against brute force and against the loop itself."""
import numpy as np
import pytest
import torch

import specdec_lite as sd
from specdec_lite.instruments import timing
from specdec_lite.repro import speedup_tables, theory
from specdec_lite.repro.toy import constant_alpha_pair


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_expected_tokens_is_the_truncated_geometric_sum(alpha, gamma):
    # E[N] = sum_{k=0}^{gamma} alpha^k: the round reaches draft k with probability alpha^k
    assert theory.expected_tokens(alpha, gamma) == pytest.approx(sum(alpha ** k for k in range(gamma + 1)))


def test_expected_tokens_limits_and_vectorization():
    assert theory.expected_tokens(1.0, 4) == 5.0
    assert theory.expected_tokens(0.0, 4) == 1.0
    values = theory.expected_tokens(np.array([0.5, 1.0]), 3)
    assert np.allclose(values, [1.875, 4.0])
    assert theory.expected_tokens(0.8, 200) == pytest.approx(theory.expected_tokens_limit(0.8))
    with pytest.raises(ValueError, match="alpha must lie in"):
        theory.expected_tokens(1.2, 3)


def test_speedup_and_best_gamma():
    # alpha 0.8, c 0.1, gamma 4: E[N] = 3.3616, cost 1.4 -> 2.401
    assert theory.speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    assert theory.speedup(0.8, 4, 0.1, v=1.7) == pytest.approx(3.3616 / 2.1)
    brute = max(range(1, 17), key=lambda g: theory.expected_tokens(0.8, g) / (g * 0.1 + 1))
    assert theory.best_gamma(0.8, 0.1) == brute == 6
    assert theory.best_gamma(0.8, 0.1, v=lambda g: 1 + 0.2 * g) < 6  # a verification cost growing with gamma


@pytest.mark.parametrize("kwargs", [dict(max_gamma=0), dict(max_gamma=2.5), dict(max_gamma=True),
                                    dict(alpha=np.array([0.5, 0.8])), dict(c=[0.1, 0.2]), dict(v=np.ones(3))])
def test_best_gamma_refuses_what_it_cannot_search(kwargs):
    """An array of alphas used to be searched as one flat list (a meaningless gamma, silently); a max_gamma
    below 1 or not an integer used to fail inside numpy or range, with a message that did not name it."""
    args = dict(alpha=0.8, c=0.1) | kwargs
    with pytest.raises(ValueError, match="max_gamma must be an integer|one alpha, one c and one v"):
        theory.best_gamma(**args)
    with pytest.raises(ValueError):
        theory.speedup(0.5, 3, -0.1)


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_loop_accepted_length_matches_expected_tokens(alpha):
    """The loop's mean accepted length equals E[N] when every position's acceptance is alpha
    (20,000 rows x 40 tokens; standard error of the mean below 0.01, tolerance 0.03)."""
    target, draft = constant_alpha_pair(alpha)
    gamma = 4
    gen = sd.speculative_generate(target, draft, torch.zeros(20_000, 1, dtype=torch.long), gamma=gamma,
                                  max_new_tokens=40, seed=3)
    assert gen.stats.mean_accepted_length == pytest.approx(theory.expected_tokens(alpha, gamma), abs=0.03)
    assert gen.stats.acceptance_rate == pytest.approx(
        (theory.expected_tokens(alpha, gamma) - 1) / gamma, abs=0.01)


def test_article000_table_recomputed():
    rows = theory.article000_comparison()
    assert len(rows) == 16
    differing = [(a, c, g) for a, c, g, printed, ours in rows if abs(printed - ours) > 0.006]
    assert differing == [(0.5, 0.1, 5)]  # the article prints 1.24; (1 - 0.5^6) / 0.5 / 1.5 = 1.3125


def test_break_even_alpha():
    # gamma = 1 breaks even where (1 + alpha) / (1 + c) = 1, i.e. alpha = c
    assert theory.break_even_alpha(0.2) == pytest.approx(0.2, abs=1e-3)
    assert theory.break_even_alpha(0.05) == pytest.approx(0.05, abs=1e-3)
    assert 0.5 < theory.break_even_alpha(0.1, v=1.7) < 0.6  # a CPU-like verification cost moves it up


def test_simulated_speedup_matches_theory():
    sim = speedup_tables.simulate_speedup(0.8, 4, 0.1, rows=20_000, tokens=40)
    assert sim == pytest.approx(theory.speedup(0.8, 4, 0.1), abs=0.03)


class FakeClock:
    """Returns 0 then advances by the next interval at every second call: timed(fn) measures the intervals in
    order, whatever fn costs."""

    def __init__(self, intervals):
        self.intervals, self.now, self.calls = list(intervals), 0.0, 0

    def __call__(self):
        if self.calls % 2:
            self.now += self.intervals[self.calls // 2]
        self.calls += 1
        return self.now


def test_forward_seconds_are_medians_of_the_timed_repeats_after_a_warm_up():
    from conftest import tiny_llama

    # per k: one warm-up (100 s, dropped) then 3 timed forwards
    clock = FakeClock([100, 1, 2, 9, 100, 4, 6, 5])
    seconds = timing.forward_seconds(tiny_llama(), context_len=8, new_tokens=(1, 3), repeats=3, clock=clock)
    assert seconds == {1: 2.0, 3: 5.0}
    assert clock.calls == 16
    with pytest.raises(ValueError, match="repeats"):
        timing.forward_seconds(tiny_llama(), repeats=0)
    with pytest.raises(ValueError, match="new_tokens"):
        timing.forward_seconds(tiny_llama(), new_tokens=(0, 2))


def test_tree_forward_seconds_time_what_a_tree_round_runs(monkeypatch):
    """With ``tree=True`` every k > 1 is timed through the tree forward (a chain of k tokens under the tree mask,
    at the positions after the context: on a compiled static cache the rows are padded as a tree round's are);
    k = 1 stays a decode step. A batch is refused: trees run one prompt at a time."""
    from specdec_lite.core.lm import HFCausalLM

    from conftest import tiny_llama

    fed, feed_tree = [], HFCausalLM.feed_tree

    def recorded(self, tokens, mask, position_ids, hidden_layers=None):
        fed.append((tuple(tokens.shape), tuple(mask.shape), position_ids.tolist()))
        return feed_tree(self, tokens, mask, position_ids, hidden_layers)

    monkeypatch.setattr(HFCausalLM, "feed_tree", recorded)
    seconds = timing.forward_seconds(tiny_llama(), context_len=8, new_tokens=(1, 3), repeats=2, tree=True)
    assert set(seconds) == {1, 3}
    assert fed == [((1, 3), (1, 1, 3, 11), [[8, 9, 10]])] * 3  # a warm-up and 2 timed, each after the rollback
    with pytest.raises(ValueError, match="batch_size must be 1"):
        timing.forward_seconds(tiny_llama(), new_tokens=(2,), batch_size=2, tree=True)


def test_memory_bandwidth_is_twice_the_bytes_over_the_median_copy_time():
    from specdec_lite.repro import bench

    clock = FakeClock([0.01, 0.02, 0.5])
    assert bench.memory_bandwidth_gbs(megabytes=16, repeats=3, clock=clock) == pytest.approx(2 * 16 * 2**20 / 0.02 / 1e9)
    with pytest.raises(ValueError):
        bench.memory_bandwidth_gbs(megabytes=0)


def test_costs_are_the_documented_ratios_of_medians():
    from specdec_lite.repro import costs

    from conftest import tiny_llama

    # target forwards over 1, 2, 3 tokens take 2, 3, 5 s; the draft's step 0.5 s (each after a 50 s warm-up)
    clock = FakeClock([50, 2, 50, 3, 50, 5, 50, 0.5])
    measured = costs.measure(tiny_llama(), tiny_llama(layers=1), gammas=[1, 2], repeats=1, context_len=8, clock=clock)
    assert measured.target_seconds == {1: 2, 2: 3, 3: 5} and measured.draft_seconds == 0.5
    assert measured.v == {1: 1.5, 2: 2.5}  # v(gamma) = T(gamma + 1) / T(1)
    assert measured.c == 0.25  # c = T_draft(1) / T_target(1)
    assert measured.v_at(2) == 2.5 and measured.v_at(7) == 2.5  # flat past the largest gamma measured
    assert costs.verification_costs({1: 2.0, 5: 3.0}, [4]) == {4: 1.5}
    with pytest.raises(ValueError, match="forward time for"):
        costs.verification_costs({1: 2.0, 5: 3.0}, [3])
    with pytest.raises(ValueError, match="gammas"):
        costs.measure(tiny_llama(), gammas=[0])
    no_draft = costs.measure(tiny_llama(), gammas=[2], repeats=1, context_len=8, clock=FakeClock([9, 4, 9, 6]))
    assert no_draft.v == {2: 1.5} and np.isnan(no_draft.c)
    # v(n) for token trees: every count against one token, 1 always among them
    assert timing.cost_by_tokens(tiny_llama(), (3, 2), repeats=1, context_len=8,
                                clock=FakeClock([50, 2, 50, 3, 50, 5])) == {1: 1.0, 2: 1.5, 3: 2.5}


def test_costs_by_batch_measures_v_at_each_batch_size():
    from specdec_lite.repro import costs

    from conftest import tiny_llama

    model, fed = tiny_llama(), []
    model.register_forward_pre_hook(lambda _, args, kwargs: fed.append(tuple(kwargs["input_ids"].shape)),
                                    with_kwargs=True)
    table = costs.by_batch(model, [1, 2], gamma=2, repeats=1)
    assert list(table.columns) == ["batch", "v(2) = T(3 tokens)/T(1 token)"] and list(table.batch) == [1, 2]
    # per batch size b (rows per forward): the 64-token context, then for k = 1 and gamma + 1 = 3 new tokens one
    # warm-up and repeats = 1 timed forward (timing.forward_seconds); the times themselves are real (no clock here)
    assert fed == [(b, k) for b in (1, 2) for k in (64, 1, 1, 3, 3)]


def test_latency_example_is_article002s_arithmetic():
    # alpha 0.7, K 8: E[N] = (1 - 0.7^9) / 0.3 = 3.1997...; 200 tokens take 62.51 rounds of 8 x 1 + 10 = 18 ms
    en = (1 - 0.7 ** 9) / 0.3
    ex = theory.latency_example(0.7, gamma=8, tokens=200, target_ms=10, draft_ms=1)
    assert ex["E[N]"] == pytest.approx(en)
    assert ex["rounds"] == pytest.approx(200 / en)
    assert ex["latency ms"] == pytest.approx(200 / en * 18)
    assert ex["speedup"] == pytest.approx(2000 / (200 / en * 18)) and round(ex["speedup"], 2) == 1.78
    assert round(theory.latency_example(0.3)["speedup"], 2) == 0.79
    with pytest.raises(ValueError):
        theory.latency_example(0.5, target_ms=0)


def test_memory_floor_is_weights_over_bandwidth():
    assert theory.memory_floor_ms(14e9, 2000) == pytest.approx(7.0)  # 7B fp16 on 2 TB/s
    assert theory.memory_floor_ms(540e6, 44.0) == pytest.approx(540e6 / 44e9 * 1000)
    with pytest.raises(ValueError):
        theory.memory_floor_ms(1e9, 0)


def test_acceptance_summaries():
    from specdec_lite.repro import evaluate

    lengths = [5, 1, 3, 5, 2]  # gamma 4: accepted drafts 4, 0, 2, 4, 1
    assert evaluate.alpha_estimate(lengths, 4) == pytest.approx(11 / (4 + 1 + 3 + 4 + 2))
    pos = evaluate.acceptance_by_position(lengths, 4)
    assert pos[0] == pytest.approx(4 / 5) and pos[3] == pytest.approx(2 / 2)
    by_output = evaluate.acceptance_by_output_position(lengths, 4, bucket=6)
    assert list(by_output) == [0, 6, 12]  # rounds start at 0, 5, 6, 9, 14
    # a drafter that proposed nothing in one round and 2 in another: those rounds count only what was proposed
    assert evaluate.alpha_estimate([1, 3, 1], [0, 2, 4]) == pytest.approx(2 / (0 + 2 + 1))
    pos = evaluate.acceptance_by_position([1, 3, 1], 4, proposed=[0, 2, 4])
    assert pos[0] == pytest.approx(1 / 2) and pos[1] == pytest.approx(1.0) and np.isnan(pos[2])


def test_tree_formula_reduces_to_the_chain_formula():
    for alpha in (0.0, 0.3, 0.8, 1.0):
        chain = theory.expected_tokens_tree([0] + [alpha] * 4, [-1, 0, 1, 2, 3])
        assert chain == pytest.approx(theory.expected_tokens(alpha, 4))
        assert theory.expected_tokens_by_depth([alpha] * 4) == pytest.approx(chain)
        assert theory.tree_speedup(chain, 4 * 0.1, 1.3) == pytest.approx(theory.speedup(alpha, 4, 0.1, 1.3))


def test_tree_formula_adds_each_nodes_path_probability():
    # root -> a (0.5) -> c (0.4); root -> b (0.3): E[N] = 1 + 0.5 + 0.5*0.4 + 0.3
    assert theory.expected_tokens_tree([0, 0.5, 0.3, 0.4], [-1, 0, 0, 1]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="parent"):
        theory.expected_tokens_tree([0, 0.5], [-1, 1])
    assert timing.v_at({1: 1.0, 5: 1.1, 9: 1.3}, 7) == pytest.approx(1.2)
    assert timing.v_at({1: 1.0, 5: 1.1, 9: 1.3}, 13) == pytest.approx(1.5)
    # a noisy measurement below the one before it counts as that one: flat there and past it, never down
    assert timing.v_at({1: 1.0, 3: 0.6}, 9) == pytest.approx(1.0)
    noisy = {1: 1.0, 2: 1.3, 4: 1.1, 8: 1.5}
    assert timing.v_at(noisy, 4) == pytest.approx(1.3) and timing.v_at(noisy, 6) == pytest.approx(1.4)
    assert all(timing.v_at(noisy, n) <= timing.v_at(noisy, n + 0.5) for n in range(1, 12))
