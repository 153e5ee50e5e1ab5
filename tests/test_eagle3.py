"""The EAGLE-3-style head's training (specdec_lite.train.eagle3) on a tiny random Llama: features on the fly,
training-time test, the loss falls, the data and settings are fixed at the first start, and a run interrupted
and resumed in a new trainer reaches the weights of an uninterrupted one. (That the unrolled steps are the
drafting chain, and that the head drafts exactly, is in test_heads.py.)"""
import pytest
import torch

import specdec_lite as sd
from specdec_lite.names import EMBEDDED_EAGLE_DEEP_TTT
from specdec_lite.train import corpus, eagle3, teacher

from conftest import tiny_llama


@pytest.fixture(scope="module")
def texts(tmp_path_factory, embedded):
    _, tokenizer = embedded
    root = tmp_path_factory.mktemp("eagle3")
    target = tiny_llama(vocab=49152, layers=4, hidden=32, seed=5, max_positions=8192)
    corpus.generate_corpus(target, tokenizer, root / "text", budget_tokens=200, batch_size=4, max_new_tokens=24,
                           progress=False)
    teacher.build_teacher_text(tokenizer, root / "teacher", budget_tokens=3000, chunk=64, progress=False)
    return target, root


def config(root, **kw):
    n = len(corpus.load_index(root / "text"))
    base = dict(steps=24, batch_size=4, max_len=48, lr=3e-3, warmup=3, sub_vocab_size=128, eval_every=12,
                target_records=n, teacher_chunks=len(teacher.load_index(root / "teacher")), heldout=[0, 1, 2])
    return eagle3.Eagle3TrainConfig(**{**base, **kw})


def trainer(target, root, out, cfg):
    return eagle3.Eagle3Trainer(target, "tiny", cfg, root / out, root / "text", root / "teacher")


def test_training_lowers_the_held_out_loss_and_the_head_drafts(texts):
    target, root = texts
    run = trainer(target, root, "head", config(root))
    assert run.layers == [2, 2, 1] and len(run.data.heldout) == 3 and run.data.chunks
    first = run.evaluate()
    log = run.run(progress=False)
    assert log[-1]["heldout_ce"] < first["heldout_ce"] - 0.1
    assert {"heldout_agreement_step3", "heldout_acceptance_t1_step1"} <= set(log[-1])
    draft = sd.load_draft(str(root / "head"), target)  # a working drafter, greedy output the target's own
    x = torch.tensor([[5, 9, 11, 3, 7]])
    greedy = sd.SamplingParams(temperature=0)
    want = sd.autoregressive_generate(target, x, max_new_tokens=16, sampling=greedy).tokens
    assert torch.equal(sd.speculative_generate(target, draft, x, gamma=3, max_new_tokens=16, sampling=greedy).tokens,
                       want)


def test_an_interrupted_run_resumes_to_the_same_weights(texts):
    target, root = texts
    whole = trainer(target, root, "whole", config(root, steps=6, eval_every=3))
    whole.run(progress=False)
    parted = trainer(target, root, "parted", config(root, steps=6, eval_every=3))
    parted.run(max_minutes=0, progress=False)  # stops after its first step, saved with its state
    assert parted.loop.step == 1
    resumed = trainer(target, root, "parted", config(root, steps=6, eval_every=3, teacher_share=0.0))
    assert resumed.cfg.teacher_share == 0.5 and resumed.loop.step == 1  # the stored settings, not the new ones
    resumed.run(progress=False)
    for a, b in zip(whole.head.state_dict().values(), resumed.head.state_dict().values()):
        assert torch.equal(a, b)


def test_held_out_records_need_a_corpus_past_the_first_heads():
    with pytest.raises(ValueError, match="corpus needs more"):
        eagle3.heldout_indices(eagle3.FIRST_HEAD_RECORDS + 100)
    picked = eagle3.heldout_indices(10_000)
    assert picked[0] == eagle3.FIRST_HEAD_RECORDS and len(picked) == eagle3.HELDOUT_RECORDS
    assert picked[1] - picked[0] == eagle3.HELDOUT_EVERY


def test_a_head_is_published_only_when_it_beats_the_shipped_one(texts, tmp_path, monkeypatch):
    """``publish`` compares the run's head with the shipped EAGLE head on the same held-out records: a head trained
    24 steps replaces nothing when the shipped head is itself (its saved weights, which a comparison of the float32
    weights in memory with the saved float16 ones let pass by rounding), and is shipped (files, a card with both
    heads' figures) against a shipped head of one step; it then loads from its folder."""
    from specdec_lite.paths import DATA_ENV
    from specdec_lite.train.loop import copy_checkpoint

    target, root = texts
    good = trainer(target, root, "good", config(root, sub_vocab_size=4096))
    good.run(progress=False)
    weak = trainer(target, root, "weak", config(root, steps=1, sub_vocab_size=4096))
    weak.run(progress=False)
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    shipped = tmp_path / "drafts" / eagle3.NAME
    copy_checkpoint(root / "good", tmp_path / "drafts" / EMBEDDED_EAGLE_DEEP_TTT)  # the same head: not better
    same = eagle3.publish(target, good)
    assert same.iloc[0].equals(same.iloc[1])  # both judged in the saved float16 weights, to the last bit
    assert not eagle3.is_better(same) and not shipped.exists()
    copy_checkpoint(root / "weak", tmp_path / "drafts" / EMBEDDED_EAGLE_DEEP_TTT)
    comparison = eagle3.publish(target, good)
    assert eagle3.is_better(comparison) and len(comparison) == 2
    assert {"head.safetensors", "head_config.json", "README.md"} <= {f.name for f in shipped.iterdir()}
    assert not (shipped / "training_state.pt").exists()
    card = (shipped / "README.md").read_text()
    assert "shipped EAGLE head beside this one" in card and f"{EMBEDDED_EAGLE_DEEP_TTT} (shipped head)" in card
    assert sd.load_draft(str(shipped), target).feature_layers == tuple(good.layers)


def test_better_is_more_tokens_accepted_by_a_chain_at_t1_and_no_lower_greedy_agreement():
    import pandas as pd

    def table(agree, *accept):  # the start: agreement 0.5, acceptance 0.4 at each of two steps (0.4 + 0.16 = 0.56)
        rows = {"heldout_agreement_step1": [0.5, agree]}
        rows.update({f"heldout_acceptance_t1_step{k + 1}": [0.4, a] for k, a in enumerate(accept)})
        return pd.DataFrame(rows)

    assert eagle3.chain_tokens(table(0.5, 0.5, 0.2).iloc[1]) == pytest.approx(0.5 + 0.5 * 0.2)
    assert eagle3.is_better(table(0.6, 0.5, 0.4)) and eagle3.is_better(table(0.5, 0.41, 0.4))
    assert eagle3.is_better(table(0.5, 0.4, 0.45))  # the first step tied, the second better: an unrolled head
    assert not eagle3.is_better(table(0.6, 0.45, 0.2))  # 0.45 + 0.09 < 0.56: the first step alone does not decide
    assert not eagle3.is_better(table(0.49, 0.5, 0.5))  # a lower greedy agreement
