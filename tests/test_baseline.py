"""The baseline rule: every speedup is over the fastest plain decoding timed in the same run, on equal work."""
import math

import pandas as pd
import pytest
import torch

import specdec_lite as sd
from specdec_lite.tuning.devices import dtype_name
from specdec_lite.tuning.packed_linear import can_pack
from specdec_lite.repro import baseline, evaluate

from conftest import tiny_llama
from test_repro_tables import WordTokenizer

# seconds for 100 tokens on prompts a and b
TIMES = {"autoregressive": (5.0, 5.2), "transformers generate": (4.0, 4.4),
         "autoregressive, float32": (3.0, 3.2), "transformers generate, float32": (3.5, 3.0),
         "hybrid": (2.0, 1.6)}


def frame(times=TIMES, plain=lambda m: m != "hybrid"):
    rows = [{"id": pid, "task": "code", "method": m, "temperature": 0.0, "new_tokens": 100, "seconds": t[i],
             "plain": plain(m)} for m, t in times.items() for i, pid in enumerate("ab")]
    return pd.DataFrame(rows)


def test_speedups_are_over_the_candidate_with_the_lowest_median_time_per_token():
    runs = baseline.add_speedups(frame(), own="bfloat16")
    # medians: ours float32 3.1, transformers float32 3.25, transformers 4.2, ours 5.1 -> ours float32
    assert set(runs.baseline) == {"autoregressive, float32"}
    hybrid = runs[runs.method == "hybrid"].set_index("id")
    assert hybrid.speedup.to_dict() == pytest.approx({"a": 3.0 / 2.0, "b": 3.2 / 1.6})  # prompt by prompt
    assert hybrid.speedup_same_config.to_dict() == pytest.approx({"a": 5.0 / 2.0, "b": 5.2 / 1.6})


def test_the_runs_own_configuration_is_named_when_it_is_the_fastest():
    times = {**TIMES, "autoregressive": (1.0, 1.1)}
    runs = baseline.add_speedups(frame(times), own="bfloat16")
    assert set(runs.baseline) == {"autoregressive, bfloat16"}


def test_a_configuration_slowed_down_or_not_plain_is_never_the_baseline():
    """A batch-invariant run's own rows are not candidates, however fast; without any candidate it is refused."""
    times = {**TIMES, "autoregressive": (1.0, 1.1)}
    runs = baseline.add_speedups(frame(times, plain=lambda m: m not in ("hybrid", "autoregressive")), own="x")
    assert set(runs.baseline) == {"autoregressive, float32"}
    with pytest.raises(ValueError, match="no plain decoding was timed"):
        baseline.add_speedups(frame(plain=lambda m: False), own="x")


def test_speedups_are_per_temperature():
    hot = frame({m: (2 * a, 2 * b) for m, (a, b) in {**TIMES, "transformers generate": (1.0, 1.0)}.items()})
    runs = baseline.add_speedups(pd.concat([frame(), hot.assign(temperature=1.0)], ignore_index=True), own="bf16")
    assert runs.groupby("temperature").baseline.first().to_dict() == {
        0.0: "autoregressive, float32", 1.0: "transformers generate, bf16"}


def test_first_divergence_and_greedy_agreement():
    t = torch.tensor
    assert evaluate.first_divergence(t([1, 2, 3, 4]), t([1, 2, 5, 4])) == 2
    assert math.isnan(evaluate.first_divergence(t([1, 2]), t([1, 2])))
    assert evaluate.first_divergence(t([1, 2]), t([1, 2, 3])) == 2
    runs = pd.DataFrame({"method": ["autoregressive", "tree", "tree", "tree", "autoregressive, float32"],
                         "kind": ["plain", "speculative", "speculative", "speculative", "plain"],
                         "temperature": 0.0, "same_as_baseline": [True, True, False, False, False],
                         "first_divergence": [math.nan, math.nan, 10.0, 30.0, 3.0]})
    table = evaluate.greedy_agreement(runs).set_index("method")
    assert list(table.index) == ["tree"]  # plain decoding in another dtype is not an agreement figure
    assert table.loc["tree", "runs"] == 3 and table.loc["tree", "identical"] == pytest.approx(1 / 3)
    assert table.loc["tree", "median_first_divergence"] == 20.0


def test_run_prompts_times_every_candidate_on_equal_work():
    """Plain candidates run beside the draft, every run is max_new_tokens long, speedups name their baseline."""
    target, other = tiny_llama(), tiny_llama(seed=5)
    prompts = [{"id": "a", "task": "code", "prompt": "abcabc"}, {"id": "b", "task": "dialogue", "prompt": "hello"}]
    runs = evaluate.run_prompts(target, WordTokenizer(), {"tiny": tiny_llama(layers=1, seed=1)}, prompts,
                                max_new_tokens=7, progress=False, transformers=evaluate.transformers_methods(),
                                plain={"copy": other})
    assert set(runs.method) == {"autoregressive", "tiny", "transformers generate", "transformers prompt lookup",
                                "autoregressive, copy", "transformers generate, copy"}
    assert (runs.new_tokens == 7).all()
    assert set(runs[runs.plain].method) == {"autoregressive", "transformers generate", "autoregressive, copy",
                                            "transformers generate, copy"}
    assert runs.baseline.nunique() == 1 and runs.baseline.iloc[0].split(", ")[-1] in (
        baseline.configuration(target), "copy")
    assert set(runs[runs.kind == "speculative"].method) == {"tiny"}


def test_the_bench_table_gives_medians_speeds_and_greedy_identity_per_configuration():
    from specdec_lite.repro import bench

    rows = []
    for pid, (plain32, plain16, auto16) in {"a": (4.0, 2.0, 1.0), "b": (4.4, 2.2, 2.0), "c": (4.2, 2.4, 1.2)}.items():
        for config, method, seconds, same, diverge in (("float32", "ours autoregressive", plain32, True, math.nan),
                                                       ("bfloat16", "ours autoregressive", plain16, True, math.nan),
                                                       ("bfloat16", "auto", auto16, pid == "a", 40.0)):
            rows.append({"id": pid, "task": "translation" if pid == "c" else "code", "temperature": 0.0,
                         "configuration": config, "method": f"{method}, {config}",
                         "seconds": seconds, "new_tokens": 100, "plain": method != "auto", "warmup_seconds": 2.0,
                         "same_as_baseline": same, "first_divergence": math.nan if same else diverge,
                         "speedup_same_config": (plain16 if config == "bfloat16" else plain32) / seconds,
                         "kind": "speculative" if method == "auto" else "plain",
                         "rounds": {"a": 40, "b": 50, "c": 25}[pid] if method == "auto" else 100,
                         **({"draft_cost_per_round": 0.5, "v": 1.5} if method == "auto" else {})})
    runs = baseline.over_fastest(pd.DataFrame(rows))
    table = bench.table(runs).set_index(["configuration", "method"])
    auto = table.loc[("bfloat16", "auto")]
    assert auto["ms/token"] == pytest.approx(12.0) and auto["speed vs baseline"] == pytest.approx(2.0)  # 2.4/1.2
    assert auto["greedy identical"] == "1/3" and auto["first divergence (median)"] == 40.0
    # per task: code, the median of 2.2/2.0 and 2.0/1.0 = 1.55; translation 2.4/1.2 = 2.0
    assert auto["slowest task"] == pytest.approx(1.55)
    assert auto["geomean over tasks"] == pytest.approx(math.sqrt(1.55 * 2.0))
    assert auto["tau"] == pytest.approx(300 / 115)  # tokens over rounds, the three runs pooled
    assert auto["cost model vs same configuration"] == pytest.approx(300 / 115 / (0.5 + 1.5))
    assert math.isnan(table.loc[("float32", "ours autoregressive"), "tau"])
    assert table.loc[("float32", "ours autoregressive"), "speed vs baseline"] == pytest.approx(0.5)
    assert set(table.baseline) == {"ours autoregressive, bfloat16"}


def test_half_precision_is_a_baseline_candidate_even_where_it_is_emulated(local_pairs):
    """On a CPU without native bfloat16, plain decoding in emulated half precision can still beat float32 (it
    reads half the bytes a step), so a float32 run times both halves too, on every CPU kind; a half-precision run
    times float32 and the other half. In each dtype whose linear layers ours packs, the model as transformers loads
    it is a candidate too (float32 wherever torch has oneDNN, bfloat16 where oneDNN computes it). ``limit`` keeps
    the first ones."""
    unpacked = [d for d in (torch.float32, torch.bfloat16) if can_pack(torch.device("cpu"), d)]
    unpacked_names = {dtype_name(d) + " unpacked" for d in unpacked}
    target, _ = sd.load_model(str(local_pairs / "tiny-2l"), device="cpu", dtype="float32")
    others = baseline.plain_candidates(target)
    assert set(others) == {"bfloat16", "float16"} | unpacked_names
    assert [m.dtype for m in others.values()] == [torch.bfloat16, torch.float16] + unpacked
    assert all(baseline.configuration(model) == name for name, model in others.items())  # named before loading
    assert list(baseline.plain_candidates(target, limit=1)) == ["bfloat16"]  # a smoke run's one, loaded alone
    half, _ = sd.load_model(str(local_pairs / "tiny-2l"), device="cpu", dtype="bfloat16")
    assert set(baseline.plain_candidates(half)) == {"float32", "float16"} | unpacked_names


def test_the_embedded_target_on_its_4_bit_blocks_is_a_candidate_wherever_the_kernel_runs():
    """On every CPU, native bfloat16 or not (on an AVX2-only CPU its step was the fastest: docs/INT4.md); a model
    without a GGUF here has no 4-bit configuration."""
    cpu = torch.device("cpu")
    int4 = [c for c in baseline.plain_configurations(cpu, sd.EMBEDDED_TARGET) if c["int4"]]
    assert int4 == [dict(dtype=torch.bfloat16, packed_linears=None, int4=True)]
    assert baseline.label(int4[0]) == "bfloat16" + baseline.INT4
    assert not any(c["int4"] for c in baseline.plain_configurations(cpu, "some-org/some-model"))


def test_the_bench_drafts_in_native_dtypes_and_times_emulated_half_precision_plainly(local_pairs, tmp_path):
    """Emulated half precision, and each dtype as transformers loads it (where ours packs its linear layers), are
    timed plainly: baseline candidates, not configurations to draft in. The per-run rows are on disk as they are
    measured (a run cut off keeps them). ``only`` times the configurations it names and refuses a label the run
    does not have."""
    from specdec_lite.tuning.devices import native_dtypes, plain_dtypes
    from specdec_lite.repro import bench

    cpu = torch.device("cpu")
    runs = bench.run(str(local_pairs / "tiny-2l"), "cpu", prompts_per_task=1, max_new_tokens=4, temperatures=(0.0,),
                     drafts=("n-gram",), progress=False, batch_invariant=False,
                     runs_out=bench.beside(tmp_path / "table.csv", "runs"))
    written = pd.read_csv(tmp_path / "table_runs.csv")
    assert len(written) == len(runs) and set(written.configuration) == set(runs.configuration)
    unpacked = {dtype_name(d) + " unpacked" for d in plain_dtypes(cpu) if can_pack(cpu, d)}
    configs = {dtype_name(d) for d in plain_dtypes(cpu)} | unpacked
    drafted = {dtype_name(d) for d in native_dtypes(cpu)}
    assert set(runs.configuration) == configs
    assert set(runs[runs.kind == "speculative"].configuration) == drafted
    for config in configs - drafted:
        assert set(runs[runs.configuration == config].method) == {f"ours autoregressive, {config}",
                                                                  f"transformers generate, {config}"}
    assert runs.baseline.nunique() == 1 and runs.baseline.iloc[0] in set(runs[runs.plain].method)
    assert (runs.new_tokens == 4).all()
    one = next(iter(drafted))  # --only: that configuration alone, its own plain decoding the baseline
    alone = bench.run(str(local_pairs / "tiny-2l"), "cpu", prompts_per_task=1, max_new_tokens=4, temperatures=(0.0,),
                      drafts=("n-gram",), progress=False, batch_invariant=False, only=[one])
    assert set(alone.configuration) == {one} and set(alone.baseline) <= {f"ours autoregressive, {one}",
                                                                         f"transformers generate, {one}"}
    with pytest.raises(ValueError, match="no such configuration here"):
        bench.run(str(local_pairs / "tiny-2l"), "cpu", prompts_per_task=1, max_new_tokens=4, temperatures=(0.0,),
                  drafts=("n-gram",), progress=False, batch_invariant=False, only=["bfloat16 compiled"])
