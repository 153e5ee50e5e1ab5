"""The static-cache path (preallocated KV cache, rollback by moving a length, compilable forwards) and models
placed across devices: same loop, same verifier, same answers as the dynamic path."""
import logging

import pytest
import torch

import specdec_lite as sd
from specdec_lite.tuning import memory
from specdec_lite.core.lm import EAGER_ABOVE, static_state, use_dynamic_cache, use_static_cache
from specdec_lite.tuning.devices import resolve_dtype
from specdec_lite.tuning.packed_linear import has_packed_linears
from specdec_lite.repro.exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference

from conftest import DEVICE, tiny_llama
from test_loop import CheckedLM, prompt

GREEDY = sd.SamplingParams(temperature=0)


@pytest.fixture
def static_pair():
    """A tiny target and draft of their own (the static settings belong to the model objects)."""
    target, draft = tiny_llama(layers=4, seed=0), tiny_llama(layers=1, seed=1)
    near = tiny_llama(layers=4, seed=0)  # the target's weights, perturbed: accepts some drafts, rejects others
    with torch.no_grad():
        for p in near.parameters():
            p.add_(0.02 * torch.randn_like(p))
    for model in (target, draft, near):
        use_static_cache(model, max_length=128)
    return target, draft, near


def draft_kinds(target, draft, near):
    return {"draft model": draft, "perturbed copy": near, "n-gram": sd.NGramDraft(),
            "layer-skip": sd.LayerSkipDraft(target), "target as its own draft": target}


@pytest.mark.parametrize("kind", ["draft model", "perturbed copy", "n-gram", "layer-skip", "target as its own draft"])
def test_greedy_identity_on_the_static_path(static_pair, kind):
    target, draft, near = static_pair
    x = prompt(n=9, seed=3)
    reference = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=60, do_sample=False,
                                pad_token_id=0)[0, x.shape[1]:]
    assert torch.equal(sd.autoregressive_generate(target, x, max_new_tokens=60, sampling=GREEDY).tokens, reference)
    kept = []
    for _ in range(2):  # the second call reuses the same preallocated tensors
        spec = sd.speculative_generate(target, draft_kinds(target, draft, near)[kind], x, gamma=4,
                                       max_new_tokens=60, sampling=GREEDY)
        assert torch.equal(spec.tokens, reference)
        kept.append({key: [layer.keys.data_ptr() for layer in cache.layers]
                     for key, cache in static_state(target).caches.items()})
    # the target's cache at batch 1, and its draft cache when it drafts for itself: the same tensors both times
    roles = ["target", "draft"] if kind == "target as its own draft" else ["target"]
    assert sorted(kept[0]) == sorted((role, 1, 128) for role in roles) and kept[1] == kept[0]


def test_layer_skip_of_a_static_target_is_static(static_pair):
    target = static_pair[0]
    assert static_state(sd.LayerSkipDraft(target).lm.model).max_length == 128


@pytest.mark.parametrize("sampling", [GREEDY, sd.SamplingParams(temperature=1.0)])
def test_cache_truth_after_every_rollback_on_the_static_path(static_pair, sampling):
    target, _, near = static_pair
    target_lm, draft_lm = CheckedLM(target), CheckedLM(near)
    assert type(target_lm.cache).__name__ == "NoneType" and target_lm.static is not None
    x = prompt(n=9)
    spec = sd.speculative_generate(target_lm, sd.ModelDraft(draft_lm), x, gamma=4, max_new_tokens=80,
                                   sampling=sampling)
    assert type(target_lm.cache).__name__ == "StaticCache"
    # the cache holds every token but the newest (a last round may run past max_new_tokens: >=)
    assert target_lm.cache_seq_length() == target_lm.length >= x.shape[1] + len(spec.tokens) - 1
    assert any(n < 5 for n in spec.stats.accepted_lengths) and any(n > 1 for n in spec.stats.accepted_lengths)
    assert target_lm.max_error < 1e-4 and draft_lm.max_error < 1e-4


def test_exact_law_behind_a_static_wrapper():
    """Every branch of the loop, enumerated with both models on static caches (vocabulary 6, 3 tokens)."""
    target, draft = tiny_llama(vocab=6, layers=2, seed=4), tiny_llama(vocab=6, layers=1, seed=5)
    with torch.no_grad():  # soften the sharpened test models so that every branch has weight
        target.lm_head.weight.div_(16.0)
        draft.lm_head.weight.div_(16.0)
    for model in (target, draft):
        use_static_cache(model, max_length=32)
    sampling = sd.SamplingParams(temperature=0.9, top_k=5)
    spec = exact_speculative_distribution(target, draft, [0, 1], 2, 3, sampling)
    assert max_abs_difference(spec, exact_target_distribution(target, [0, 1], 3, sampling)) < 1e-9
    use_dynamic_cache(target)
    assert static_state(target) is None


def test_a_request_longer_than_the_preallocated_cache_is_refused_first(static_pair):
    target, draft, _ = static_pair
    with pytest.raises(ValueError, match="exceed the static cache's 128 preallocated tokens .*at most 115"):
        sd.speculative_generate(target, draft, prompt(n=9), gamma=4, max_new_tokens=116)
    with pytest.raises(ValueError, match="max_length .* must be an integer >= 2"):
        use_static_cache(target, max_length=1)


def test_a_compiled_static_forward_gives_the_same_tokens():
    """One tiny compiled case (compile time stays out of the test budget: a 1-layer model, default mode)."""
    target = tiny_llama(layers=1, seed=6)
    x = prompt(n=5)
    reference = sd.autoregressive_generate(target, x, max_new_tokens=12, sampling=GREEDY).tokens
    use_static_cache(target, max_length=64, compile=True)
    spec = sd.speculative_generate(target, sd.NGramDraft(), x, gamma=2, max_new_tokens=12, sampling=GREEDY)
    assert torch.equal(spec.tokens, reference) and static_state(target).forward is not None


def test_compile_on_a_cpu_in_the_default_dtype_runs_unpacked_linears_and_decodes_as_eager(local_pairs):
    """load_model(cache="static", compile=True) on a CPU in its default dtype (bfloat16 where oneDNN computes it,
    where linear layers would load packed): they load unpacked, which torch can compile, and 8 greedy tokens equal
    eager decoding. One compiled shape (1 token: the 20-token prompt runs eagerly), a 1-layer model."""
    path = str(local_pairs / "tiny-1l")
    compiled, _ = sd.load_model(path, device="cpu", cache="static", max_cache_len=64, compile=True)
    eager, _ = sd.load_model(path, device="cpu", packed_linears=False)
    assert compiled.dtype == eager.dtype == resolve_dtype("auto", "cpu") and not has_packed_linears(compiled)
    x = torch.arange(100, 120)[None]
    assert x.shape[1] > EAGER_ABOVE
    ours = sd.autoregressive_generate(compiled, x, max_new_tokens=8, sampling=GREEDY, ignore_eos=True).tokens
    assert static_state(compiled).forward is not None  # the decode steps ran compiled
    assert len(ours) == 8 and torch.equal(ours, sd.autoregressive_generate(
        eager, x, max_new_tokens=8, sampling=GREEDY, ignore_eos=True).tokens)


def test_device_map_splits_a_model_and_the_loop_still_agrees(local_pairs, monkeypatch, tmp_path):
    """A target spread by accelerate over the CPU and the disk (the only devices here): the loop, its rollback
    and greedy identity hold; a static cache is refused for it."""
    monkeypatch.setenv("SPECDEC_LITE_CACHE", str(tmp_path))
    path = str(local_pairs / "tiny-4l")
    plain, _ = sd.load_model(path, device="cpu", dtype="float32")
    layout = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
              "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu",
              "lm_head": "cpu"}
    split, _ = sd.load_model(path, device_map=layout, dtype="float32")
    assert split.hf_device_map["model.layers.3"] == "disk"
    draft = sd.load_draft(str(local_pairs / "tiny-1l"), split)
    x = prompt(n=6)
    reference = sd.autoregressive_generate(plain, x, max_new_tokens=30, sampling=GREEDY).tokens
    assert torch.equal(sd.autoregressive_generate(split, x, max_new_tokens=30, sampling=GREEDY).tokens, reference)
    assert torch.equal(sd.speculative_generate(split, draft, x, gamma=3, max_new_tokens=30, sampling=GREEDY).tokens,
                       reference)
    with pytest.raises(ValueError, match="static cache with layers offloaded to the CPU or disk cannot work"):
        sd.load_model(path, device_map=layout, cache="static")


def test_static_cache_with_offloaded_layers_is_refused():
    model = tiny_llama(layers=2, seed=7)
    model.hf_device_map = {"model.layers.0": "cuda:0", "model.layers.1": "cpu"}
    with pytest.raises(ValueError, match="static cache with layers offloaded to the CPU or disk cannot work"):
        use_static_cache(model)


def test_a_draft_on_another_device_than_the_target_input_is_refused():
    target, draft = tiny_llama(layers=2, seed=8), tiny_llama(layers=1, seed=9).to("meta")
    where = target.get_input_embeddings().weight.device  # cpu, or cuda:0 under SPECDEC_TEST_DEVICE=cuda
    with pytest.raises(ValueError, match=f"the draft is on meta but the target takes its input on {where}; move"):
        sd.speculative_generate(target, draft, prompt(), gamma=2, max_new_tokens=4)


def test_memory_is_checked_before_loading(local_pairs, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = str(local_pairs / "tiny-4l")
    config = AutoConfig.from_pretrained(path)
    model = tiny_llama(vocab=config.vocab_size, layers=4, seed=0)
    assert memory.parameter_count(config) == sum(p.numel() for p in model.parameters())
    assert memory.kv_cache_bytes(config, 100, torch.float32) == 2 * 4 * 2 * 8 * 100 * 4
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1_000_000)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded anyway"))
    with pytest.raises(MemoryError, match=r"needs about .* GB of weights in float32 .* cpu has 0.0 GB free; "
                                          r"try dtype='bfloat16'"):
        sd.load_model(path, device="cpu", dtype="float32", cache="static", max_cache_len=4096)


def test_greedy_identity_of_the_embedded_target_on_the_static_path(embedded):
    """The embedded target with a static cache: static speculative (the trained draft, static too; layer skip;
    n-gram; auto, whose greedy drafting is a token tree) == static autoregressive == transformers' generate. The static model is a copy of its own, so the
    shared fixture stays as it is."""
    reference_model, tokenizer = embedded
    x = tokenizer.apply_chat_template([{"role": "user", "content": "List three uses of a cache."}],
                                      add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    reference = reference_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, do_sample=False,
                                         pad_token_id=tokenizer.eos_token_id)[0, x.shape[1]:]
    model, _ = sd.load_model(sd.EMBEDDED_TARGET, device=DEVICE, dtype=torch.float32, cache="static", max_cache_len=256)
    draft = sd.load_draft(sd.EMBEDDED_DRAFT, model)
    assert static_state(draft).max_length == 256  # a draft model follows the target's cache kind
    assert static_state(reference_model) is None
    ours = sd.autoregressive_generate(model, x, max_new_tokens=32, sampling=GREEDY)
    assert torch.equal(ours.tokens, reference)
    for kind in (draft, sd.LayerSkipDraft(model, exit_layer=20), sd.NGramDraft(), sd.load_draft("auto", model)):
        spec = sd.speculative_generate(model, kind, x, gamma=4, max_new_tokens=32, sampling=GREEDY)
        assert torch.equal(spec.tokens, reference), type(kind).__name__


def test_compiled_graphs_are_read_from_disk_and_run_on_each_models_own_weights(monkeypatch, tmp_path, caplog):
    """Two models of one architecture and different weights, compiled one after the other with an empty graph cache
    (``compiled.py``): the second reads the first's graph from disk (inductor logs a graph-cache hit, so a later
    process skips the compile), and each decodes as its own eager model does, so the cached graph does not carry the
    first model's weights (transformers' forward compiles as more than one graph: each is read). The dtype is this
    CPU's half precision where oneDNN computes it (the compiler packs its weights into oneDNN tensors, which the
    cache had to be taught to key), else float32."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    caplog.set_level(logging.INFO, logger="torch._inductor.codecache")
    dtype = resolve_dtype("auto", DEVICE) if DEVICE == "cpu" else torch.float32
    x = torch.arange(100, 120, device=DEVICE)[None] % 64  # longer than EAGER_ABOVE: the prompt runs eagerly
    hits, misses = [], []
    for seed in (11, 12):
        model = tiny_llama(layers=1, seed=seed).to(dtype)
        eager = sd.autoregressive_generate(model, x, max_new_tokens=6, sampling=GREEDY).tokens
        use_static_cache(model, compile=True)
        caplog.clear()
        assert torch.equal(sd.autoregressive_generate(model, x, max_new_tokens=6, sampling=GREEDY).tokens, eager)
        hits.append(sum("fx graph cache hit" in r.getMessage() for r in caplog.records))
        misses.append(sum("fx graph cache miss" in r.getMessage() for r in caplog.records))
    assert misses[0] > 0 and hits == [0, misses[0]] and misses[1] == 0, \
        f"graph-cache hits {hits} and misses {misses} per model; the second should have read the first's graphs"
