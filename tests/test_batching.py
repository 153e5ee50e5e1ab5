"""Throughput against batch size (``repro/batching.py``, claim C15): on tiny random Llamas with the embedded
tokenizer, one row per (batch size, method) with every row of a batch max_new_tokens long, speedups over the fastest
plain decoding at each batch size, a drafting that refuses a batch kept as skipped with its reason, and bad batch
sizes refused before any work; where speculation stops paying and the C15 check on hand-made tables."""
import math

import pandas as pd
import pytest
import torch

import specdec_lite as sd
from specdec_lite.repro import batching, checks, tasks

R, D = "reproduces", "differs"
TOKENS = 6


@pytest.fixture(scope="module")
def pair(local_pairs):
    return sd.load_pair(str(local_pairs / "tiny-4l"), str(local_pairs / "tiny-1l"), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def prompts():
    return batching.round_robin(tasks.load_prompts(per_task=1))


@pytest.fixture(scope="module")
def measured(pair, prompts):
    target, draft, tokenizer = pair
    drafts = {"trained draft": draft, "n-gram": sd.NGramDraft(), "lookup tree": sd.LookupTreeDraft()}
    other, _ = sd.load_model(target.config._name_or_path, "cpu", "bfloat16")  # a baseline candidate, as 02 passes
    return batching.batch_throughput(target, tokenizer, drafts, prompts, [2, 1], max_new_tokens=TOKENS, gamma=3,
                                     plain={"bfloat16": other})


def test_one_row_per_batch_size_and_method_every_row_max_new_tokens_long(measured):
    assert list(measured.columns) == batching.COLUMNS
    methods = ["autoregressive, float32", "transformers generate, float32", "autoregressive, bfloat16",
               "transformers generate, bfloat16", "trained draft", "n-gram", "lookup tree"]
    assert list(zip(measured.batch, measured.method)) == [(b, m) for b in (1, 2) for m in methods]
    ran = measured[measured.skipped == ""]
    assert (ran.new_tokens == ran.batch * TOKENS).all()
    assert ran.tokens_per_second.sub(ran.new_tokens / ran.seconds).abs().max() < 1e-9
    spec = ran[ran.kind == "speculative"]
    assert (spec.mean_accepted_length >= 1).all() and spec.acceptance_rate.between(0, 1).all()
    assert ran[ran.kind == "plain"].mean_accepted_length.isna().all()


def test_speedups_are_over_the_fastest_plain_decoding_of_every_configuration_at_each_batch_size(measured):
    for batch, rows in measured.groupby("batch"):
        plain = rows[rows.kind == "plain"].set_index("method").tokens_per_second
        assert len(plain) == 4  # ours and generate, on the target and on the candidate
        assert set(rows.baseline) == {plain.idxmax()}
        expected = rows.tokens_per_second / plain.max()
        assert (rows.speedup - expected).abs().max() < 1e-9
        assert rows.set_index("method").speedup[plain.idxmax()] == 1.0


def test_a_drafting_that_refuses_a_batch_is_skipped_with_its_reason(measured):
    tree = measured[measured.method == "lookup tree"].set_index("batch")
    assert tree.skipped[1] == "" and tree.speedup.notna()[1]  # a token tree runs one prompt
    assert "one prompt at a time" in tree.skipped[2] and math.isnan(tree.speedup[2])
    assert batching.draftings(measured) == ["trained draft", "n-gram", "lookup tree"]
    summary = batching.by_batch(measured)
    assert list(summary.batch) == [1, 2] and math.isnan(summary["speedup: lookup tree"].iloc[1])


def test_rows_cycle_the_prompts_left_padded_with_their_mask(pair, prompts):
    _, _, tokenizer = pair
    ids, mask = batching.left_padded_batch(tokenizer, prompts[:2], 3, "cpu", pad_id=0)
    alone = [tasks.chat_ids(tokenizer, p["prompt"])[0] for p in prompts[:2]]
    assert ids.shape == (3, max(map(len, alone))) and torch.equal(ids[2], ids[0])
    for b, row in enumerate([alone[0], alone[1], alone[0]]):
        assert int(mask[b].sum()) == len(row) and torch.equal(ids[b, -len(row):], row)
        assert mask[b, ids.shape[1] - len(row):].all() and not mask[b, : ids.shape[1] - len(row)].any()


def test_round_robin_mixes_the_tasks_in_the_first_rows():
    two = tasks.load_prompts(per_task=2)
    mixed = batching.round_robin(two)
    assert sorted(p["id"] for p in mixed) == sorted(p["id"] for p in two)
    assert len({p["task"] for p in mixed[:4]}) == 4 and [p["id"] for p in mixed[4:]] == [
        p["id"] for p in two if p["id"] not in {q["id"] for q in mixed[:4]}]


@pytest.mark.parametrize("sizes, error", [([], ValueError), ([0, 1], ValueError), ([1, 2.0], ValueError),
                                          ([True], ValueError), ([-2], ValueError), (4, TypeError),
                                          ("1,2", TypeError)])
def test_bad_batch_sizes_are_refused_before_any_work(sizes, error):
    with pytest.raises(error, match="batch_sizes must be"):
        batching.batch_throughput(None, None, {}, [{"prompt": "x"}], sizes)  # nothing is loaded or run first


def test_bad_arguments_are_refused_before_any_work():
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        batching.batch_throughput(None, None, {}, [{"prompt": "x"}], [1], max_new_tokens=0)
    with pytest.raises(ValueError, match="prompts is empty"):
        batching.batch_throughput(None, None, {}, [], [1])
    for label in ("autoregressive", "transformers generate, float16"):
        with pytest.raises(ValueError, match="names of the plain decodings"):
            batching.batch_throughput(None, None, {label: None}, [{"prompt": "x"}], [1])
    with pytest.raises(TypeError, match="plain must be a dict"):
        batching.batch_throughput(None, None, {}, [{"prompt": "x"}], [1], plain=["float16"])
    assert batching.check_batch_sizes([8, 1, 2, 2]) == [1, 2, 8]


def test_the_draftings_of_a_batch_run_are_the_draft_n_gram_and_the_eagle_chain(pair):
    target, draft, _ = pair
    drafts, skipped = batching.batch_drafts(target, draft)
    assert list(drafts) == ["trained draft", "n-gram"] and "no EAGLE head" in skipped["EAGLE head"]


def table_of(speedups: dict, batches=(1, 2, 4, 8), skipped: dict | None = None) -> pd.DataFrame:
    """A hand-made ``batch_throughput`` table: plain decoding at 100 tokens/s, each drafting at its speedups
    (nan: skipped)."""
    rows = []
    for i, batch in enumerate(batches):
        rows.append({"batch": batch, "method": "autoregressive", "kind": "plain", "tokens_per_second": 100.0 * batch,
                     "baseline": "autoregressive", "speedup": 1.0, "skipped": ""})
        for method, values in speedups.items():
            value = values[i]
            rows.append({"batch": batch, "method": method, "kind": "speculative",
                         "tokens_per_second": 100.0 * batch * value, "baseline": "autoregressive", "speedup": value,
                         "skipped": "refused" if math.isnan(value) else ""})
    return pd.DataFrame(rows)


NAN = float("nan")


def test_stop_paying_is_the_batch_from_which_speculation_stays_below_one():
    table = table_of({"a": [1.5, 1.2, 0.9, 0.7], "b": [1.3, 0.9, 1.1, 0.95], "c": [1.2, 1.2, 1.1, 1.05],
                      "d": [0.8, 0.7, 0.6, 0.5], "e": [1.4, NAN, NAN, NAN]})
    assert batching.stop_paying(table) == {"a": 4, "b": 8, "c": None, "d": 1, "e": None}


def test_v_by_batch_stands_beside_the_speedups():
    table = table_of({"a": [1.5, 1.2, 0.9, 0.7]})
    v = pd.DataFrame({"batch": [1, 4, 16], "v(4) = T(5 tokens)/T(1 token)": [1.05, 1.5, 2.1]})
    summary = batching.by_batch(table, v)
    assert list(summary.columns) == ["batch", "baseline", "baseline tokens/s", "speedup: a",
                                     "v(4) = T(5 tokens)/T(1 token)"]
    assert list(summary["speedup: a"]) == [1.5, 1.2, 0.9, 0.7]
    assert summary["v(4) = T(5 tokens)/T(1 token)"].tolist()[:3:2] == [1.05, 1.5]
    assert math.isnan(summary["v(4) = T(5 tokens)/T(1 token)"].iloc[1])


def test_c15_throughput_holds_when_the_best_draftings_gain_shrinks():
    v = pd.DataFrame({"batch": [1, 8], "v(4) = T(5 tokens)/T(1 token)": [1.05, 2.0]})
    table = table_of({"a": [1.5, 1.2, 0.9, 0.7], "b": [1.3, 1.3, 1.2, 1.1], "c": [1.6, NAN, NAN, NAN]})
    row = checks.c15_throughput(table, v)
    assert row.verdict == R and row.claim == "C15" and row.source == "000, 002, 003 (throughput)"
    # the best at batch 1 among those measured at batch 1 and at the largest: c ran at batch 1 only
    assert row.measured.startswith("a, speedup over the fastest plain decoding by batch: 1: 1.50x, 2: 1.20x")
    assert "stops paying from batch: a 4, b never" in row.measured and "v(4) by batch: 1: 1.05, 8: 2.00" in row.measured
    assert "c skipped at batch 2, 4, 8" in row.measured and "0.1" in row.reason


def test_c15_throughput_differs_when_the_gain_holds_up():
    assert checks.c15_throughput(table_of({"a": [1.5, 1.5, 1.45, 1.45]})).verdict == D  # within the tolerance
    assert checks.c15_throughput(table_of({"a": [1.2, 1.3, 1.4, 1.5]})).verdict == D  # grows


def test_c15_throughput_needs_two_batch_sizes_and_a_drafting_that_runs_a_batch():
    assert checks.c15_throughput(table_of({"a": [1.5]}, batches=(1,))).verdict == "not testable here"
    only_one = checks.c15_throughput(table_of({"a": [1.5, NAN]}, batches=(1, 2)))
    assert only_one.verdict == "not testable here" and "a skipped at batch 2" in only_one.measured
