"""A shipped EAGLE head continued on more replies (specdec_lite.train.continued, train.heads) on a tiny random
Llama: the run starts from a shipped head's weights and sub-vocabulary, holds out the records it is told to, resumes
exactly in a new trainer, and is published only when it beats the head it started from."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import specdec_lite as sd
from specdec_lite.drafts import heads
from specdec_lite.paths import DATA_ENV
from specdec_lite.train import continued, corpus, eagle3, features
from specdec_lite.train.heads import FeatureDataset, HeadTrainConfig, HeadTrainer, load_dataset
from specdec_lite.train.loop import copy_checkpoint

from conftest import tiny_llama

HELD = [0, 3, 5]
START = "shipped-head"  # the head the tiny runs start from, under the test's drafts folder


@pytest.fixture(scope="module")
def setting(tmp_path_factory, embedded):
    """(target, root): a tiny target's corpus and features, and a head (3 steps) shipped under root/data/drafts."""
    _, tokenizer = embedded
    root = tmp_path_factory.mktemp("continued")
    target = tiny_llama(vocab=49152, layers=1, hidden=32, seed=5, max_positions=8192)
    corpus.generate_corpus(target, tokenizer, root / "text", budget_tokens=300, batch_size=4, max_new_tokens=24,
                           progress=False)
    features.extract_features(target, root / "text", root / "f", "tiny", progress=False)
    cfg = HeadTrainConfig(steps=3, batch_size=4, eval_every=3, warmup=1, lr=3e-3, heldout=HELD)
    data, _ = load_dataset(root / "f", cfg, root / "text")
    first = HeadTrainer(target, heads.head_config_for(target, "eagle", "tiny", sub_vocab_size=4096), data, cfg,
                        root / "data" / "drafts" / START)
    first.run(progress=False)
    return target, root


@pytest.fixture
def shipped(setting, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(setting[1] / "data"))
    return setting


def config(root, **kw):
    n = len(corpus.load_index(root / "text"))
    base = dict(steps=30, batch_size=4, eval_every=15, warmup=3, lr=3e-3, heldout=HELD, start_from=START,
                records=n)
    return HeadTrainConfig(**{**base, **kw})


def trainer(target, root, out, cfg):
    return continued.make_trainer(target, root / out, cfg, root / "text", root / "f", "tiny")


def test_the_run_starts_from_the_shipped_head_and_holds_out_the_named_records(shipped):
    target, root = shipped
    run = trainer(target, root, "run", config(root))
    start, _, vocab_ids = heads.read_head(root / "data" / "drafts" / START)
    assert torch.equal(run.vocab_ids, vocab_ids)
    assert all(torch.equal(a, b) for a, b in zip(run.head.state_dict().values(), start.state_dict().values()))
    records = corpus.load_records(root / "text")
    held = [run.data.items[j][0] for j in run.data.heldout]
    assert [t.tolist() for t in held] == [records[i][1][:256].tolist() for i in HELD]
    assert not set(run.data.heldout) & set(run.data.train)
    assert len(run.data.heldout) + len(run.data.train) == len(records)
    before = run.evaluate()
    log = run.run(progress=False)
    assert log[-1]["heldout_ce"] < before["heldout_ce"]  # the 3-step head is far from done


def test_an_interrupted_run_resumes_to_the_same_weights(shipped):
    """With training-time test, as the unrolled runs train."""
    target, root = shipped
    whole = trainer(target, root, "whole", config(root, steps=6, eval_every=3, unroll=continued.UNROLL))
    whole.run(progress=False)
    parted = trainer(target, root, "parted", config(root, steps=6, eval_every=3, unroll=continued.UNROLL))
    parted.run(max_minutes=0, progress=False)  # stops after its first step, saved with its state
    assert parted.step == 1
    resumed = trainer(target, root, "parted", continued.run_config(root / "parted", steps=99))
    assert resumed.cfg.steps == 6 and resumed.cfg.unroll == continued.UNROLL and resumed.step == 1  # as stored
    resumed.run(progress=False)
    for a, b in zip(whole.head.state_dict().values(), resumed.head.state_dict().values()):
        assert torch.equal(a, b)


def test_a_head_is_published_only_when_it_beats_the_one_it_started_from(shipped):
    """Against the 3-step head it started from, 30 more steps win and are shipped with a card that holds both
    heads' figures; a run of no step past its start (the same weights) is not better and ships nothing."""
    target, root = shipped
    published = root / "data" / "drafts" / continued.NAME
    same = trainer(target, root, "same", config(root, steps=1, lr=0.0))
    same.run(progress=False)
    assert not eagle3.is_better(continued.publish(target, same, continued.NAME, root / "text")) and not published.exists()
    good = trainer(target, root, "good", config(root, unroll=continued.UNROLL))  # as the unrolled runs train
    good.run(progress=False)
    comparison = continued.publish(target, good, continued.NAME, root / "text")
    assert eagle3.is_better(comparison) and list(comparison.index) == [
        f"{START} (the start)", f"{continued.NAME} (step 30)"]
    assert not (published / "training_state.pt").exists()
    card = (published / "README.md").read_text()
    assert f"Started from the weights of `{START}`" in card and "3 records held out" in card
    assert "the head it started from beside this one" in card and "continued.compare_heads" in card
    assert f"training-time test: the same loss after each of {continued.UNROLL} drafting steps" in card
    assert isinstance(sd.load_draft(continued.NAME, target), sd.EagleDraft)


def test_a_head_of_more_layers_grows_its_start_and_resumes(shipped):
    """A trainer of two decoder layers from the one-layer shipped head (how the shipped two-layer head began):
    before training it predicts exactly what its start predicts (the second layer begins as the identity); training
    moves the second layer; an interrupted run resumes to the same weights; a start with more layers than the run is
    refused."""
    target, root = shipped
    cfg = config(root, steps=4, eval_every=2)
    data, _ = load_dataset(root / "f", cfg, root / "text")
    two_layers = replace(heads.read_head_config(root / "data" / "drafts" / START), num_layers=2)

    def deeper(out, run_cfg=cfg):
        return HeadTrainer(target, two_layers, data, run_cfg, root / out)

    deep = deeper("deep")
    start, _, _ = heads.read_head(root / "data" / "drafts" / START)
    torch.manual_seed(0)
    x, e, positions = torch.randn(1, 5, 32), torch.randn(1, 5, 32), torch.arange(5)
    assert len(deep.head.layers) == 2 and torch.equal(deep.head(x, e, positions), start(x, e, positions))
    deep.run(progress=False)
    assert deep.head.deeper[0].down.weight.abs().sum() > 0
    assert not torch.allclose(deep.head(x, e, positions), start(x, e, positions), atol=1e-4)
    deeper("deep-parted").run(max_minutes=0, progress=False)
    resumed = deeper("deep-parted", continued.run_config(root / "deep-parted", steps=99))
    resumed.run(progress=False)
    for a, b in zip(deep.head.state_dict().values(), resumed.head.state_dict().values()):
        assert torch.equal(a, b)
    copy_checkpoint(root / "deep", root / "data" / "drafts" / "two-layers")
    assert heads.read_head_config(root / "data" / "drafts" / "two-layers").num_layers == 2
    assert len(trainer(target, root, "kept", config(root, start_from="two-layers")).head.layers) == 2
    one_layer = replace(two_layers, num_layers=1)
    with pytest.raises(ValueError, match=r"in \['num_layers'\].*fewer layers"):
        HeadTrainer(target, one_layer, data, config(root, start_from="two-layers"), root / "shallow")


def test_a_run_from_a_continued_head_also_holds_out_records_its_start_never_saw():
    """Of the records after the first ``seen`` (those its start trained on), eagle3.HELDOUT_RECORDS spread evenly; too
    few new records are refused, saying what to do."""
    held = continued.new_heldout(100, 400)
    assert len(held) == eagle3.HELDOUT_RECORDS and held[:3] == [100, 104, 108] and max(held) < 400
    with pytest.raises(ValueError, match=r"only 10 records are new.*corpus --self-made"):
        continued.new_heldout(100, 110)


def test_a_start_of_another_shape_and_missing_records_are_refused(shipped):
    target, root = shipped
    other = heads.head_config_for(target, "eagle", "tiny", sub_vocab_size=128)
    data, _ = load_dataset(root / "f", config(root), root / "text")
    with pytest.raises(ValueError, match=r"differs from this run's in \['sub_vocab_size'\]"):
        HeadTrainer(target, other, data, config(root), root / "other")
    records = corpus.load_records(root / "text")
    with pytest.raises(ValueError, match="none of the 1 held-out records"):
        FeatureDataset(records[:4], features.load_features(root / "f")[0], config(root, heldout=[10]))
    with pytest.raises(ValueError, match="extract the rest first"):
        load_dataset(root / "f", config(root), root / "text", max_records=len(records) + 1)


def test_a_run_from_a_later_record_reads_only_its_features_and_holds_out_by_corpus_index(setting, tmp_path):
    """The unrolled run trains on the records from the first self-made one on (``first_record``): their features
    alone are extracted, they are what the full extraction gives, and held-out records are named by their index in
    the whole corpus; a dataset or an extraction from an earlier record is refused, saying what to do."""
    target, root = setting
    records = corpus.load_records(root / "text")
    first = len(records) // 2
    meta = features.extract_features(target, root / "text", tmp_path / "f", "tiny", first_record=first,
                                     progress=False)
    assert (meta["first_record"], meta["records_done"]) == (first, len(records))
    data, _ = load_dataset(tmp_path / "f", config(root, first_record=first, heldout=[first + 1]), root / "text")
    assert len(data.items) == len(records) - first  # every record from the first on (all are short here)
    tokens, feats, _ = data.items[data.heldout[0]]
    entry, ids = records[first + 1]
    assert tokens.tolist() == ids[:256].tolist()
    full, _ = features.load_features(root / "f")
    expected = np.asarray(full[entry["offset"]: entry["offset"] + len(tokens)], dtype=np.float32)
    assert np.allclose(feats.float().numpy(), expected, atol=1e-2)  # float16 storage, batched with other rows
    with pytest.raises(ValueError, match=f"records {first} on.*another folder"):
        load_dataset(tmp_path / "f", config(root), root / "text")
    with pytest.raises(ValueError, match=f"holds features of records {first} on"):
        features.extract_features(target, root / "text", tmp_path / "f", "tiny", progress=False)


def test_a_new_run_takes_its_peak_learning_rate_from_the_command_line_and_a_resumed_one_keeps_its_own(shipped,
                                                                                                     tmp_path):
    from specdec_lite.train import loop

    target, root = shipped
    args = loop.run_arguments("d", continued.training_dir, 10, ["--lr", "1e-4"], heads=[continued.NAME],
                              lr=continued.PEAK_LR)
    assert args.lr == 1e-4
    assert loop.run_arguments("d", continued.training_dir, 10, [], heads=[continued.NAME],
                              lr=continued.PEAK_LR).lr == continued.PEAK_LR
    with pytest.raises(SystemExit):  # a trainer whose recipe sets no --lr refuses one
        loop.run_arguments("d", tmp_path, 10, ["--lr", "1e-4"])
    run = trainer(target, root, "lower", config(root, steps=5, lr=args.lr))  # a corpus too small for run_config's
    run.run(max_minutes=0, progress=False)  # one step, saved with its settings
    resumed = continued.run_config(root / "lower", steps=99, corpus_dir=root / "text", lr=continued.PEAK_LR)
    assert resumed.lr == 1e-4 and resumed.steps == 5


def test_a_run_on_no_newer_record_holds_out_what_its_start_held_out(shipped):
    """A start trained on the whole corpus as it is now leaves no unseen records: the run holds out the start's own
    held-out ones, which no head before it trained on, and the batch size it is given."""
    target, root = shipped
    start = root / "data" / "drafts" / "whole-corpus"
    good = trainer(target, root, "whole-corpus-run", config(root, steps=1, heldout=[1, 4]))
    good.run(progress=False)
    copy_checkpoint(root / "whole-corpus-run", start)
    cfg = continued.run_config(root / "next", steps=9, corpus_dir=root / "text", start_from="whole-corpus",
                               batch_size=3)
    assert cfg.heldout == [1, 4] and cfg.batch_size == 3 and cfg.start_from == "whole-corpus"
    assert cfg.records == len(corpus.load_index(root / "text"))


def test_the_features_must_be_where_the_target_runs_and_publishing_is_on_the_cpu(shipped, tmp_path):
    from specdec_lite.train import loop

    target, root = shipped
    data, _ = load_dataset(root / "f", config(root), root / "text", device="meta")
    assert data.items[0][1].device.type == "meta"
    with pytest.raises(ValueError, match=r"features are on meta and the target on cpu.*device=target.device"):
        HeadTrainer(target, heads.head_config_for(target, "eagle", "tiny", sub_vocab_size=4096), data, config(root),
                    tmp_path / "run")
    args = loop.run_arguments("d", continued.training_dir, 10, ["--device", "cuda", "--batch-size", "64"],
                              heads=[continued.NAME], batch_size=8)
    assert (args.device, args.batch_size, args.dtype) == ("cuda", 64, "auto")
    with pytest.raises(SystemExit):
        loop.run_arguments("d", continued.training_dir, 10, ["--device", "cuda", "--publish"], heads=[continued.NAME],
                           batch_size=8)
