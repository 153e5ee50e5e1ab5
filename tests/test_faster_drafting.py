"""Batch-invariant bfloat16, the recommended drafting by name, transformers' baselines, the cost model and the
speed-goal table."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import specdec_lite as sd
from specdec_lite.tuning.batch_invariance import Float32Linear, SplitKLinear, is_batch_invariant, make_batch_invariant
from specdec_lite.names import EMBEDDED_EAGLE_DEEP_TTT
from specdec_lite.tuning.devices import auto_dtype, cpu_has_native_bfloat16, has_native_bfloat16, native_dtypes
from specdec_lite import paths
from specdec_lite.drafts.heads import EagleDraft, read_head
from specdec_lite.drafts.loading import (AUTO_LABEL, AUTO_LABEL_WITHOUT_HEAD, drafts_for_pair, labelled_heads,
                                        load_draft, one_head_per_kind)
from specdec_lite.drafts.pacing import PacedDraft
from specdec_lite.tuning.int8_head import quantized_copy
from specdec_lite.drafts.trees import DynamicTreeDraft, EagleTreeDraft, HybridTreeDraft, LookupTreeDraft
from specdec_lite.repro import evaluate, theory
from specdec_lite.repro.tasks import chat_ids, first_per_task, load_prompts

from conftest import tiny_llama

GREEDY = sd.SamplingParams(temperature=0.0)


def _one_by_one_and_together(model, prompt, extra):
    lm = sd.HFCausalLM(model)
    lm.reset(1)
    lm.feed(prompt[None])
    one = torch.cat([lm.feed(extra[None, i: i + 1]) for i in range(len(extra))], dim=1)
    lm.reset(1)
    lm.feed(prompt[None])
    return one, lm.feed(extra[None])


def test_split_k_and_float32_layers_compute_the_same_product():
    torch.manual_seed(0)
    linear = torch.nn.Linear(1536, 96, bias=True).to(torch.bfloat16)
    x = torch.randn(7, 1536).to(torch.bfloat16)
    # against the exact product (float64): bfloat16 keeps 8 significant bits, so each rounding to it moves a value by
    # at most u = 2^-8 of it. Rounded: each chunk's product (Float32Linear: one chunk of 1536), their float32 sum,
    # and that plus the bias; float32 accumulation adds at most K 2^-24 of the absolute products' sum
    x64, w64, b64 = x.double(), linear.weight.double(), linear.bias.double()
    product = x64 @ w64.T
    exact = product + b64
    for layer, chunk in ((SplitKLinear(linear, 512), 512), (Float32Linear(linear), 1536)):
        parts = sum((x64[:, k: k + chunk] @ w64[:, k: k + chunk].T).abs() for k in range(0, 1536, chunk))
        bound = 2**-8 * (parts + product.abs() + exact.abs()) + 1536 * 2**-24 * (x64.abs() @ w64.abs().T)
        with torch.no_grad():
            assert ((layer(x).double() - exact).abs() <= bound).all(), type(layer).__name__


def simulated_cpu(invariant):
    """A probe answering as a CPU whose kernels are invariant for the (way, K, chunk) that ``invariant`` accepts:
    the way is "as is", "split" or "float32"; chunk is None unless split."""
    def probe(layer, weight):
        if isinstance(layer, SplitKLinear):
            return invariant("split", weight.shape[1], layer.chunk)
        return invariant("float32" if isinstance(layer, Float32Linear) else "as is", weight.shape[1], None)
    return probe


AMD_EPYC = simulated_cpu(lambda way, K, chunk: way != "as is" or K <= 1024)  # measured: K = 1536 not invariant
XEON_AMX = simulated_cpu(lambda way, K, chunk: (chunk or K) in (64, 128, 256, 1536) if way != "float32" else False)
NO_WAY = simulated_cpu(lambda way, K, chunk: False)
ONLY_FLOAT32 = simulated_cpu(lambda way, K, chunk: way == "float32")


@pytest.mark.parametrize("probe, want", [
    (AMD_EPYC, {"mlp.down_proj": "2 chunks of 768"}),
    (XEON_AMX, {"self_attn.q_proj": "3 chunks of 256", "mlp.gate_proj": "3 chunks of 256", "mlp.down_proj": "as is"}),
    (ONLY_FLOAT32, {"self_attn.q_proj": "float32", "mlp.down_proj": "float32"}),
])
def test_each_layer_is_computed_the_first_way_the_cpu_keeps_invariant(probe, want):
    """Shapes of the embedded target (hidden 576, MLP 1536) under the kernels of two measured CPUs and of one that
    is invariant only in float32; the model's function is kept (same product up to rounding)."""
    model = tiny_llama(vocab=96, layers=2, hidden=576, seed=5).to(torch.bfloat16)
    model.config.intermediate_size = 1536
    for layer in model.model.layers:  # the embedded target's MLP width
        layer.mlp.gate_proj = torch.nn.Linear(576, 1536, bias=False).to(torch.bfloat16)
        layer.mlp.up_proj = torch.nn.Linear(576, 1536, bias=False).to(torch.bfloat16)
        layer.mlp.down_proj = torch.nn.Linear(1536, 576, bias=False).to(torch.bfloat16)
    x = torch.tensor([[3, 5, 8, 13]])
    before = model(x).logits.float()
    changed = make_batch_invariant(model, probe=probe)
    for suffix, way in want.items():
        got = {k: v for k, v in changed.items() if k.endswith(suffix)}
        assert (got == {} if way == "as is" else set(got.values()) == {way} and len(got) == 2), (suffix, changed)
    assert is_batch_invariant(model) and model.config._attn_implementation == "specdec_float64"
    assert torch.allclose(model(x).logits.float(), before, atol=0.15, rtol=0.05)


def test_a_layer_no_way_keeps_invariant_is_refused_before_the_model_changes():
    model = tiny_llama(vocab=64, layers=2, hidden=64, seed=2).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="batch_invariant=True cannot hold here: a .* linear layer .* Load with "
                                           "batch_invariant=False"):
        make_batch_invariant(model, probe=NO_WAY)
    assert not is_batch_invariant(model) and all(type(m) is not SplitKLinear for m in model.modules())


def test_cpu_kinds_and_their_auto_dtype():
    amx = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    avx512_bf16 = {"avx512f", "avx512_bf16", "avx2"}
    neither = {"avx2", "fma"}
    assert has_native_bfloat16(amx) and has_native_bfloat16(avx512_bf16) and not has_native_bfloat16(neither)
    cpu = torch.device("cpu")
    assert auto_dtype(cpu, native_bfloat16=True) == torch.bfloat16
    assert auto_dtype(cpu, native_bfloat16=False) == torch.float32
    assert native_dtypes(cpu)[0] == torch.float32 and native_dtypes(cpu)[-1] == auto_dtype(cpu)


def test_models_load_as_they_are_unless_batch_invariance_is_asked_for(local_pairs):
    model, _ = sd.load_model(str(local_pairs / "tiny-1l"), device="cpu", dtype="bfloat16")
    assert not is_batch_invariant(model) and model.dtype == torch.bfloat16


@pytest.fixture(scope="module")
def embedded_bf16():
    """The embedded target in bfloat16 made batch-invariant by the real probe (skipped, saying why, on a CPU
    whose kernels make that impossible: the refusal itself is tested above)."""
    try:
        return sd.load_model(sd.EMBEDDED_TARGET, device="cpu", dtype="bfloat16", batch_invariant=True)
    except RuntimeError as err:
        pytest.skip(f"this CPU cannot make the embedded target batch-invariant: {err}")


@pytest.mark.skipif(not cpu_has_native_bfloat16(), reason="bfloat16 is emulated on this CPU")
def test_the_real_probe_makes_bfloat16_batch_invariant(embedded_bf16):
    """With the real probe of this CPU, a 9-token forward gives every position the bits of one-token steps."""
    model, tokenizer = embedded_bf16
    assert is_batch_invariant(model)
    prompt = chat_ids(tokenizer, "Write a haiku about the sea.")[0]
    extra = torch.tensor(tokenizer("The waves roll in and out")["input_ids"][:9])
    one, together = _one_by_one_and_together(model, prompt, extra)
    assert torch.equal(one, together)


def test_greedy_identity_in_bfloat16_ours_and_transformers(embedded_bf16):
    """Batch-invariant bfloat16: ``assert_greedy_identity`` on one prompt (bfloat16 is emulated on some CPUs, and
    as loaded, without batch invariance, the embedded target's greedy output parted from plain decoding on most
    prompts of the benchmark)."""
    assert_greedy_identity(*embedded_bf16, prompts=1)


def test_greedy_identity_in_float32_ours_and_transformers(embedded):
    """float32, on every CPU: ``assert_greedy_identity``."""
    assert_greedy_identity(*embedded)


def assert_greedy_identity(model, tokenizer, prompts=2):
    """Same model, same dtype: our speculative output (every drafting kind by name, trees and dynamic trees
    included; "auto" greedy is "hybrid-dynamic", ``test_auto_is_the_hybrid_dynamic_tree...``) == our
    autoregressive output == transformers' generate, on the first ``prompts`` evaluation prompts, 48 tokens."""
    drafts = {"auto": load_draft("auto", model), "eagle chain": load_draft(EMBEDDED_EAGLE_DEEP_TTT, model),
              "eagle-tree": load_draft("eagle-tree", model), "n-gram": load_draft("n-gram", model),
              "dynamic-tree": load_draft("dynamic-tree", model), "trained draft": load_draft(sd.EMBEDDED_DRAFT, model)}
    eos = tokenizer.eos_token_id
    for p in first_per_task(load_prompts(), 1)[:prompts]:
        x = chat_ids(tokenizer, p["prompt"])
        ours = sd.autoregressive_generate(model, x, max_new_tokens=48, sampling=GREEDY, eos_token_id=eos).tokens
        theirs = evaluate.transformers_generate(model, x, max_new_tokens=48, sampling=GREEDY, seed=0, eos=eos).tokens
        assert torch.equal(ours, theirs)
        for name, draft in drafts.items():
            out = sd.speculative_generate(model, draft, x, gamma=4, max_new_tokens=48, sampling=GREEDY, eos_token_id=eos)
            assert torch.equal(out.tokens, ours), name


def test_auto_is_the_hybrid_dynamic_tree_greedy_and_the_heads_chain_at_t_above_0(embedded, tmp_path, monkeypatch):
    """``load_draft("auto")`` as installed (a data folder holding the recommended head alone) and with every read of
    the repository and of the training text failing: greedy, lookup branches and EAGLE-2's dynamic tree on that head,
    with costs measured on this machine; at T > 0, the head's chain, the ``EagleDraft`` ``load_draft`` gives for
    the head by name (the same weights); both on the shipped two-layer head trained unrolled on a GPU."""
    model, _ = embedded
    shipped = paths.drafts_dir() / EMBEDDED_EAGLE_DEEP_TTT
    (tmp_path / "drafts").mkdir()
    (tmp_path / "drafts" / EMBEDDED_EAGLE_DEEP_TTT).symlink_to(shipped)
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path))

    def no_repository():
        raise AssertionError("auto read the repository or the training text")

    monkeypatch.setattr(paths, "repo_root", no_repository)
    monkeypatch.setattr(paths, "corpus_dir", no_repository)
    both = load_draft("auto", model)
    paced_greedy, paced_sampled = both.at(GREEDY), both.at(sd.SamplingParams(temperature=0.7))
    greedy, sampled = paced_greedy.drafter, paced_sampled.drafter
    assert isinstance(greedy, HybridTreeDraft) and isinstance(greedy.head, DynamicTreeDraft)  # lookup + EAGLE-2 tree
    assert isinstance(greedy.lookup, LookupTreeDraft)
    assert greedy.head.costs["v"][1] == 1.0 and greedy.head.head_cost > 0  # this machine's, or the head's defaults
    assert type(sampled) is EagleDraft and sampled is greedy.head.eagle  # the head's chain, its caches shared
    for paced in (paced_greedy, paced_sampled):  # both rest while the dynamic tree's costs say drafting loses
        assert isinstance(paced, PacedDraft) and paced.verify_cost is greedy.head.verify_cost
        assert paced.head_cost == greedy.head.head_cost
    assert both.at(sd.SamplingParams(temperature=1.0)) is paced_sampled
    recommended = read_head(shipped)[0]  # two layers, unrolled, trained on a GPU on every reply
    recommended = (quantized_copy(recommended) if sampled.quantized else recommended).state_dict()
    assert all(torch.equal(sampled.head.state_dict()[k].float(), v.float()) for k, v in recommended.items())
    by_name = load_draft(EMBEDDED_EAGLE_DEEP_TTT, model)
    assert type(by_name) is type(sampled) and by_name.feature_layers == sampled.feature_layers


def test_the_pair_s_draft_kinds_are_those_kept_and_auto_falls_back_to_lookup_trees(embedded, local_pairs):
    """``drafts_for_pair`` on the embedded target: the heads, n-gram, the EAGLE tree, the dynamic trees, auto and
    layer skip, nothing else; the trees share one head and one measured dynamic tree. A target without a head: auto
    is the lookup tree, the head's trees are skipped and refused by name. The bench names a tree on a head with
    "@"."""
    model, _ = embedded
    drafts, skipped = drafts_for_pair(model)
    assert set(drafts) == {"EAGLE head", "Medusa heads", "n-gram", "EAGLE tree", "EAGLE dynamic tree",
                           "hybrid dynamic tree", AUTO_LABEL, "layer-skip"}
    dynamic = drafts["EAGLE dynamic tree"]  # measured once for both dynamic trees, on this machine
    assert drafts["EAGLE head"] is dynamic.eagle and drafts["EAGLE tree"].eagle is dynamic.eagle
    hybrid = drafts["hybrid dynamic tree"]
    assert drafts[AUTO_LABEL].at(GREEDY).drafter is hybrid and hybrid.head is dynamic
    assert drafts[AUTO_LABEL].at(sd.SamplingParams(temperature=1.0)).drafter is drafts["EAGLE head"]
    assert isinstance(load_draft("eagle-tree", model), EagleTreeDraft)
    other, _ = sd.load_model(str(local_pairs / "tiny-4l"), dtype="float32")
    assert isinstance(load_draft("auto", other), LookupTreeDraft)  # no head for it: lookup trees
    with pytest.raises(ValueError, match="needs an EAGLE head trained for this target"):
        load_draft("hybrid-dynamic", other)
    drafts, skipped = drafts_for_pair(other)
    assert isinstance(drafts[AUTO_LABEL_WITHOUT_HEAD], LookupTreeDraft)
    assert "EAGLE tree / dynamic tree / hybrid" in skipped and "EAGLE tree" not in drafts
    from specdec_lite.repro.bench import named_draft

    on_head = named_draft(f"eagle-tree@{EMBEDDED_EAGLE_DEEP_TTT}", model)  # the bench's tree draft on a named head
    assert isinstance(on_head, EagleTreeDraft) and len(on_head.eagle.head.layers) == 2
    with pytest.raises(ValueError, match="only tree drafts"):
        named_draft("n-gram@x", model)
    with pytest.raises(ValueError, match="is not an EAGLE head trained for this target"):
        named_draft("eagle-tree@no-such-head", model)


def test_heads_sharing_a_kind_keep_apart_by_name_and_auto_keeps_one_of_each():
    first, recommended, fused = (SimpleNamespace(feature_layers=f) for f in ((-1,), (-1,), (3, 15, -1)))
    loaded = {"older": first, "newer": recommended, "fused": fused}
    assert labelled_heads(loaded, "newer") == {"EAGLE head (older)": first, "EAGLE head": recommended,
                                               "EAGLE-3 head": fused}
    assert labelled_heads({"fused": fused}, None) == {"EAGLE-3 head": fused}
    kept, left_out = one_head_per_kind(loaded, "newer")
    assert kept == {"newer": recommended, "fused": fused} and left_out == ["older"]


def test_transformers_generate_greedy_matches_ours_on_a_tiny_llama():
    model = tiny_llama(vocab=64, layers=2, seed=3)
    x = torch.tensor([[1, 5, 9, 2, 7]])
    ours = sd.autoregressive_generate(model, x, max_new_tokens=12, sampling=GREEDY, ignore_eos=True).tokens
    theirs = evaluate.transformers_generate(model, x, max_new_tokens=12, sampling=GREEDY, seed=0, eos=None)
    assert torch.equal(theirs.tokens, ours) and theirs.stats.new_tokens == 12 and theirs.stats.total_seconds > 0
    methods = evaluate.transformers_methods(tiny_llama(vocab=64, layers=1, seed=4))
    assert set(methods) == {"transformers generate", "transformers prompt lookup", "transformers assisted (trained draft)"}


def test_predicted_accepted_length_is_the_chain_formula_for_fixed_chains():
    # rounds of a gamma-3 chain: accepted lengths (bonus included) 4, 1, 2, 4 -> per-position rates 3/4, 2/3, 2/2
    accepted, depths = [4, 1, 2, 4], [3, 3, 3, 3]
    want = 1 + 0.75 + 0.75 * 2 / 3 + 0.75 * 2 / 3 * 1.0
    assert evaluate.predicted_accepted_length(accepted, depths, 3) == pytest.approx(want)
    assert evaluate.predicted_accepted_length([1, 1], [0, 0], 3) == pytest.approx(1.0)  # nothing proposed


def test_cost_model_table_puts_prediction_beside_measurement():
    runs = pd.DataFrame([
        {"method": "autoregressive", "task": "code", "temperature": 0.0, "gamma": 4},
        {"method": "tree", "task": "code", "temperature": 0.0, "gamma": 4, "accepted_lengths": "3 1 3",
         "proposed_lengths": "6 6 6", "tree_depths": "2 2 2", "nodes_per_round": 6.0, "draft_cost_per_round": 0.2,
         "v": 1.3, "speedup": 1.4, "mean_accepted_length": 7 / 3}])
    table = evaluate.cost_model(runs, {1: 1.0, 5: 1.1, 9: 1.3})
    row = table.iloc[0]
    assert row["v(nodes+1) model"] == pytest.approx(1.2)
    assert row["predicted E[N]"] == pytest.approx(1 + 2 / 3 + 2 / 3)
    assert row["predicted speedup"] == pytest.approx(theory.tree_speedup(1 + 4 / 3, 0.2, 1.2))


def test_speed_goals_table():
    rows = []
    for t, ours, hf_lookup in ((0.0, [2.4, 2.2, 1.9, 1.1], [1.1, 1.0, 1.2, 1.0]), (1.0, [1.6] * 4, [1.0] * 4)):
        for task, a, b in zip(["code", "dialogue", "summarization", "translation"], ours, hf_lookup):
            rows += [{"method": "hybrid", "task": task, "speedup": a, "temperature": t, "mean_accepted_length": 3.0},
                     {"method": "transformers prompt lookup", "task": task, "speedup": b, "temperature": t}]
    # the overall rows carry summarize's geometric means over the tasks, worked out by hand: greedy, hybrid
    # (2.4 x 2.2 x 1.9 x 1.1)^(1/4) = 11.0352^(1/4) = 1.8226 and prompt lookup (1.1 x 1.0 x 1.2 x 1.0)^(1/4) = 1.0719;
    # at T = 1, 1.6 and 1.0
    geomeans = {("hybrid", 0.0): 1.8226, ("transformers prompt lookup", 0.0): 1.0719,
                ("hybrid", 1.0): 1.6, ("transformers prompt lookup", 1.0): 1.0}
    overall = pd.DataFrame([{"method": m, "temperature": t, "task": "overall (median)", "speedup_geomean_tasks": g,
                             "mean_accepted_length": 3.6} for (m, t), g in geomeans.items()])
    summary = pd.concat([pd.DataFrame(rows), overall], ignore_index=True).assign(baseline="autoregressive, float32")
    goals = evaluate.speed_goals(summary, "hybrid").set_index("goal")
    assert goals.loc["greedy geometric mean over tasks", "measured"] == 1.8226
    assert not goals.loc["greedy geometric mean over tasks", "met"]  # 1.82 < 2
    assert goals.loc["greedy, slowest task", "measured"] == pytest.approx(1.1) and not goals.loc["greedy, slowest task", "met"]
    assert goals.loc["greedy mean accepted length (tau)", "measured"] == pytest.approx(3.6)
    assert goals.loc["temperature 1 geometric mean", "measured"] == 1.6 and goals.loc["temperature 1 geometric mean", "met"]
    assert goals.loc["over transformers prompt lookup (greedy)", "measured"] == pytest.approx(1.8226 / 1.0719)
    assert set(goals.baseline) == {"autoregressive, float32"}

def test_progression_pairs_each_step_with_measurement_and_cost_model():
    overall = pd.DataFrame([
        {"method": "EAGLE tree", "temperature": 0.0, "mean_accepted_length": 2.0, "speedup_geomean_tasks": 1.1},
        {"method": "EAGLE dynamic tree", "temperature": 0.0, "mean_accepted_length": 2.5, "speedup_geomean_tasks": 1.3},
        {"method": "hybrid dynamic tree", "temperature": 1.0, "mean_accepted_length": 1.7,
         "speedup_geomean_tasks": 1.0},
        {"method": "EAGLE head", "temperature": 1.0, "mean_accepted_length": 1.4, "speedup_geomean_tasks": 1.2},
        {"method": "EAGLE head", "temperature": 0.0, "mean_accepted_length": 1.9, "speedup_geomean_tasks": 1.05}])
    summary = overall.assign(task="overall (median)")
    # the cost model's per-task predictions: geometric mean of 1.0 and 1.44 is 1.2
    model = pd.DataFrame([{"method": "EAGLE tree", "task": task, "temperature": 0.0, "predicted speedup": p}
                          for task, p in (("code", 1.0), ("dialogue", 1.44))])
    table = evaluate.progression(summary, model).set_index(["step", "role"])
    fixed_dynamic = "tree shape: fixed -> dynamic (head only)"
    assert table.loc[(fixed_dynamic, "before"), "cost model (geomean over tasks)"] == pytest.approx(1.2)
    assert table.loc[(fixed_dynamic, "after"), "tau"] == 2.5
    assert table.loc[(fixed_dynamic, "after"), "speedup (geomean over tasks)"] == 1.3
    at_t1 = table.loc[("at T=1: the hybrid dynamic tree -> the head's chain", "after")]
    assert at_t1["tau"] == 1.4 and at_t1["temperature"] == 1.0  # the T=1 row, not the greedy one
    drafter = table.loc["the drafter: a trained draft model -> the EAGLE head (chains)"]
    assert np.isnan(drafter.loc["before", "tau"]) and drafter.loc["after", "tau"] == 1.9  # not measured: nan
    assert len(table) == 2 * len(evaluate.PROGRESSION)
