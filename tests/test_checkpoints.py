"""Finished checkpoints read back without retraining: the standalone draft (train.draft.load_trained) and the heads
(train.heads.HeadTrainer.from_checkpoint) return the weights, training config and log that training saved; a
missing or incomplete folder is refused with what to do; copy_checkpoint only reads its source; the card names
the records it was trained on (training_data.json, cards.trained_on)."""
import hashlib
import json

import numpy as np
import pytest
import torch

import specdec_lite as sd
from specdec_lite.drafts import heads
from specdec_lite.train import cards, draft as distill
from specdec_lite.train.heads import FeatureDataset, HeadTrainConfig, HeadTrainer
from specdec_lite.train.loop import (CONFIG_FILE, LOG_FILE, STATE_FILE, copy_checkpoint, read_config,
                                     require_checkpoint)

from conftest import tiny_llama


def digests(folder):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir()) if f.is_file()}


def half_rounded(state):
    return {k: v.detach().half().float() for k, v in state.items()}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=64, layers=2, hidden=32, seed=0).cpu()


@pytest.fixture(scope="module")
def trained_draft(target, tmp_path_factory):
    """A tiny draft trained a few steps and saved by train_draft into a folder, with its card."""
    out = tmp_path_factory.mktemp("draft")
    g = torch.Generator().manual_seed(0)
    records = [({"prompt_len": 4, "gen_len": 12}, torch.randint(0, 64, (16,), generator=g).numpy()) for _ in range(10)]
    sequences = distill.records_to_batches(records, max_len=32)
    soft = distill.teacher_topk(target, sequences, k=4, progress=False)
    torch.manual_seed(0)
    draft = distill.make_draft(target, distill.DraftConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                           num_key_value_heads=1, intermediate_size=32))
    cfg = distill.TrainConfig(steps=6, batch_size=4, lr=1e-2, warmup=2, topk=4, eval_every=3, heldout_fraction=0.2)
    log = distill.train_draft(draft, sequences, soft, cfg, out, progress=False)
    index = [{"gen_len": 12, "temperature": 0.0, "family": "code"}] * 10
    cards.draft_card(out, draft, "tiny", cards.training_data(index), log, cfg)
    return out, draft, cfg, log, index


def test_draft_checkpoint_round_trips_weights_config_and_log(trained_draft):
    out, draft, cfg, log, _ = trained_draft
    before = digests(out)
    loaded, loaded_cfg, loaded_log = distill.load_trained(out)
    assert loaded_cfg == cfg and loaded_log == log and loaded_log[-1]["step"] == 6
    assert not loaded.training and next(loaded.parameters()).dtype == torch.float32
    expected = half_rounded(draft.state_dict())  # stored in float16
    assert all(torch.equal(v, expected[k]) for k, v in loaded.state_dict().items())
    assert digests(out) == before  # nothing written


def test_incomplete_draft_checkpoints_are_refused_with_what_to_do(trained_draft, tmp_path):
    with pytest.raises(FileNotFoundError, match="retrain = True"):
        distill.load_trained(tmp_path / "missing")
    copy_checkpoint(trained_draft[0], tmp_path / "partial")
    (tmp_path / "partial" / LOG_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=LOG_FILE):
        distill.load_trained(tmp_path / "partial")


def test_copy_checkpoint_reads_its_source_only(trained_draft, tmp_path):
    out = trained_draft[0]
    (tmp_path / "src").mkdir()
    for name, f in ((n, out / n) for n in digests(out)):
        (tmp_path / "src" / name).write_bytes(f.read_bytes())
    (tmp_path / "src" / STATE_FILE).write_bytes(b"state")
    before = digests(tmp_path / "src")
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / STATE_FILE).write_bytes(b"stale")  # of whatever was there before
    copy = copy_checkpoint(tmp_path / "src", tmp_path / "copy")
    assert digests(tmp_path / "src") == before
    assert digests(copy) == {k: v for k, v in before.items() if k != STATE_FILE}  # no training state
    assert copy_checkpoint(tmp_path / "src", tmp_path / "src") == tmp_path / "src"  # the same folder: nothing
    assert digests(tmp_path / "src") == before
    with pytest.raises(FileNotFoundError, match="retrain = True"):
        copy_checkpoint(tmp_path / "nowhere", tmp_path / "copy2")


def test_the_checkpoint_records_the_corpus_records_it_was_trained_on(trained_draft, tmp_path):
    out, _, _, _, index = trained_draft
    used = cards.trained_on(out)  # read back without the corpus
    assert used == {"records": 10, "reply_tokens": 120, "groups": [
        {"family": "code", "temperature": 0.0, "records": 10, "reply_tokens": 120}]}
    mixed = index + [{"gen_len": 5, "temperature": 0.7, "family": "chat"}] * 3
    assert cards.training_data(mixed)["groups"][0] == {"family": "chat", "temperature": 0.7, "records": 3,
                                                       "reply_tokens": 15}
    assert cards.families_and_temperatures(cards.training_data(mixed)) == (["chat", "code"], [0.0, 0.7])
    with pytest.raises(FileNotFoundError, match="retrain"):
        cards.trained_on(tmp_path)
    (tmp_path / cards.TRAINING_DATA).write_text(json.dumps({"records": 10, "reply_tokens": 120}))
    with pytest.raises(ValueError, match="retrain it"):  # written before the summary: the families are unknown
        cards.trained_on(tmp_path)


def test_read_config_refuses_unknown_settings(tmp_path):
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"steps": 3, "bogus": 1}))
    with pytest.raises(ValueError, match="bogus"):
        read_config(tmp_path / CONFIG_FILE, distill.TrainConfig)
    assert require_checkpoint(tmp_path, [CONFIG_FILE], "test") == tmp_path


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_head_checkpoint_round_trips_without_training_data(target, tmp_path, kind):
    g = torch.Generator().manual_seed(1)
    records, feats, offset = [], [], 0
    for _ in range(10):
        arr = torch.randint(0, 64, (14,), generator=g).numpy()
        records.append(({"prompt_len": 3, "offset": offset}, arr))
        feats.append(torch.randn(14, 32, generator=g).numpy().astype(np.float16))
        offset += 14
    cfg = HeadTrainConfig(steps=4, batch_size=2, warmup=2, eval_every=2, heldout_fraction=0.2)
    data = FeatureDataset(records, np.concatenate(feats), cfg)
    head_cfg = heads.head_config_for(target, kind, "tiny", sub_vocab_size=16, num_heads=2)
    trainer = HeadTrainer(target, head_cfg, data, cfg, tmp_path / "head")
    trainer.run(progress=False)
    assert (tmp_path / "head" / STATE_FILE).exists()  # float32 state beside the float16 checkpoint
    before = digests(tmp_path / "head")

    loaded = HeadTrainer.from_checkpoint(target, tmp_path / "head", kind)
    assert loaded.cfg == cfg and loaded.head_cfg == head_cfg
    assert loaded.log == json.loads(json.dumps(trainer.log)) and loaded.step == 4
    assert torch.equal(loaded.vocab_ids, trainer.vocab_ids)
    expected = half_rounded(trainer.head.state_dict())  # the committed float16 head, not the training state
    assert all(torch.equal(v, expected[k]) for k, v in loaded.head.state_dict().items())
    used = cards.training_data([{"gen_len": 11, "family": "code", "temperature": 1.0}] * 10)
    card = cards.head_card(tmp_path / "head", loaded, used)
    assert "4 AdamW steps" in card and "| 4 |" in card
    assert isinstance(sd.load_draft(str(tmp_path / "head"), target), heads.FeatureDraft)
    with pytest.raises(ValueError, match="training data"):
        loaded.run(progress=False)
    other = "medusa" if kind == "eagle" else "eagle"
    with pytest.raises(ValueError, match=f"not a {other} head"):
        HeadTrainer.from_checkpoint(target, tmp_path / "head", other)
    (tmp_path / "head" / "README.md").unlink()
    written = {"README.md", cards.TRAINING_DATA}  # only the card and the record of its training data
    assert {k: v for k, v in digests(tmp_path / "head").items() if k not in written} == \
        {k: v for k, v in before.items() if k not in written}
    assert cards.trained_on(tmp_path / "head") == used == json.loads(json.dumps(used))
    assert used["records"] == 10 and used["reply_tokens"] == 110
    (tmp_path / "head" / CONFIG_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=CONFIG_FILE):
        HeadTrainer.from_checkpoint(target, tmp_path / "head", kind)


def test_train_or_load_trains_or_reads_back_the_same_head(target, tmp_path):
    from specdec_lite.train.heads import describe, train_or_load

    g = torch.Generator().manual_seed(2)
    records = [({"prompt_len": 3, "offset": 14 * i}, torch.randint(0, 64, (14,), generator=g).numpy()) for i in range(10)]
    feats = torch.randn(140, 32, generator=g).numpy().astype(np.float16)
    data = FeatureDataset(records, feats, HeadTrainConfig(heldout_fraction=0.2))
    with pytest.raises(ValueError, match="training data"):
        train_or_load(target, "tiny", "medusa", tmp_path / "h", None, retrain=True, steps=4)
    trained = train_or_load(target, "tiny", "medusa", tmp_path / "h", data, retrain=True, steps=4, batch_size=2,
                            sub_vocab_size=16, num_heads=2, progress=False)
    assert trained.step == 4 and trained.cfg.eval_every == 1 and trained.cfg.warmup == 2
    assert describe(trained).startswith("medusa: ") and "4 steps, 8 training / 2 held-out records" in describe(trained)
    loaded = train_or_load(target, "tiny", "medusa", tmp_path / "h", None, retrain=False, steps=999)
    assert loaded.step == 4 and loaded.log == json.loads(json.dumps(trained.log)) and describe(loaded).endswith("as shipped")
    expected = half_rounded(trained.head.state_dict())
    assert all(torch.equal(v, expected[k]) for k, v in loaded.head.state_dict().items())
