"""The GPU check's benchmark, at tiny shapes on the CPU (the smoke version `make test` runs), and its oracle
drafter, whose acceptance is set by construction."""
import csv
import math

import pytest
import torch

import specdec_lite as sd
from specdec_lite.repro import gpu_bench
from specdec_lite.repro.evaluate import alpha_estimate

GREEDY = sd.SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def tiny_pair():
    return (gpu_bench.random_llama("tiny-target", "cpu", torch.float32, seed=0),
            gpu_bench.random_llama("tiny-draft", "cpu", torch.float32, seed=1))


def test_random_llamas_have_the_real_shapes():
    with torch.device("meta"):
        from transformers import LlamaConfig, LlamaForCausalLM
        big = LlamaForCausalLM(LlamaConfig(**gpu_bench.SHAPES["llama-3.1-8b"]))
        small = LlamaForCausalLM(LlamaConfig(**gpu_bench.SHAPES["llama-3.2-1b"]))
    assert round(sum(p.numel() for p in big.parameters()) / 1e9, 2) == 8.03
    assert round(sum(p.numel() for p in small.parameters()) / 1e9, 2) == 1.24
    model = gpu_bench.random_llama("tiny-draft", "cpu", torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16 and torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("a, accepted", [(1.0, 5), (0.0, 1)])
def test_the_oracle_sets_acceptance_by_construction(tiny_pair, a, accepted):
    target, draft = tiny_pair
    x = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    reference = sd.autoregressive_generate(target, x, max_new_tokens=40, sampling=GREEDY).tokens
    spec = sd.speculative_generate(target, gpu_bench.OracleDraft(draft, reference, 8, a), x, gamma=4,
                                   max_new_tokens=40, sampling=GREEDY)
    assert torch.equal(spec.tokens, reference)
    assert set(spec.stats.accepted_lengths[:-1]) == {accepted}


def test_the_oracle_acceptance_rate_matches_a(tiny_pair):
    """At a = 0.7 the per-position acceptance, counted like alpha over 400 tokens, is within 0.1 of 0.7."""
    target, draft = tiny_pair
    x = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    reference = sd.autoregressive_generate(target, x, max_new_tokens=400, sampling=GREEDY).tokens
    spec = sd.speculative_generate(target, gpu_bench.OracleDraft(draft, reference, 8, 0.7, seed=3), x, gamma=4,
                                   max_new_tokens=400, sampling=GREEDY)
    alpha = alpha_estimate(spec.stats.accepted_lengths, spec.stats.proposed_lengths)
    assert abs(alpha - 0.7) < 0.1, alpha


def test_the_smoke_benchmark_writes_its_csv_and_figure(tmp_path):
    rows = gpu_bench.run("cpu", "tiny", ("eager-dynamic", "static-eager"), "float32", new_tokens=16, repeats=1,
                         log=lambda line: None)
    assert [r["path"] for r in rows] == ["eager-dynamic", "static-eager"]
    for r in rows:
        assert r["device"] == "CPU" and r["dtype"] == "float32" and r["target"] == "tiny-target"
        # c = T_draft(1) / T_target(1): the ratio of the two ms/token columns of the same measurement
        assert r["c"] == pytest.approx(r["draft ms/token"] / r["target ms/token"])
        # neither path is compiled, so v is measured at every gamma 1..8 (a compiled path has v(4) only)
        assert not any(math.isnan(r[f"v({g})"]) for g in range(1, 9))
        # the prediction at gamma 4 is E[N] / (4 c + v(4)) from the row's own c and v(4); E[N] = 1 + a + ... + a^4
        # by hand: 1 + 0.6 + 0.36 + 0.216 + 0.1296, 1 + 0.8 + 0.64 + 0.512 + 0.4096, 1 + 0.9 + 0.81 + 0.729 + 0.6561
        for a, expected_tokens in ((0.6, 2.3056), (0.8, 3.3616), (0.9, 4.0951)):
            assert r[f"predicted speedup a={a}"] * (4 * r["c"] + r["v(4)"]) == pytest.approx(expected_tokens)
        fastest = max([x["ours autoregressive tokens/s"] for x in rows] + [r["transformers generate tokens/s"]])
        assert r["baseline tokens/s"] == fastest  # float32 run: no other dtype to try
        assert r["speedup a=0.8"] == pytest.approx(r["speculative tokens/s a=0.8"] / fastest)
        assert all(r[f"greedy identical a={a}"] is True for a in gpu_bench.ACCEPTANCES)  # float32 stops otherwise
    path = gpu_bench.write_csv(rows, tmp_path / "gpu_check.csv")
    with open(path) as f:
        assert len(list(csv.DictReader(f))) == 2
    assert gpu_bench.write_figure(rows, tmp_path / "gpu_check.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="unknown paths"):
        gpu_bench.run("cpu", "tiny", ("eager",), "float32")


def test_speedups_are_over_the_fastest_plain_decoding_of_any_path_or_dtype():
    def row(path, ours):
        return {"path": path, "dtype": "bfloat16", "ours autoregressive tokens/s": ours,
                "transformers generate tokens/s": 90.0, **{f"speculative tokens/s a={a}": 200.0 for a in gpu_bench.ACCEPTANCES}}
    rows = [row("eager-dynamic", 80.0), row("static-compiled", 150.0)]
    gpu_bench.add_baseline(rows, {"transformers generate (float32)": 60.0})
    assert {r["baseline"] for r in rows} == {"ours autoregressive (static-compiled, bfloat16)"}
    assert [r["speedup a=0.8"] for r in rows] == pytest.approx([200 / 150, 200 / 150])
    rows = [row("eager-dynamic", 80.0)]
    gpu_bench.add_baseline(rows, {"transformers generate (float32)": 120.0})
    assert rows[0]["baseline"] == "transformers generate (float32)" and rows[0]["speedup a=0.6"] == pytest.approx(200 / 120)


def test_half_precision_records_greedy_identity_instead_of_stopping():
    """In bfloat16 the speculative output may part from the plain one (a forward over several tokens rounds
    differently): the row says whether it did, for each acceptance, and the check goes on (it stopped here once,
    on the tiny pair on a CPU with native bfloat16, before reaching a GPU)."""
    target = gpu_bench.random_llama("tiny-target", "cpu", torch.bfloat16, seed=0)
    draft = gpu_bench.random_llama("tiny-draft", "cpu", torch.bfloat16, seed=1)
    row = gpu_bench.measure_pair(target, draft, "eager-dynamic", prompt_len=8, new_tokens=48, repeats=1)
    assert all(isinstance(row[f"greedy identical a={a}"], bool) for a in gpu_bench.ACCEPTANCES)
