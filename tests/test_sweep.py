"""The sweep over model pairs: checked pairs files, refusals recorded without stopping, one folder per run, one
comparison over all pairs, and the shipped results left untouched."""
import hashlib
import json
import os

import pandas as pd
import pytest
import yaml

from specdec_lite import paths, sweep
from specdec_lite.drafts.loading import drafts_for_pair, heads_for
from specdec_lite.core.models import load_model


def shipped_digest() -> dict:
    """Hashes of everything a default run writes: results, figures, the results document, the notebooks."""
    root = paths.repo_root()
    files = [*paths.results_dir().glob("*"), *paths.figures_dir().glob("*"), root / "docs" / "RESULTS.md",
             *(root / "notebooks").glob("*.ipynb")]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(files)}


def write(tmp_path, content: dict, name="pairs.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(content) if name.endswith(".yaml") else json.dumps(content))
    return path


def test_sweep_over_two_local_pairs_and_a_refused_one(tmp_path, local_pairs):
    before = shipped_digest()
    pairs_file = write(tmp_path, {
        "notebooks": ["03_task_acceptance"], "out": str(tmp_path / "sweep"),
        "parameters": {"prompts_per_task": 1, "max_new_tokens": 8, "temperatures": [0.0]},
        "pairs": [
            # a full-size (not smoke) run with small parameters: it must still write only its own folder
            {"target": str(local_pairs / "tiny-4l"), "draft": str(local_pairs / "tiny-1l"), "run_name": "test-sweep-4l",
             "dtype": "float32"},
            {"target": str(local_pairs / "tiny-2l"), "draft": str(local_pairs / "tiny-1l"), "dtype": "bfloat16",
             "parameters": {"smoke": True}},
            {"target": str(local_pairs / "tiny-4l"), "draft": str(local_pairs / "other-tokenizer-1l")},
        ]})
    lines = []
    status = sweep.run_sweep(sweep.read_sweep(pairs_file), log=lines.append)
    written = sweep.write_outputs(sweep.read_sweep(pairs_file), status)

    assert [r["status"] for r in status] == ["ok", "ok", "refused"], status
    assert "tokenizer differs" in status[2]["reason"]
    assert any(line.startswith("[pair 3/3]") and "refused" in line for line in lines)
    root = paths.repo_root()
    assert status[0]["folder"] == str(root / "out" / "runs" / "test-sweep-4l")
    assert status[1]["folder"] == str(root / "out" / "smoke" / "tiny-2l--tiny-1l--bfloat16")
    for r in status[:2]:
        executed = root / r["folder"] / "03_task_acceptance.ipynb"
        assert executed.read_text() == sweep.jupyterlab_form(executed.read_text())
        assert (root / r["folder"] / "figures" / "task_acceptance.png").is_file()
    table = pd.read_csv(written["comparison"])
    assert set(table.pair) == {"test-sweep-4l", "tiny-2l / tiny-1l"}
    assert set(table.dtype) == {"float32", "bfloat16"} and {"trained draft", "n-gram", "layer-skip"} <= set(table.method)
    ours = table[table.kind == "speculative"]  # plain decoding's and transformers' rows have speedups only
    assert ours[["alpha", "mean_accepted_length", "c", "speedup"]].notna().all().all() and table.speedup.notna().all()
    assert table.baseline.str.match(r"(autoregressive|transformers generate), (float32|bfloat16|float16)( unpacked)?$").all()
    assert {"transformers generate", "transformers prompt lookup"} <= set(table.method)
    assert written["figure"].stat().st_size > 10_000
    assert shipped_digest() == before  # byte for byte


def test_pairs_files_take_yaml_lists_and_defaults(tmp_path):
    sweep_file = sweep.read_sweep(write(tmp_path, {"pairs": [
        {"target": "t", "draft": "d", "heads": ["h1", "h2"], "parameters": {"gamma": 3}}]}))
    pair = sweep_file.pairs[0]
    assert (pair.heads, pair.device, pair.dtype, pair.parameters) == ("h1,h2", "cpu", "auto", {"gamma": 3})
    assert sweep_file.notebooks == [("03_task_acceptance", {})] and sweep_file.out.name == "pairs"
    assert sweep.changed_parameters("03_task_acceptance", {"gamma": 4, "heads": "auto", "dtype": "bfloat16"}) == \
        {"dtype": "bfloat16"}  # papermill injects only what differs from the notebook's defaults


def test_only_a_publishing_run_with_the_committed_parameters_is_saved_over_the_committed_notebook():
    root = paths.repo_root()
    shipped = sweep.check_pair(sweep.Pair("smollm2-135m-instruct", "smollm2-135m-draft"), publish=True)
    assert shipped.published and sweep.executed_path("01_unbiasedness", shipped, {}) == \
        root / "notebooks" / "01_unbiasedness.ipynb"
    retrained = sweep.executed_path("00_train_draft", shipped, {"retrain": True})  # make drafts
    assert retrained == root / "out" / "runs" / shipped.name / "00_train_draft.ipynb"
    interactive = sweep.check_pair(sweep.Pair("smollm2-135m-instruct", "smollm2-135m-draft"))
    assert not interactive.published
    assert sweep.executed_path("01_unbiasedness", interactive, {}) == interactive.folder / "01_unbiasedness.ipynb"
    with pytest.raises(ValueError, match="writes under out/runs/: set publish = False"):
        sweep.check_pair(sweep.Pair("smollm2-135m-instruct", "n-gram"), publish=True)


def test_the_kernel_learns_whether_to_publish_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPECDEC_PUBLISH", "1")
    with sweep.environment("SPECDEC_PUBLISH", "0"):
        assert os.environ["SPECDEC_PUBLISH"] == "0"
    assert os.environ["SPECDEC_PUBLISH"] == "1"
    monkeypatch.delenv("SPECDEC_PUBLISH")
    with sweep.environment("SPECDEC_PUBLISH", "1"):
        assert os.environ["SPECDEC_PUBLISH"] == "1"
    assert "SPECDEC_PUBLISH" not in os.environ


@pytest.mark.parametrize("content, message", [
    ({"pairs": [{"target": "x"}]}, "pair 1: missing keys \\['draft'\\]"),
    ({"pairs": [{"target": "x", "draft": "y", "dtpye": "auto"}]}, "pair 1: unknown keys \\['dtpye'\\]"),
    ({"pairs": [], "notebooks": ["03_task_acceptance"]}, "'pairs' must be a non-empty list"),
    ({"pair": [{"target": "x", "draft": "y"}]}, "unknown keys \\['pair'\\]"),
    ({"pairs": [{"target": "x", "draft": "y"}], "notebooks": ["05_nothing"]}, "no notebook '05_nothing'; choose from"),
    ({"pairs": [{"target": "x", "draft": "y"}], "parameters": {"gama": 4}}, "unknown notebook parameters \\['gama'\\]"),
    ({"pairs": [{"target": "x", "draft": "y"}], "publish": "yes"}, "'publish' must be true or false"),
])
def test_bad_sweep_files_are_refused_before_anything_runs(tmp_path, content, message):
    for name in ("pairs.yaml", "pairs.json"):
        with pytest.raises(ValueError, match=message):
            sweep.read_sweep(write(tmp_path, content, name))


@pytest.mark.parametrize("pair, message", [
    ({"device": "cuda:99"}, r"torch sees (no|\d+) CUDA device"),
    ({"dtype": "float8"}, "dtype 'float8' is not one we run"),
    ({"target": "/no/such/folder"}, "cannot be loaded: no folder is there"),
])
def test_bad_pairs_are_refused_with_what_to_do(pair, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        sweep.check_pair(sweep.Pair(**{"target": "smollm2-135m-instruct", "draft": "n-gram", **pair}))


def test_heads_default_to_the_ones_trained_for_the_target(embedded, local_pairs):
    target, _ = embedded
    assert heads_for(target) == ["smollm2-135m-eagle-deep-ttt", "smollm2-135m-medusa"]
    tiny, _ = load_model(str(local_pairs / "tiny-1l"), device="cpu", dtype="float32")
    assert heads_for(tiny) == []
    drafts, skipped = drafts_for_pair(tiny, heads="auto")
    assert list(drafts) == ["n-gram", "lookup tree (auto)"]
    assert set(skipped) == {"heads", "layer-skip", "EAGLE tree / dynamic tree / hybrid"}
    assert "keep all 1 of the target's layers" in skipped["layer-skip"]
    with pytest.raises(ValueError, match="train a head for this target"):  # named explicitly: still refused
        drafts_for_pair(tiny, heads="smollm2-135m-eagle-deep-ttt")
