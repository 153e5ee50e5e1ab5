"""checks.py: every claim's check returns 'reproduces' on one side of its tolerance and 'differs' on the other."""
import warnings

import pandas as pd
import pytest

from specdec_lite.repro import checks

R, D = "reproduces", "differs"


def mutation(correct_p, mutant_ps):
    return pd.DataFrame({"verifier": ["correct verifier"] + [f"m{i}" for i in range(len(mutant_ps))],
                         "p-value": [correct_p, *mutant_ps]})


def test_c1_exact_and_mutants():
    assert checks.c1_exact_and_mutants(1e-12, 18, mutation(0.24, [0, 0]), 1000, 1e-3).verdict == R
    assert checks.c1_exact_and_mutants(1e-6, 18, mutation(0.24, [0, 0]), 1000, 1e-3).verdict == D  # not exact
    assert checks.c1_exact_and_mutants(1e-12, 18, mutation(1e-4, [0, 0]), 1000, 1e-3).verdict == D  # correct rejected
    row = checks.c1_exact_and_mutants(1e-12, 18, mutation(0.24, [0, 0.5]), 1000, 1e-3)
    assert row.verdict == D and "all 2 broken verifiers rejected: False" in row.measured


def test_c1_real_pair():
    assert checks.c1_real_pair(0.5, 600, "t", "d", 1e-3).verdict == R
    assert checks.c1_real_pair(1e-5, 600, "t", "d", 1e-3).verdict == D


def test_c2_overlap():
    table = pd.DataFrame({"overlap (exact)": [0.95, 0.96], "acceptance (measured)": [0.95, 0.961], "|z|": [0.1, 3.9]})
    row = checks.c2_overlap(table, 1000)
    assert row.verdict == R and row.measured == "0.9500 vs 0.9500; 0.9600 vs 0.9610"
    assert checks.c2_overlap(table.assign(**{"|z|": [0.1, 4.1]}), 1000).verdict == D


def test_c3_article000_check():
    null = pd.DataFrame({"KL": [1e-5, 2e-5], "max deviation": [0.001, 0.002]})
    assert checks.c3_article000_check(9e-5, 0.003, null, {"as published": 0.5}, 1e-3).verdict == R
    assert checks.c3_article000_check(9e-5, 0.003, null, {"as published": 1e-9}, 1e-3).verdict == D  # biased listing
    assert checks.c3_article000_check(1.1e-4, 0.003, null, {"as published": 0.5}, 1e-3).verdict == D  # KL > 5x
    assert checks.c3_article000_check(9e-5, 0.0041, null, {"as published": 0.5}, 1e-3).verdict == D  # dev > 2x


def test_c4_round_bounds():
    bounds = pd.DataFrame({"gamma": [1, 4], "min": [1, 1], "max": [2, 5]})
    row = checks.c4_round_bounds(bounds)
    assert row.verdict == R and row.measured == "gamma 1: 1..2; gamma 4: 1..5"
    assert checks.c4_round_bounds(bounds.assign(max=[2, 6])).verdict == D
    assert checks.c4_round_bounds(bounds.assign(min=[0, 1])).verdict == D


def test_c16_penalty():
    table = pd.DataFrame({"sampling": ["temperature 1", "repetition penalty 1.3"], "max |spec - target|": [1e-3, 1e-12]})
    assert checks.c16_penalty(table).verdict == R  # only the penalty rows count
    assert checks.c16_penalty(table.assign(**{"max |spec - target|": [0, 1e-8]})).verdict == D


def test_c17_truncation():
    table = pd.DataFrame({"total variation to the target": [0.2, 0.7]})
    assert checks.c17_truncation(table).verdict == R
    assert checks.c17_truncation(table.assign(**{"total variation to the target": [0.0005, 0.7]})).verdict == D


def test_c22_article004_check():
    table = pd.DataFrame({"leak": [0.0, 0.1, 0.4], "passes": [True, False, False], "chi_square_pvalue": [0.4, 0, 0],
                          "chi_square_rejects": [False, True, True]})
    assert checks.c22_article004_check(table).verdict == R
    blind = checks.c22_article004_check(table.assign(passes=[True, True, False]))
    assert blind.verdict == D and "leak 0.1 also pass" in blind.measured
    assert checks.c22_article004_check(table.assign(passes=[False, False, False])).verdict == D


def test_c5_article000_table():
    table = pd.DataFrame({"alpha": [0.5, 0.8], "c": [0.1, 0.1], "gamma": [5, 4], "article": [1.312, 2.4],
                          "formula": [1.312, 2.401], "matches (0.006)": [True, True], "simulated": [1.31, 2.40]})
    assert checks.c5_article000_table(table).verdict == R
    assert checks.c5_article000_table(table.assign(simulated=[1.31, 2.46])).verdict == D  # simulation off by 0.059
    slip = checks.c5_article000_table(table.assign(article=[1.24, 2.4], **{"matches (0.006)": [False, True]}))
    assert slip.verdict == D and "printed 1.24, formula 1.312" in slip.measured


def test_c6_optimal_gamma():
    optimal = pd.DataFrame({"alpha": [0.5, 0.8], "c": [0.1, 0.1], "best gamma": [2, 6], "speedup": [1.25, 2.47]})
    assert checks.c6_optimal_gamma(optimal).verdict == R  # ratio 1.98
    assert checks.c6_optimal_gamma(optimal.assign(speedup=[1.46, 2.47])).verdict == D  # ratio 1.69
    assert checks.c6_optimal_gamma(optimal.assign(**{"best gamma": [2, 8]})).verdict == D


def test_c7_limit():
    limits = pd.DataFrame({"E[N] at gamma 200": [2.0, 10.0], "article: alpha/(1-alpha)": [1.0, 9.0]})
    assert checks.c7_limit(limits).verdict == D
    assert checks.c7_limit(limits.assign(**{"article: alpha/(1-alpha)": [2.0, 10.0]})).verdict == R


def test_c8_worked_example():
    table = pd.DataFrame({"article speedup": [2.3, 1.8], "formula speedup": [2.36, 1.85]})
    assert checks.c8_worked_example(table, 3.25).verdict == R
    assert checks.c8_worked_example(table, 3.36).verdict == D  # E[N] is not K x alpha
    assert checks.c8_worked_example(table.assign(**{"formula speedup": [2.401, 1.85]}), 3.25).verdict == D


def test_c9_latency():
    table = pd.DataFrame({"acceptance": [0.7, 0.3], "E[N]": [3.2, 1.43], "speedup": [1.78, 0.79],
                          "article speedup": [3.7, 1.3]})
    assert checks.c9_latency(table).verdict == D
    assert checks.c9_latency(table.assign(speedup=[3.55, 1.45])).verdict == R


def test_c10_break_even():
    assert checks.c10_break_even(0.051, 0.201).verdict == D
    assert checks.c10_break_even(0.051, 0.52).verdict == R
    assert checks.c10_break_even(0.21, 0.52).verdict == D


def test_c19_verification_cost():
    assert checks.c19_verification_cost({1: 1.1, 4: 1.19}).verdict == R
    assert checks.c19_verification_cost({1: 1.1, 4: 1.35}).verdict == D
    assert checks.c19_verification_cost({1: 1.1, 2: 1.3}).verdict == D  # no v(4): the largest measured


def test_c20_memory_floor():
    row = checks.c20_memory_floor(540e6, 44.0, 0.0386)
    assert row.verdict == R and "arithmetic: 7.0 ms and 4.2 ms" in row.measured and "12.3 ms floor" in row.measured


def test_c12_three_x():
    assert checks.c12_three_x(0.07, {4: 1.35}).verdict == R  # formula: 2.80x at c = 0.05
    assert checks.c12_three_x(0.07, {4: 1.35}, draft_c=0.1).verdict == D  # 2.40x
    assert "v(4) 1.35" in checks.c12_three_x(0.07, {4: 1.35}).measured


def test_c13_sweet_spot():
    assert checks.c13_sweet_spot(0.6, 5, 0.35, 0.07).verdict == R
    assert checks.c13_sweet_spot(0.75, 5, 0.35, 0.07).verdict == D
    assert checks.c13_sweet_spot(0.6, 3, 0.35, 0.07).verdict == D


def test_c11_tasks():
    tasks = ["code", "summarization", "dialogue", "translation"]
    article = [0.85, 0.75, 0.55, 0.80]
    speedups = pd.Series([1.2, 1.1, 0.9, 1.0], index=tasks)
    good = pd.Series([0.9, 0.7, 0.5, 0.8], index=tasks)  # same order, within 0.1
    assert checks.c11_tasks("n-gram", good, article, speedups, "ours plain, float32").verdict == R
    assert checks.c11_tasks("n-gram", good - 0.2, article, speedups, "ours plain, float32").verdict == D  # magnitude
    assert checks.c11_tasks("n-gram", pd.Series([0.9, 0.5, 0.7, 0.8], index=tasks), article, speedups, "ours plain, float32").verdict == D
    assert checks.c11_tasks("n-gram", good.where(good > 0.6), article, speedups, "ours plain, float32").verdict == D  # a task missing
    flat = pd.Series([0.0] * 4, index=tasks)  # no order at all (a random pair): differs, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checks.c11_tasks("n-gram", flat, article, speedups, "ours plain, float32").verdict == D


def test_c21_heads_order():
    row = checks.c21_heads_order({"Medusa heads": 0.9, "EAGLE head": 1.1, "n-gram": 1.2}, "ours plain, float32")
    assert row.verdict == R and row.measured.endswith("n-gram 1.20x, EAGLE head 1.10x, Medusa heads 0.90x")
    assert checks.c21_heads_order({"Medusa heads": 1.2, "EAGLE head": 1.1}, "ours plain").verdict == D
    untested = checks.c21_heads_order({"n-gram": 1.2}, "ours plain")  # a target with no heads trained for it
    assert untested.verdict == "not testable here" and "00_train_heads" in untested.reason


def test_c18_along_output():
    assert checks.c18_along_output({"a": 0.1, "b": 0.06}).verdict == R
    assert checks.c18_along_output({"a": 0.1, "b": 0.04}).verdict == D
    assert checks.c18_along_output({}).verdict == D


def test_c14_short_outputs():
    table = pd.DataFrame({"max_new_tokens": [16, 128], "speedup": [1.0, 1.2], "baseline": "ours plain, float32"})
    row = checks.c14_short_outputs("n-gram", table)
    assert row.verdict == R and "over ours plain, float32" in row.measured
    assert checks.c14_short_outputs("n-gram", table.assign(speedup=[1.06, 1.04])).verdict == D
    assert checks.c14_short_outputs("n-gram", table.assign(speedup=[1.15, 1.5])).verdict == D
    assert checks.c14_short_outputs("n-gram", table, source="003 (servers)").source == "003 (servers)"


def test_c15_batch():
    table = pd.DataFrame({"batch": [1, 16], "v(4) = T(5 tokens)/T(1 token)": [1.4, 2.5]})
    row = checks.c15_batch(4, table)
    assert row.verdict == R and row.measured.endswith("1: 1.40, 16: 2.50")
    assert checks.c15_batch(4, table.assign(**{"v(4) = T(5 tokens)/T(1 token)": [1.4, 1.5]})).verdict == D


def test_c15_throughput():
    """More cases in test_batching.py."""
    rows = [{"batch": b, "method": m, "kind": "speculative", "speedup": s, "skipped": ""}
            for b, speedups in ((1, {"n-gram": 1.3, "trained draft": 1.1}), (8, {"n-gram": 0.8, "trained draft": 0.9}))
            for m, s in speedups.items()]
    table = pd.DataFrame(rows)
    row = checks.c15_throughput(table)
    assert row.verdict == R and row.measured.startswith("n-gram, speedup over the fastest plain decoding by batch: "
                                                        "1: 1.30x, 8: 0.80x")
    assert checks.c15_throughput(table.assign(speedup=[1.3, 1.1, 1.25, 0.9])).verdict == D


def test_c15_concurrency():
    table = pd.DataFrame({"concurrency": [1, 4, 16], "speedup": [1.4, 1.3, 1.2], "baseline": "plain server"})
    row = checks.c15_concurrency("vLLM", table, batches=True)
    assert row.verdict == R and row.measured.endswith("1: 1.40x, 4: 1.30x, 16: 1.20x")
    assert row.source == "003 (servers)"
    assert checks.c15_concurrency("vLLM", table.assign(speedup=[1.4, 1.4, 1.38]), batches=True).verdict == D
    queued = checks.c15_concurrency("local server", table, batches=False)  # no batching: not the claim's regime
    assert queued.verdict == "not testable here" and queued.measured.endswith("1: 1.40x, 4: 1.30x, 16: 1.20x")


@pytest.mark.parametrize("name", [n for n in dir(checks) if n[:1] == "c" and n[1:2].isdigit()])
def test_every_check_has_a_test(name):
    assert f"test_{name}" in globals()
