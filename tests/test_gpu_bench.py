"""The GPU check's benchmark, at tiny shapes on the CPU (the smoke version `make test` runs, compiled paths
included), its oracle drafter, whose acceptance is set by construction, and the target made so that rounding
cannot move its greedy output."""
import csv
import subprocess
import sys

import pytest
import torch

import specdec_lite as sd
from specdec_lite.core.lm import use_static_cache
from specdec_lite.repro import gpu_bench, theory
from specdec_lite.repro.evaluate import alpha_estimate

GREEDY = sd.SamplingParams(temperature=0)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a 2-core machine busy with other work two threads spinning on
    each other made these tests up to 50 times slower (the benchmark's tiny plan runs on one thread likewise)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    with pytest.raises(ValueError, match="unknown shape"):
        gpu_bench.random_llama("llama-9b", "cpu", torch.float32)


@pytest.mark.parametrize("a, accepted", [(1.0, 5), (0.0, 1)])
def test_the_oracle_sets_acceptance_by_construction(tiny_pair, a, accepted):
    target, draft = tiny_pair
    x = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    reference = sd.autoregressive_generate(target, x, max_new_tokens=40, sampling=GREEDY).tokens
    spec = sd.speculative_generate(target, gpu_bench.OracleDraft(draft, reference, 8, a), x, gamma=4,
                                   max_new_tokens=40, sampling=GREEDY)
    assert torch.equal(spec.tokens, reference)
    assert set(spec.stats.accepted_lengths[:-1]) == {accepted}
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        gpu_bench.OracleDraft(draft, reference, 8, 1.5)


def test_the_oracle_acceptance_rate_matches_a(tiny_pair):
    """At a = 0.7 the per-position acceptance, counted like alpha over 400 tokens, is within 0.1 of 0.7; the
    benchmark's own count (no numpy) is evaluate's."""
    target, draft = tiny_pair
    x = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    reference = sd.autoregressive_generate(target, x, max_new_tokens=400, sampling=GREEDY).tokens
    spec = sd.speculative_generate(target, gpu_bench.OracleDraft(draft, reference, 8, 0.7, seed=3), x, gamma=4,
                                   max_new_tokens=400, sampling=GREEDY)
    alpha = alpha_estimate(spec.stats.accepted_lengths, spec.stats.proposed_lengths)
    assert abs(alpha - 0.7) < 0.1, alpha
    assert gpu_bench.pooled_acceptance(spec.stats.accepted_lengths, spec.stats.proposed_lengths) == pytest.approx(alpha)


def test_rounding_cannot_move_the_unambiguous_targets_greedy_output():
    """In bfloat16 a forward over gamma + 1 tokens rounds differently from a decode step, and on the random tiny
    target the oracle's speculative output parted from the plain one at token 34 on a 2-core Intel Xeon (after which
    the oracle's proposals no longer follow the context and its acceptance collapses: 1.27 tokens a round at
    a = 0.8). Made unambiguous, the target repeats its last token, the outputs agree, and the acceptance is the
    oracle's."""
    x = torch.randint(3, 512, (1, 32), generator=torch.Generator().manual_seed(0))
    target = gpu_bench.make_greedy_unambiguous(gpu_bench.random_llama("tiny-target", "cpu", torch.bfloat16, seed=0))
    draft = gpu_bench.random_llama("tiny-draft", "cpu", torch.bfloat16, seed=1)
    plain = sd.autoregressive_generate(target, x, max_new_tokens=96, sampling=GREEDY, ignore_eos=True).tokens
    spec = sd.speculative_generate(target, gpu_bench.OracleDraft(draft, plain, 32, 0.8), x, gamma=4,
                                   max_new_tokens=96, sampling=GREEDY, ignore_eos=True)
    assert set(plain.tolist()) == {int(x[0, -1])} and torch.equal(plain, spec.tokens)
    assert abs(spec.stats.acceptance_rate - 0.8) < 0.15


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The whole benchmark at tiny shapes, float32 (greedy identity is then checked, not only recorded), gamma 4
    at a = 0.8 and 0.6 only (each gamma compiles a graph); the CSV's rows counted each time a row is logged."""
    out = tmp_path_factory.mktemp("gpu_check")
    seen = []

    def log(line):
        if line.endswith("s so far]"):  # a row's line (others report the measured costs)
            seen.append(len(read_csv(out / "gpu_check.csv")))

    rows = gpu_bench.run("cpu", "tiny", "float32", out=out, log=log, new_tokens=64, repeats=2, gammas=(4,),
                         acceptances=(0.8, 0.6))
    return rows, out, seen


def test_every_row_is_in_the_csv_as_soon_as_it_is_measured(smoke):
    rows, out, seen = smoke
    assert seen == list(range(1, len(rows) + 1))  # at each row's log line, the file already held it
    written = read_csv(out / "gpu_check.csv")
    assert list(written[0]) == gpu_bench.COLUMNS
    assert [r["row"] for r in written] == [name for name, _, _ in gpu_bench.PLAIN_ROWS] + [
        "oracle a=0.8 gamma=4", "oracle a=0.6 gamma=4", "auto tree (oracle head) a=0.8 gamma=4"]
    assert all(float(r["seconds"]) > 0 for r in written if r["status"] == "measured")


def test_the_plain_rows_compare_with_generate_on_the_same_cache(smoke):
    rows, _, _ = smoke
    by_name = {r["row"]: r for r in rows}
    assert all(r["device"] == "CPU" and r["dtype"] == "float32" and r["status"] == "measured"
               for r in rows[:len(gpu_bench.PLAIN_ROWS)])
    for ours, generate in gpu_bench.SAME_CACHE.items():
        assert by_name[ours]["over generate same cache"] == pytest.approx(
            by_name[ours]["tokens/s"] / by_name[generate]["tokens/s"])
    assert by_name["ours plain static compiled"]["over generate eager"] == pytest.approx(
        by_name["ours plain static compiled"]["tokens/s"] / by_name["generate eager"]["tokens/s"])


def test_the_oracle_rows_stand_beside_the_formula(smoke):
    rows, _, _ = smoke
    plain = rows[:len(gpu_bench.PLAIN_ROWS)]
    fastest = max(plain, key=lambda r: r["tokens/s"])
    for r in (r for r in rows if r["kind"] == "ours speculative"):
        assert r["gamma"] == 4 and r["greedy identical"] is True and r["path"] == "static-compiled"
        # E[N] / (4 c + v(4)) from the row's own c and v(4); E[N] = 1 + a + ... + a^4 by hand
        expected_tokens = {0.8: 3.3616, 0.6: 2.3056}[r["a"]]
        assert r["formula speedup"] * (4 * r["c"] + r["v(gamma)"]) == pytest.approx(expected_tokens)
        assert r["formula speedup"] == pytest.approx(theory.speedup(r["a"], 4, r["c"], r["v(gamma)"]))
        assert r["formula at measured tokens/round"] * (4 * r["c"] + r["v(gamma)"]) == pytest.approx(r["tokens/round"])
        # 2 calls of 64 tokens: about 100 positions looked at, a standard error of 0.04-0.05
        assert abs(r["measured acceptance"] - r["a"]) < 0.2, r
        assert r["fastest plain"] == fastest["row"]
        assert r["speedup over fastest plain"] == pytest.approx(r["tokens/s"] / fastest["tokens/s"])
        assert r["measured / formula"] == pytest.approx(r["speedup over ours plain same path"] / r["formula speedup"])


@pytest.mark.parametrize("a, accepted", [(1.0, 5), (0.0, 1)])
def test_the_oracle_tree_sets_acceptance_by_construction(tiny_pair, a, accepted):
    """auto's kind of tree with an oracle head: at a = 1 every round accepts a whole branch (gamma + 1 tokens), at
    a = 0 none; the output is plain greedy decoding's, on the static cache with its rows padded."""
    target = gpu_bench.random_llama("tiny-target", "cpu", torch.float32, seed=0)
    x = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    reference = sd.autoregressive_generate(target, x, max_new_tokens=40, sampling=GREEDY).tokens
    use_static_cache(target, 128)
    drafter = gpu_bench.OracleTree(512, reference, 8, a)
    spec = sd.speculative_generate(target, drafter, x, gamma=4, max_new_tokens=40, sampling=GREEDY)
    assert torch.equal(spec.tokens, reference)
    assert set(spec.stats.accepted_lengths[:-1]) == {accepted} and set(spec.stats.proposed_lengths) == {12}


def test_the_tree_row_measures_the_tree_on_the_static_compiled_path(smoke):
    rows, _, _ = smoke
    tree = rows[-1]
    assert tree["row"] == "auto tree (oracle head) a=0.8 gamma=4" and tree["status"] == "measured"
    assert tree["greedy identical"] and tree["tokens/round"] > 2 and tree["tokens/s"] > 0
    assert tree["speedup over ours plain same path"] > 0 and tree["graphs compiled"] <= 2


def test_the_claims_are_read_from_the_rows_and_the_figure_drawn(smoke, tmp_path):
    rows, _, _ = smoke
    checks = gpu_bench.verdicts(rows)
    assert len(checks) == 5 and all(isinstance(c["holds"], bool) for c in checks)
    path = gpu_bench.write_verdicts(checks, tmp_path / "verdicts.csv", on_gpu=False, log=lambda line: None)
    assert len(read_csv(path)) == 5
    pytest.importorskip("matplotlib")
    assert gpu_bench.write_figure(rows, tmp_path / "gpu_check.png").stat().st_size > 10_000


def test_a_gamma_that_would_overrun_the_budget_is_recorded_as_skipped(monkeypatch, tmp_path):
    """Each gamma's rows take 40 s on a fake clock; with 100 s, gamma 4 and 3 fit (0 + 0, 40 + 40 <= 100), gamma 5
    does not (80 + 40)."""
    now = [0.0]

    def oracle_row(*args):
        now[0] += 40
        return {"row": "oracle", "status": "measured", "tokens/s": 1.0, "seconds": 40.0, "graphs compiled": 0}

    monkeypatch.setattr(gpu_bench, "measure_c", lambda *args: gpu_bench.Costs(1.0, 0.1))
    monkeypatch.setattr(gpu_bench, "forward_seconds", lambda *args: 1.2)
    monkeypatch.setattr(gpu_bench, "oracle_row", oracle_row)
    writer = gpu_bench.RowWriter(tmp_path / "rows.csv", log=lambda line: None)
    plan = gpu_bench.Plan(32, 16, 1, budget_s=100, gammas=(4, 3, 5), acceptances=(0.8,))
    gpu_bench.oracle_rows(None, None, None, {"ours plain static compiled": {"output": None}}, plan, {}, writer,
                          started=0.0, clock=lambda: now[0])
    writer.close()
    assert [r["status"] for r in read_csv(tmp_path / "rows.csv")] == ["measured", "measured", "skipped"]
    assert writer.rows[-1]["gamma"] == 5 and writer.rows[-1]["note"].startswith("time budget: 80 s spent")


def claim_rows(ours_eager, generate_eager, ours_compiled, generate_compiled, oracle, formula):
    def row(name, tokens_per_s, **fields):
        return {"row": name, "status": "measured", "tokens/s": tokens_per_s, **fields}
    return [row("generate eager", generate_eager),
            row("ours plain eager", ours_eager, **{"over generate same cache": ours_eager / generate_eager}),
            row("generate static compiled", generate_compiled),
            row("ours plain static compiled", ours_compiled, **{
                "over generate same cache": ours_compiled / generate_compiled,
                "over generate eager": ours_compiled / generate_eager}),
            row("oracle a=0.8 gamma=4", oracle, **{"speedup over fastest plain": oracle / ours_compiled,
                                                    "measured / formula": oracle / ours_compiled / formula})]


def test_the_claims_hold_or_fail_by_their_thresholds():
    holds = [c["holds"] for c in gpu_bench.verdicts(claim_rows(31, 30, 100, 95, 230, 2.2))]
    assert holds == [True, True, True, True, True]
    holds = [c["holds"] for c in gpu_bench.verdicts(claim_rows(29, 30, 70, 95, 130, 2.2))]
    assert holds == [False, False, False, False, False]  # 0.97x, 0.74x, 2.33x, 1.86x, 1.86 / 2.2 = 0.84
    rows = claim_rows(31, 30, 100, 95, 230, 2.2)[:4]
    assert [c["holds"] for c in gpu_bench.verdicts(rows)][3:] == [None, None]  # no oracle row: not measured


def test_bad_requests_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown shapes"):
        gpu_bench.run("cpu", "huge", out=tmp_path)
    with pytest.raises(ValueError, match="new_tokens >= 1"):
        gpu_bench.run("cpu", "tiny", out=tmp_path, new_tokens=0)
    with pytest.raises(ValueError, match="acceptances"):
        gpu_bench.run("cpu", "tiny", out=tmp_path, acceptances=(1.2,))
    with pytest.raises(ValueError, match="unknown plan fields"):
        gpu_bench.run("cpu", "tiny", out=tmp_path, tokens=8)
    with pytest.raises(SystemExit):
        gpu_bench.main(["--device", "cpu", "--shapes", "tiny", "--repeats", "0"])
    writer = gpu_bench.RowWriter(tmp_path / "rows.csv", log=lambda line: None)
    with pytest.raises(ValueError, match="not in gpu_bench.COLUMNS"):
        writer.write({"row": "x", "speed": 1.0})
    writer.close()


def test_the_benchmark_needs_neither_pandas_nor_matplotlib(tmp_path):
    """A bare GPU machine has torch, transformers and pytest only: the module imports, and skips its figure."""
    code = ("import sys\n"
            "for name in ('pandas', 'seaborn', 'matplotlib', 'scipy'): sys.modules[name] = None\n"
            "from specdec_lite.repro import gpu_bench\n"
            "rows = [{'row': 'generate eager', 'status': 'measured', 'kind': 'transformers'}]\n"
            f"assert gpu_bench.write_figure(rows, __import__('pathlib').Path({str(tmp_path)!r}) / 'f.png') is None\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
