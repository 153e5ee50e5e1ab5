"""The tables notebooks 01-03 show, built by the package: unbiased, speedup_tables, evaluate's summaries."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

import specdec_lite as sd
from specdec_lite.repro import evaluate, speedup_tables, unbiased
from specdec_lite.repro.costs import Costs
from specdec_lite.repro.exact import exact_target_distribution
from specdec_lite.repro.toy import article000_pair, random_pair


# ---------------------------------------------------------------- unbiased (notebook 01)
def test_first_tokens_shape_and_marginal_law():
    t, d = random_pair(6, 0.5, 0)
    samples = unbiased.first_tokens(t, d, 50, gamma=2, n_tokens=3, seed=0)
    assert samples.shape == (50, 3) and samples.min() >= 0 and samples.max() < 6
    assert np.array_equal(samples, unbiased.first_tokens(t, d, 50, gamma=2, n_tokens=3, seed=0))  # seeded
    law = {(0, 1, 2): 0.25, (0, 2, 2): 0.25, (1, 1, 0): 0.5}
    assert unbiased.marginal_law(law, [2, 3]) == {(1, 2): 0.25, (2, 2): 0.25, (1, 0): 0.5}
    assert unbiased.marginal_law(law, [1]) == {(0,): 0.5, (1,): 0.5}
    full = exact_target_distribution(t, [0], 3)
    assert sum(unbiased.marginal_law(full, [3]).values()) == pytest.approx(1.0)


def test_exact_table_and_truncation_table():
    pairs = {"article 000": article000_pair()}
    table = unbiased.exact_table(pairs, {"T 1": sd.SamplingParams()}, cases=((1, 2),))
    assert list(table.columns) == ["pair", "sampling", "gamma", "tokens", "max |spec - target|"]
    assert table["max |spec - target|"].max() < 1e-9
    tv = unbiased.truncation_table(pairs, ks=(2,))
    assert tv["total variation to the target"].iloc[0] > 0.1


def test_mutation_check_rejects_a_broken_verifier_and_keeps_the_correct_one():
    from specdec_lite.repro.mutants import MUTANTS

    t, d = random_pair(6, 0.5, 0)
    name = "residual from p"
    curves, mutation = unbiased.mutation_check(t, d, 20_000, [2_000, 20_000], 2, 3, 1e-3, mutants={name: MUTANTS[name]})
    assert list(curves.samples) == [2_000, 20_000] * 2
    ok = mutation.set_index("verifier")
    assert not ok.loc["correct verifier", "rejected"] and ok.loc[name, "rejected"]
    assert np.isnan(ok.loc["correct verifier", "power at this N"]) and ok.loc[name, "power at this N"] > 0.99


def test_overlap_acceptance_round_bounds_and_article000_rerun():
    t, d = article000_pair()
    c2 = unbiased.overlap_acceptance(t, d, 5_000)
    assert list(c2["overlap (exact)"].round(2)) == [0.95, 0.96] and (c2["|z|"] < 4).all()
    bounds = unbiased.round_bounds(t, d, gammas=(1, 3), runs=200, tokens=8)
    assert (bounds["min"] >= 1).all() and (bounds["max"] <= bounds.gamma + 1).all()
    kl, dev, null = unbiased.article000_rerun(t, d, 5_000, null_repeats=2)
    assert len(null) == 2 and 0 <= kl < 0.01 and 0 <= dev < 0.05
    # as published, the first bonus (position 5) is drawn from position 4's law: the chi-square on (token 4,
    # token 5) rejects it at 3,000 runs; with the bonus from position gamma+1 the listing draws the target's law
    p = unbiased.article000_listing_pvalues(t, 3_000)
    assert p["as published"] < 1e-4 and p["bonus from position gamma+1"] > 1e-3


def test_article004_leak_table_flags_chi_square_rejections():
    table = unbiased.article004_leak_table(leaks=(0.0, 0.4), level=1e-3, steps=4000)
    assert list(table.leak) == [0.0, 0.4]
    assert list(table.chi_square_rejects) == list(table.chi_square_pvalue < 1e-3)
    assert table.chi_square_rejects.iloc[1]


# ---------------------------------------------------------------- speedup tables (notebook 02)
def test_article000_table_and_simulation():
    table = speedup_tables.article000_table()
    assert len(table) == 16 and table["matches (0.006)"].sum() == 15
    # alpha 0.7, c 0.1, gamma 3: E[N] = 1 + 0.7 + 0.49 + 0.343 = 2.533 over 3 x 0.1 + 1 = 1.3 -> 1.94846 -> 1.948
    assert tuple(table[["alpha", "c", "gamma"]].iloc[0]) == (0.7, 0.1, 3) and table.formula.iloc[0] == 1.948
    sims = speedup_tables.simulated(table.head(1), rows=2_000, tokens=24)
    assert sims[0] == pytest.approx(table.formula.iloc[0], abs=0.1)


def test_theory_tables():
    wide = speedup_tables.wide_table([0.5, 0.8], [0.1], gammas=range(1, 3))
    # c 0.1: (1 + a + ... + a^g) / (0.1 g + 1) by hand; a 0.5: 1.5 / 1.1, 1.75 / 1.2; a 0.8: 1.8 / 1.1, 2.44 / 1.2
    assert list(zip(wide.alpha, wide.gamma)) == [(0.5, 1), (0.5, 2), (0.8, 1), (0.8, 2)]
    assert wide.speedup.tolist() == pytest.approx([1.5 / 1.1, 1.75 / 1.2, 1.8 / 1.1, 2.44 / 1.2])
    optimal = speedup_tables.optimal_table((0.8,), (0.1,))
    assert optimal["best gamma"].iloc[0] == 6 and optimal.speedup.iloc[0] == 2.47
    limits = speedup_tables.limits_table((0.5,))
    assert limits.iloc[0].tolist() == [0.5, 2.0, 2.0, 1.0]
    c8 = speedup_tables.article002_c8_table()
    assert list(c8["formula speedup"]) == [2.401, 1.868] and c8["E[N]"].iloc[0] == 3.362
    be = speedup_tables.break_even_table((0.2,))
    assert be.iloc[0, 1] == 0.201  # the first grid point past alpha = c
    curves = speedup_tables.break_even_curves([0.1], vs=(1.0, 1.7), resolution=101)
    assert list(curves.v) == ["v = 1.0", "v = 1.7"] and curves["break-even alpha"].is_monotonic_increasing


def test_article002_c9_table_uses_the_latency_arithmetic():
    c9 = speedup_tables.article002_c9_table(sim_rows=5_000)
    assert list(c9.speedup) == [1.78, 0.79] and list(c9["latency ms"]) == [1125.0, 2520.0]
    assert c9["simulated speedup"].iloc[0] == pytest.approx(1.78, abs=0.1)


def test_predicted_vs_measured_and_position_means():
    runs = pd.DataFrame({"gamma": [1, 1, 2], "alpha": [0.4, 0.6, 0.5], "speedup_same_config": [0.9, 1.1, 1.0],
                         "speedup": [0.6, 0.8, 0.7], "accept_pos1": [0.5, 0.5, 0.2], "accept_pos2": [np.nan, np.nan, 0.4]})
    costs = Costs({1: 1.0, 2: 1.5, 3: 2.0}, 0.1, {1: 1.5, 2: 2.0}, 0.1)
    table = speedup_tables.predicted_vs_measured(runs, costs)
    assert list(table.alpha) == [0.5, 0.5] and list(table.measured) == [1.0, 1.0]
    assert table["measured over the fastest plain"].tolist() == pytest.approx([0.7, 0.7])
    assert table.predicted.iloc[0] == pytest.approx(1.5 / (0.1 + 1.5))
    assert table["predicted (v = 1)"].iloc[1] == pytest.approx(1.75 / 1.2)
    assert speedup_tables.position_means(runs, 2).tolist() == [0.2, 0.4]


def test_weight_bytes():
    from conftest import tiny_llama

    # tiny_llama: vocab 64, hidden 32, MLP 64, 4 layers, 4 heads of 8 (2 for keys and values), untied output.
    # Per layer: q 32x32 + k 32x16 + v 32x16 + o 32x32 = 3,072, gate, up, down 3 x 32x64 = 6,144, two norms 64:
    # 9,280. Embedding and output layer 2 x 64x32 = 4,096, final norm 32: 4 x 9,280 + 4,096 + 32 = 41,248.
    model = tiny_llama()
    assert speedup_tables.weight_bytes(model) == 41_248 * 4  # float32
    assert speedup_tables.weight_bytes(model.to(torch.bfloat16)) == 41_248 * 2


# ---------------------------------------------------------------- evaluate summaries (notebook 03)
def runs_frame():
    return pd.DataFrame({
        "method": ["autoregressive", "n-gram", "n-gram", "EAGLE head"],
        "kind": ["plain", "speculative", "speculative", "speculative"],
        "temperature": [0.0, 0.0, 1.0, 0.0], "task": ["code"] * 4,
        "accept_pos1": [np.nan, 0.5, 0.7, 0.2], "accept_pos2": [np.nan, 1.0, 0.3, 0.4],
        # rounds start at 0, 5, 6 (bucket 0) and 9, 14 (bucket 8) with bucket 8
        "accepted_lengths": [np.nan, "5 1 3 5 2", "1 1", "2"], "proposed_lengths": [np.nan, "4 4 4 4 4", "4 4", "4"]})


def test_acceptance_along_output_is_acceptance_by_output_position_per_run():
    spec = evaluate.speculative_rows(runs_frame())
    assert list(spec.method) == ["n-gram", "n-gram", "EAGLE head"]
    assert len(evaluate.speculative_rows(runs_frame(), temperature=1.0)) == 1
    along = evaluate.acceptance_along_output(spec, bucket=8)
    first = along[(along.method == "n-gram") & (along.temperature == 0)]
    assert list(first["output position"]) == [0, 8]
    assert first.alpha.tolist() == pytest.approx([(4 + 0 + 2) / (4 + 1 + 3), (4 + 1) / (4 + 2)])
    drops = evaluate.output_drops(along)
    # n-gram: bucket 0 averages its two runs (6/8 and 0/2), bucket 8 only the first (5/6); EAGLE has one bucket
    assert drops == {"n-gram": pytest.approx((0.75 + 0.0) / 2 - 5 / 6)}
    assert evaluate.acceptance_along_output(spec.iloc[:0]).empty


def test_acceptance_by_position_table():
    table = evaluate.acceptance_by_position_table(evaluate.speculative_rows(runs_frame()), gamma=2)
    ngram = table[(table.method == "n-gram") & (table.temperature == 0)].set_index("position").acceptance
    assert ngram.to_dict() == {1: 0.5, 2: 1.0}


def test_article003_side_by_side_best_method_and_geomean():
    summary = pd.DataFrame({"method": ["n-gram", "n-gram", "EAGLE head", "n-gram", "EAGLE head"],
                            "kind": "speculative",
                            "task": ["code", "dialogue", "code", "overall (median)", "overall (median)"],
                            "alpha": [0.4, 0.3, 0.5, 0.35, 0.5], "speedup": [1.2, 1.0, 0.9, 1.1, 0.9],
                            "speedup_geomean_tasks": [np.nan, np.nan, np.nan, math.sqrt(1.2), 0.9],
                            "temperature": [0.0] * 5})
    greedy, side = evaluate.article003_side_by_side(summary)
    assert set(greedy.task) == {"code", "dialogue"}
    assert side.set_index("task").loc["code", "alpha: EAGLE head"] == 0.5
    assert side.set_index("task").loc["code", "article acceptance"] == 0.85
    assert evaluate.best_method(greedy) == "n-gram"
    ours = evaluate.method_by_task(greedy, "n-gram", "alpha")
    assert list(ours.index) == ["code", "summarization", "dialogue", "translation"] and ours.isna().sum() == 2
    assert evaluate.geomean_speedups(summary) == {"n-gram": pytest.approx(math.sqrt(1.2)), "EAGLE head": 0.9}


class WordTokenizer:
    """No chat template: ``chat_ids`` tokenizes the text plainly, one id per character."""
    eos_token_id = None

    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(ch) % 64 for ch in text]])}


def test_run_over_gammas_and_speedup_by_length_on_a_tiny_pair():
    from conftest import tiny_llama

    target, draft = tiny_llama(), tiny_llama(layers=1, seed=1)
    prompts = [{"id": "a", "task": "code", "prompt": "abcabc"}, {"id": "b", "task": "dialogue", "prompt": "hello"}]
    runs = evaluate.run_over_gammas(target, WordTokenizer(), {"tiny": draft}, prompts, [1, 2], max_new_tokens=6,
                                    progress=False)
    assert list(runs.gamma.unique()) == [1, 2] and len(runs) == 2 * 2 * 2
    assert runs[runs.method == "tiny"].same_as_baseline.all()  # greedy: speculative decoding changes nothing
    by_length = evaluate.speedup_by_length(target, WordTokenizer(), "n-gram", sd.NGramDraft(), prompts, [4, 8], gamma=2)
    # no other plain decoding was timed: the baseline can only be ours, plain, on the run's own float32 model (built
    # here, not by load_model, so its linear layers are the unpacked ones transformers makes)
    assert list(by_length.max_new_tokens) == [4, 8]
    assert list(by_length.baseline) == ["autoregressive, float32 unpacked"] * 2


def test_toy_pairs():
    assert list(unbiased.toy_pairs()) == ["article 000 (7 tokens)", "article 004 (Dirichlet, 5 tokens)",
                                          "far apart (Dirichlet 0.5, 6 tokens)"]
