"""The prepared GPU training run (specdec_lite.train.gpu_train): the training text packed into one file and unpacked
exactly, what is missing refused before any work, and the training in stretches that writes the head after each one
and resumes in a new trainer where it stopped, drawing what one run would (a tiny random Llama)."""
import json

import numpy as np
import pytest
import torch

from specdec_lite import paths
from specdec_lite.drafts import heads
from specdec_lite.train import continued, corpus, gpu_train
from specdec_lite.train.heads import HEAD_FILES, FeatureDataset, HeadTrainConfig, HeadTrainer
from specdec_lite.train.loop import LOG_FILE, read_log

from conftest import tiny_llama


def tiny_text(folder, records=6, length=20, seed=0):
    """A corpus folder as the cache holds one (tokens.bin, index.jsonl, and a file the run does not read)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    rng.integers(0, 49152, records * length, dtype=np.uint16).tofile(folder / "tokens.bin")
    entries = [{"id": f"r{i}", "prompt": "p\u00e9 \"quoted\"", "offset": i * length, "prompt_len": 4,
                "gen_len": length - 4} for i in range(records)]
    (folder / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    (folder / "self_requests.jsonl").write_text("{}\n")
    return folder


def test_the_packed_text_unpacks_to_exactly_what_was_packed(tmp_path, monkeypatch):
    text = tiny_text(tmp_path / "text")
    archive = gpu_train.pack_text(tmp_path / "packed" / "text.tar.xz", text)
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    unpacked = gpu_train.unpack_text(archive)
    assert unpacked == paths.corpus_dir()
    assert sorted(f.name for f in unpacked.iterdir()) == sorted(gpu_train.TEXT_FILES)  # only what the run reads
    for name in gpu_train.TEXT_FILES:
        assert (unpacked / name).read_bytes() == (text / name).read_bytes()
    assert [e for e, _ in corpus.load_records(unpacked)] == [e for e, _ in corpus.load_records(text)]
    (unpacked / "index.jsonl").write_text("")  # a rerun leaves the cache's text as it is
    gpu_train.unpack_text(archive)
    assert (unpacked / "index.jsonl").read_text() == ""
    with pytest.raises(FileExistsError, match="new folder"):
        gpu_train.read_archive(archive, unpacked)
    assert sorted(f.name for f in archive.parent.iterdir()) == ["text.tar.xz"]  # no partial file left


def test_missing_text_is_refused_before_any_work_saying_what_makes_it(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="train.restore"):
        gpu_train.pack_text(tmp_path / "text.tar.xz")  # nothing in the cache
    (tiny_text(tmp_path / "text") / "tokens.bin").unlink()
    with pytest.raises(FileNotFoundError, match="lacks tokens.bin"):
        gpu_train.pack_text(tmp_path / "text.tar.xz", tmp_path / "text")
    assert not (tmp_path / "text.tar.xz").exists()
    with pytest.raises(FileNotFoundError, match=r"no packed training text.*gpu_train pack"):
        gpu_train.main(["run", "--out", str(tmp_path / "out"), "--text", str(tmp_path / "none.tar.xz")])
    with pytest.raises(SystemExit):
        gpu_train.main(["run", "--out", str(tmp_path / "out"), "--steps", "0"])
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
    with pytest.raises(ValueError, match=r"first_record must be in 0\.\.5 \(the corpus has 6 records\), got 6"):
        continued.run_config(tmp_path / "run", 10, corpus_dir=tmp_path / "text", first_record=6)


@pytest.fixture(scope="module")
def tiny_run():
    """(target, head config, dataset, training config): 10 records of random features, 2 held out."""
    target = tiny_llama(vocab=64, layers=1, hidden=32, seed=3).cpu()
    g = torch.Generator().manual_seed(1)
    records = [({"prompt_len": 3, "offset": 14 * i}, torch.randint(0, 64, (14,), generator=g).numpy())
               for i in range(10)]
    features = torch.randn(140, 32, generator=g).numpy().astype(np.float16)
    cfg = HeadTrainConfig(steps=4, batch_size=2, warmup=1, eval_every=100, heldout=[0, 5])
    head_cfg = heads.head_config_for(target, "eagle", "tiny", sub_vocab_size=16)
    return target, head_cfg, FeatureDataset(records, features, cfg), cfg


def test_training_writes_the_head_after_every_stretch_and_a_new_run_resumes_where_it_stopped(tiny_run, tmp_path):
    target, head_cfg, data, cfg = tiny_run
    run = HeadTrainer(target, head_cfg, data, cfg, tmp_path / "run")
    gpu_train.train(run, minutes=0, out=tmp_path / "out")  # the time budget spent: one step, then saved
    assert run.step == 1
    written = gpu_train.read_archive(tmp_path / "out" / gpu_train.HEAD_ARCHIVE, tmp_path / "first")
    assert sorted(f.name for f in written.iterdir()) == sorted(HEAD_FILES)
    assert [e["step"] for e in read_log(written / LOG_FILE)] == [1]
    first, _, _ = heads.read_head(written)
    assert all(torch.equal(a, b.half().float()) for a, b in zip(first.state_dict().values(),
                                                                  run.head.state_dict().values()))

    resumed = HeadTrainer(target, head_cfg, data, cfg, tmp_path / "run")  # a new process would do the same
    assert resumed.step == 1
    gpu_train.train(resumed, minutes=None, out=tmp_path / "out", every=0)  # a stretch a step, to the last
    assert resumed.step == cfg.steps
    last = gpu_train.read_archive(tmp_path / "out" / gpu_train.HEAD_ARCHIVE, tmp_path / "last")
    assert [e["step"] for e in read_log(last / LOG_FILE)] == [1, 2, 3, 4]  # each stretch evaluated and saved

    whole = HeadTrainer(target, head_cfg, data, cfg, tmp_path / "whole")
    whole.run(progress=False)
    assert all(torch.equal(a, b) for a, b in zip(whole.head.state_dict().values(), resumed.head.state_dict().values()))
