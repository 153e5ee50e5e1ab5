"""Feature-level drafts (EAGLE-style head, Medusa heads): exactness, greedy identity, their own cache and
rollback, refusals, checkpoints, and training from target features.

Exactness design: the law of the first 3 emitted tokens is computed exactly over every branch of the loop
(``exact_speculative_distribution``), with the draft's q taken from the head's cache-free
``reference_distributions``, and compared with the target's own law; tiny float32 Llama targets, so the
tolerance is 1e-6 (float32 rounding of p and q; a broken verifier moves the law by more than 1e-3, shown below).
A second test holds the live drafter (KV cache, rollbacks, features handed over by the loop) to that reference
at every round of real generations, so the enumerated law is the law of the loop that runs.
"""
import copy
import dataclasses
import json

import pytest
import torch

import specdec_lite as sd
from specdec_lite import names
from specdec_lite.core import models
from specdec_lite.core.lm import use_static_cache
from specdec_lite.drafts import heads
from specdec_lite.repro import tasks
from specdec_lite.tuning.packed_linear import can_pack, pack_linears
from specdec_lite.train import corpus, features
from specdec_lite.repro.exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference
from specdec_lite.repro.mutants import MUTANTS
from specdec_lite.train.heads import (HeadTrainConfig, HeadTrainer, check_kinds, eagle_loss, feature_loss,
                                      load_dataset)

from conftest import ProposeRecorder, tiny_llama

KINDS = ("eagle", "medusa")  # what train.heads trains
DRAFT_KINDS = KINDS + ("eagle3", "eagle-deep")  # eagle3: the EAGLE head reading fused layers (heads.FusedEagleHead);
# eagle-deep: an EAGLE head of two decoder layers (random weights: the second is not the identity it starts as)
GREEDY = sd.SamplingParams(temperature=0)


def random_head_draft(target, kind, sub_vocab=None, num_heads=3, seed=1):
    """An untrained head with random (not zero) weights, so its drafts are sometimes right, sometimes not."""
    shape = {"eagle3": {"feature_layers": heads.fused_layers(target)}, "eagle-deep": {"num_layers": 2}}.get(kind, {})
    cfg = heads.head_config_for(target, "medusa" if kind == "medusa" else "eagle", "tiny",
                                sub_vocab_size=0 if sub_vocab is None else len(sub_vocab), num_heads=num_heads, **shape)
    torch.manual_seed(seed)
    head = heads.build_head(cfg)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3 / p.shape[1] ** 0.5 * 4)
    return heads.make_drafter(head, cfg, target, sub_vocab)


@pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32), reason="this torch has no oneDNN")
def test_a_head_runs_8_bit_beside_a_packed_target_compiled_beside_a_compiled_one_and_as_loaded_beside_others():
    """A head's linear layers and its output layer run on 8-bit weights beside a target whose linear layers run
    packed (``quantizes_head``; their accuracy: tests/test_int8_head.py); beside one whose forwards run compiled,
    the EAGLE head's forwards run compiled (the compiler packs its weights) and its output layer packed; beside a
    target as transformers loads it they stay ``nn.Linear``, as that target's do. The compiled one's logits agree
    with those (to rounding)."""
    def linear_kinds(draft):
        return {type(m).__name__ for m in draft.head.modules() if "Linear" in type(m).__name__}

    draft = random_head_draft(tiny_llama(vocab=48, layers=2, seed=4), "eagle", seed=3)
    assert linear_kinds(draft) == {"Linear"} and type(draft.output.product).__name__ == "Linear"
    assert draft.head.compiled is None
    packed_target = tiny_llama(vocab=48, layers=2, seed=4)
    pack_linears(packed_target)
    packed = random_head_draft(packed_target, "eagle", seed=3)
    assert linear_kinds(packed) == {"Int8Linear"} and type(packed.output.product).__name__ == "Int8Linear"
    assert packed.head.compiled is None
    compiled_target = use_static_cache(tiny_llama(vocab=48, layers=2, seed=4), max_length=64, compile=True)
    compiled = random_head_draft(compiled_target, "eagle", seed=3)
    assert linear_kinds(compiled) == {"Linear"} and type(compiled.output.product).__name__ == "PackedLinear"
    assert compiled.head.compiled is not None
    x = torch.randn(1, 3, draft.cfg.hidden_size)
    with torch.inference_mode():
        assert torch.allclose(compiled.output.logits(x), draft.output.logits(x), atol=1e-4)


def test_a_compiled_head_predicts_and_caches_what_the_eager_head_does():
    """``EagleHead.compile_step``: a catch-up of several entries on an empty cache, drafting steps of one token,
    a tree level of three tokens under its own mask, and steps after a rollback (a crop), in two batch rows: the
    compiled head's predictions and cache entries are the eager head's, to float32 rounding."""
    target = tiny_llama(vocab=64, seed=0)
    eager = random_head_draft(target, "eagle-deep").head.float()
    compiled = copy.deepcopy(eager)
    compiled.compile_step(torch.device("cpu"))
    H = target.config.hidden_size
    torch.manual_seed(0)
    features, embeddings = torch.randn(2, 16, H), torch.randn(2, 16, H)
    caches = [eager.new_cache(), compiled.new_cache()]
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    feeds = [(slice(0, 5), None), (slice(5, 6), None), (slice(6, 7), None), (slice(7, 10), "tree"), ("crop", 6),
             (slice(6, 7), None), (slice(7, 9), None)]
    with torch.inference_mode():
        for at, how in feeds:
            if at == "crop":
                for cache in caches:
                    cache.crop(how)
                continue
            positions = torch.arange(at.start, at.stop)
            allowed = None
            if how == "tree":
                allowed = torch.cat([torch.ones(3, caches[0].length, dtype=torch.bool), tree], dim=1)
                positions = torch.full((3,), at.start)
            out = [head(features[:, at], embeddings[:, at], positions, cache, allowed)
                   for head, cache in zip((eager, compiled), caches)]
            torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-4)
            for ours, theirs in zip(caches[1].layers, caches[0].layers):
                assert ours.length == theirs.length
                torch.testing.assert_close(ours.k, theirs.k, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(ours.v, theirs.v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("setting", ["plain", "temperature+top_k+top_p+penalty"])
def test_exact_law_of_first_tokens_equals_target(kind, setting):
    target = tiny_llama(vocab=5, hidden=32, seed=3)
    sampling = sd.SamplingParams() if setting == "plain" else sd.SamplingParams(
        temperature=0.8, top_k=4, top_p=0.9, repetition_penalty=1.3)
    prompt = [1, 2]
    ref = exact_target_distribution(target, prompt, 3, sampling)
    for sub_vocab in (None, torch.tensor([0, 2, 3])):
        draft = random_head_draft(target, kind, sub_vocab, num_heads=2)
        for gamma in (1, 2):
            spec = exact_speculative_distribution(target, draft, prompt, gamma, 3, sampling)
            assert max_abs_difference(spec, ref) < 1e-6, (gamma, sub_vocab)
            assert sum(spec.values()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_exact_check_sees_a_broken_verifier_with_heads(kind):
    target = tiny_llama(vocab=5, hidden=32, seed=3)
    draft = random_head_draft(target, kind, num_heads=2)
    ref = exact_target_distribution(target, [1, 2], 3)
    broken = exact_speculative_distribution(target, draft, [1, 2], 2, 3, verifier=MUTANTS["residual from p"])
    assert max_abs_difference(broken, ref) > 1e-3


@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_live_drafter_matches_its_cache_free_reference(kind, temperature):
    target = tiny_llama(vocab=8, seed=0)  # a small vocabulary, so random heads guess right now and then
    rec = ProposeRecorder(random_head_draft(target, kind, torch.tensor([0, 1, 2, 3, 5, 6]), num_heads=3))
    sampling = sd.SamplingParams(temperature=temperature)
    gen = sd.speculative_generate(target, rec.drafter, torch.tensor([[5, 1, 7, 3]]), gamma=4, max_new_tokens=60,
                                  sampling=sampling, seed=7)
    assert rec.rounds[0][2].shape[1] == 0  # the first round is the prefill: nothing to draft from yet
    checked = 0
    for seq, lengths, drafts, q in rec.rounds[1:]:
        context = seq[0, : lengths[0]]
        ref = rec.drafter.reference_distributions(context, drafts, sampling)
        assert torch.allclose(q, ref, atol=1e-5), (len(context), checked)
        checked += 1
    assert checked >= 5 and 0 < gen.stats.accepted < gen.stats.drafted  # rounds with and without rejections


@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_output_is_the_targets(kind, gamma):
    target = tiny_llama(vocab=64, seed=0)
    prompt = torch.tensor([[5, 9, 11, 3, 7]])
    base = sd.autoregressive_generate(target, prompt, max_new_tokens=48, sampling=GREEDY).tokens
    for sub_vocab in (None, torch.arange(0, 64, 3)):
        draft = random_head_draft(target, kind, sub_vocab)
        gen = sd.speculative_generate(target, draft, prompt, gamma=gamma, max_new_tokens=48, sampling=GREEDY)
        assert torch.equal(gen.tokens, base)
        expected = min(gamma, 3) if kind == "medusa" else gamma
        assert set(gen.stats.proposed_lengths[1:]) == {expected}


def test_eagle_cache_holds_real_features_only_after_each_rollback():
    target = tiny_llama(vocab=64, seed=0)
    draft = random_head_draft(target, "eagle")
    lengths_seen = []
    original = draft.rollback

    def rollback(kept):
        original(kept)
        # the head's cache keeps entries made from the target's features only, never from its own predictions
        lengths_seen.append((draft.cache.length, draft.real_rows[0], int(kept[0]), draft.features.shape[1]))
    draft.rollback = rollback
    sd.speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), gamma=4, max_new_tokens=30, sampling=GREEDY)
    for cache_len, real, kept, n_features in lengths_seen:
        assert cache_len == real <= kept and n_features == kept
    assert any(cache_len > 0 for cache_len, *_ in lengths_seen)


@pytest.mark.parametrize("kind", ["eagle3", "eagle-deep"])
def test_unrolled_training_predictions_are_the_drafting_chain(kind):
    """Training-time test computes, in one pass per step, what the drafter computes token by token: step k at
    position i equals drafting k+1 tokens after real features up to position i-k (the head's own KV caches, one per
    decoder layer, fed its own predictions), to float32 rounding."""
    target = tiny_llama(vocab=64, seed=0)
    head = random_head_draft(target, kind).head.float()
    n, H = 12, target.config.hidden_size
    torch.manual_seed(0)
    features, embeddings = torch.randn(2, n, H), torch.randn(2, n, H)
    steps = head.unrolled(features, embeddings, 3)
    for i in range(3, n):
        for k in range(3):
            cache = head.new_cache()
            real = i - k + 1  # real entries at positions 0..i-k
            predicted = head(features[:, :real], embeddings[:, :real], torch.arange(real), cache)[:, -1:]
            for s in range(1, k + 1):
                position = torch.tensor([i - k + s])
                predicted = head(predicted, embeddings[:, i - k + s: i - k + s + 1], position, cache)
            assert torch.allclose(steps[k][:, i], predicted[:, 0], atol=1e-5), (i, k)
    # and the steps differ: step 1 does not just repeat step 0
    assert not torch.allclose(steps[0][:, 3:], steps[1][:, 3:], atol=1e-3)


def test_unrolled_head_loss_is_the_one_step_loss_plus_the_drafting_steps():
    """HeadTrainer's training-time test: step 1 of the unrolled loss is the teacher-forced loss, and step k is the
    same loss on the features the head drafts on its own predictions (``unrolled``, held to the drafting chain
    above), counted at the reply positions with k - 1 earlier ones; the loss is their sum, step k weighted
    0.8^(k-1)."""
    target = tiny_llama(vocab=64, hidden=32, seed=2)
    draft = random_head_draft(target, "eagle")
    head, embed, output = draft.head.float(), target.get_input_embeddings(), draft.output
    torch.manual_seed(0)
    B, L, H = 2, 10, target.config.hidden_size
    ids, feats = torch.randint(0, 64, (B, L)), torch.randn(B, L, H)
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[1, 8:] = False  # a shorter second row
    starts = torch.tensor([3, 1])  # the first two drafted positions of row 0 lie in the prompt
    batch = (ids, feats, valid, starts)
    one, one_metrics = eagle_loss(head, embed, output, batch, HeadTrainConfig(), train=False)
    three, metrics = eagle_loss(head, embed, output, batch, HeadTrainConfig(unroll=3), train=False)
    with torch.no_grad():
        steps = head.unrolled(feats[:, :-1], embed(ids[:, 1:]), 3)
    losses = []
    for k, predicted in enumerate(steps):
        # position i (drafting token i + 2) counts when it is real, in the reply, and has k earlier positions
        rows = [(b, i) for b in range(B) for i in range(k, L - 1) if valid[b, i + 1] and i + 2 >= starts[b]]
        pred = torch.stack([predicted[b, i] for b, i in rows])
        true = torch.stack([feats[b, i + 1] for b, i in rows])
        loss, step = feature_loss(output, pred, true, output.sub_logits(true), HeadTrainConfig())
        losses.append(loss)
        suffix = f"_step{k + 1}" if k else ""
        assert metrics["regression" + suffix] == pytest.approx(step["regression"], rel=1e-5)
        assert metrics["ce" + suffix] == pytest.approx(step["ce"], rel=1e-5)
    assert one_metrics == pytest.approx({k: v for k, v in metrics.items() if "_step" not in k}, rel=1e-6)
    assert one.item() == pytest.approx(losses[0].item(), rel=1e-5)
    assert three.item() == pytest.approx((losses[0] + 0.8 * losses[1] + 0.64 * losses[2]).item(), rel=1e-5)
    assert metrics["regression_step3"] != pytest.approx(metrics["regression"], rel=1e-3)  # the steps differ


def test_a_deeper_layer_starts_as_the_identity():
    """A head of two decoder layers, as built, predicts what its first layer alone predicts (the second passes its
    input through until trained), with or without its caches; once the second layer's weights move, it does not."""
    target = tiny_llama(vocab=64, seed=0)
    cfg = heads.head_config_for(target, "eagle", "tiny", sub_vocab_size=0)
    torch.manual_seed(0)
    one, two = heads.build_head(cfg), heads.build_head(dataclasses.replace(cfg, num_layers=2))
    missing, unexpected = two.load_state_dict(one.state_dict(), strict=False)
    assert not unexpected and missing and all(key.startswith("deeper.0.") for key in missing)
    features, embeddings = torch.randn(2, 7, cfg.hidden_size), torch.randn(2, 7, cfg.hidden_size)
    positions = torch.arange(7)
    assert torch.equal(two(features, embeddings, positions), one(features, embeddings, positions))
    cache = two.new_cache()
    two(features[:, :4], embeddings[:, :4], positions[:4], cache)
    assert [c.length for c in cache.layers] == [4, 4]
    assert torch.allclose(two(features[:, 4:], embeddings[:, 4:], positions[4:], cache),
                          one(features, embeddings, positions)[:, 4:], atol=1e-6)
    with torch.no_grad():
        two.deeper[0].down.weight.normal_()
    assert not torch.allclose(two(features, embeddings, positions), one(features, embeddings, positions), atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_heads_rotary_embedding_is_the_llama_targets(dtype):
    """A head layer rotates its queries and keys as transformers' Llama does (its own rotary embedding and
    ``apply_rotary_pos_emb``), at any positions, once the tables are made for them."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=50000.0)
    positions = torch.tensor([0, 3, 4, 4, 17, 300])
    q, k = torch.randn(2, 1, 4, len(positions), 16, dtype=dtype)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    expected = apply_rotary_pos_emb(q, k, cos, sin)
    rotary = heads.rotary_tables(positions, 16, 50000.0, dtype)
    for ours, theirs in zip((heads.rotate(q, rotary), heads.rotate(k, rotary)), expected):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_a_cropped_head_cache_continues_as_the_uncached_head():
    """A head fed 5 entries, cropped back to 3, then fed positions 3 and 4 again predicts what the head without a
    cache predicts there: the crop drops exactly the entries past its length."""
    target = tiny_llama(vocab=64, seed=0)
    head = random_head_draft(target, "eagle-deep").head.float()
    torch.manual_seed(0)
    features, embeddings = torch.randn(2, 5, target.config.hidden_size), torch.randn(2, 5, target.config.hidden_size)
    with torch.inference_mode():
        cache = head.new_cache()
        head(features[:, :3], embeddings[:, :3], torch.arange(3), cache)
        head(features[:, 3:] + 1, embeddings[:, 3:], torch.arange(3, 5), cache)  # entries 3, 4 of other features
        cache.crop(3)
        assert [c.length for c in cache.layers] == [3, 3]
        again = head(features[:, 3:], embeddings[:, 3:], torch.arange(3, 5), cache)
        torch.testing.assert_close(again, head(features, embeddings, torch.arange(5))[:, 3:], rtol=1e-5, atol=1e-5)


def test_heads_refuse_another_target_and_toy_targets():
    target = tiny_llama(vocab=64, seed=0)
    draft = random_head_draft(target, "eagle")
    cfg = draft.cfg
    with pytest.raises(ValueError, match="fingerprint"):
        heads.make_drafter(draft.head, cfg, tiny_llama(vocab=64, seed=9))  # same shapes, other weights
    heads.make_drafter(draft.head, cfg, tiny_llama(vocab=64, seed=0).to(torch.bfloat16))  # same target, bfloat16
    with pytest.raises(ValueError, match="hidden size"):
        heads.make_drafter(draft.head, cfg, tiny_llama(vocab=64, hidden=48, seed=0))
    with pytest.raises(ValueError, match="vocabulary"):
        heads.make_drafter(draft.head, cfg, tiny_llama(vocab=72, seed=0))
    toy_target, _ = sd.repro.toy.random_pair(64, 0.5, 0)
    with pytest.raises(TypeError, match="hidden states"):
        sd.speculative_generate(toy_target, draft, torch.tensor([[1, 2]]), max_new_tokens=4)


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_checkpoint_roundtrip_and_loading_by_path(tmp_path, kind):
    target = tiny_llama(vocab=64, seed=0)
    draft = random_head_draft(target, kind, torch.arange(0, 64, 2))
    heads.save_head(draft.head, draft.cfg, draft.output.vocab_ids, tmp_path)
    loaded = sd.load_draft(str(tmp_path), target)
    assert type(loaded) is type(draft) and torch.equal(loaded.output.vocab_ids, draft.output.vocab_ids)
    context, proposals = torch.tensor([3, 4, 5, 6]), torch.tensor([[1, 2, 3], [7, 8, 9]])
    a = draft.reference_distributions(context, proposals, sd.SamplingParams())
    b = loaded.reference_distributions(context, proposals, sd.SamplingParams())
    assert (a - b).abs().max() < 2e-2  # weights are stored in float16
    with pytest.raises(ValueError, match="load_draft"):
        models.load_model(str(tmp_path))


def test_features_are_what_the_output_layer_reads_and_extraction_resumes(tmp_path, embedded):
    _, tokenizer = embedded
    target = tiny_llama(vocab=49152, layers=1, hidden=32, seed=5, max_positions=8192)
    corpus.generate_corpus(target, tokenizer, tmp_path / "text", budget_tokens=30, batch_size=2, max_new_tokens=10,
                           progress=False)
    n = len(corpus.load_index(tmp_path / "text"))
    meta = features.extract_features(target, tmp_path / "text", tmp_path / "f", "tiny", batch_size=2,
                                     max_records=n - 2, progress=False)
    assert meta["records_done"] == n - 2
    meta = features.extract_features(target, tmp_path / "text", tmp_path / "f", "tiny", batch_size=2,
                                     progress=False)
    assert meta["records_done"] == n
    again = features.extract_features(target, tmp_path / "text", tmp_path / "f", "tiny", progress=False)
    assert again == meta  # nothing left to do: the same metadata back
    store, _ = features.load_features(tmp_path / "f")
    records = corpus.load_records(tmp_path / "text")
    assert len({len(arr) for _, arr in records}) > 1  # batched by length, not in corpus order: rows must not mix
    w = target.lm_head.weight
    for entry, arr in records:
        with torch.no_grad():
            logits = target(input_ids=torch.from_numpy(arr)[None]).logits[0]
        f = torch.from_numpy(store[entry["offset"]: entry["offset"] + len(arr)].astype("float32"))
        # stored in float16 (11 significant bits): rounding moves each feature by at most 2^-11 of it, so each
        # logit by at most 2^-11 (|f| |W|^T); twice that leaves room for float32 differences of the batched forward
        with torch.no_grad():
            assert ((target.lm_head(f) - logits).abs() <= 2**-10 * (f.abs() @ w.abs().T)).all()
    with pytest.raises(ValueError, match="another model"):
        features.extract_features(tiny_llama(vocab=49152, layers=1, hidden=32, seed=6, max_positions=8192),
                                  tmp_path / "text", tmp_path / "f", progress=False)


@pytest.mark.parametrize("kind, unroll", [("eagle", 1), ("medusa", 1), ("eagle", 3)])
def test_training_lowers_the_loss_and_resumes(tmp_path, kind, unroll, embedded):
    _, tokenizer = embedded
    target = tiny_llama(vocab=49152, layers=1, hidden=32, seed=5, max_positions=8192)
    corpus.generate_corpus(target, tokenizer, tmp_path / "text", budget_tokens=120, batch_size=4,
                           max_new_tokens=24, progress=False)
    features.extract_features(target, tmp_path / "text", tmp_path / "f", "tiny", progress=False)
    cfg = HeadTrainConfig(steps=30, batch_size=4, eval_every=15, warmup=5, lr=3e-3, heldout_fraction=0.2,
                          unroll=unroll)
    data, _ = load_dataset(tmp_path / "f", cfg, tmp_path / "text")
    head_cfg = heads.head_config_for(target, kind, "tiny", sub_vocab_size=256)
    trainer = HeadTrainer(target, head_cfg, data, cfg, tmp_path / "head")
    first = trainer.evaluate()
    log = trainer.run(progress=False, max_minutes=None)
    key = "heldout_ce"
    assert log[-1][key] < first[key]  # held-out cross-entropy against the target falls
    if unroll > 1:  # and so does that of the last unrolled step, drafted on the head's own predictions
        assert log[-1][f"{key}_step{unroll}"] < first[f"{key}_step{unroll}"]
    assert json.loads((tmp_path / "head" / "head_config.json").read_text())["kind"] == kind
    resumed = HeadTrainer(target, head_cfg, data, HeadTrainConfig(**{**cfg.__dict__, "steps": 35}), tmp_path / "head")
    assert resumed.step == 30 and resumed.run(progress=False)[-1]["step"] == 35
    draft = sd.load_draft(str(tmp_path / "head"), target)
    assert draft.output.vocab_ids.numel() == 256


def test_check_kinds_refuses_unknown_head_kinds():
    assert check_kinds(["medusa", "eagle"]) == ["medusa", "eagle"]
    with pytest.raises(ValueError, match="'eagle' and/or 'medusa'.*hydra"):
        check_kinds(["eagle", "hydra"])


def test_load_draft_names_the_draft_kinds():
    target = tiny_llama(vocab=64, seed=0)
    assert isinstance(sd.load_draft("n-gram", target), sd.NGramDraft)
    assert isinstance(sd.load_draft("layer-skip", target), sd.LayerSkipDraft)
    with pytest.raises(FileNotFoundError, match="head_config"):
        heads.read_head("/nonexistent/folder")


def test_shipped_heads_load_by_name_for_the_embedded_target(embedded):
    target, tokenizer = embedded
    for name, kind in ((names.EMBEDDED_EAGLE_DEEP_TTT, sd.EagleDraft), (names.EMBEDDED_MEDUSA, sd.MedusaDraft)):
        draft = sd.load_draft(name, target)
        assert isinstance(draft, kind) and draft.cfg.target == sd.EMBEDDED_TARGET
        ids = tasks.chat_ids(tokenizer, "Write a Python function that adds two numbers.")
        base = sd.autoregressive_generate(target, ids, max_new_tokens=24, sampling=GREEDY).tokens
        gen = sd.speculative_generate(target, draft, ids, gamma=4, max_new_tokens=24, sampling=GREEDY)
        assert torch.equal(gen.tokens, base) and gen.stats.accepted > 0
    with pytest.raises(ValueError, match="fingerprint"):  # the embedded head, a same-shaped but other target
        other = tiny_llama(vocab=49152, layers=1, hidden=576, seed=0, max_positions=64)
        sd.load_draft(names.EMBEDDED_EAGLE_DEEP_TTT, other)
