"""The notebooks' shared set-up: parameters checked before any work, one output folder per run, and only the
embedded default run writing the shipped figures and results."""
from pathlib import Path

import pandas as pd
import pytest
import torch

from specdec_lite import paths
from specdec_lite.core.models import dtype_name
from specdec_lite.repro.notebook import DEFAULT_DTYPE, run_name_for, setup, short_name

AUTO = dtype_name(DEFAULT_DTYPE)  # the CPU's "auto" dtype: bfloat16 with native bfloat16, else float32
OTHER = "float32" if AUTO == "bfloat16" else "bfloat16"


def test_smoke_runs_write_under_out_smoke_named_from_the_pair(monkeypatch):
    monkeypatch.delenv("SPECDEC_SMOKE", raising=False)
    run = setup(smoke=True)
    folder = run.root / "out" / "smoke" / f"smollm2-135m-instruct--smollm2-135m-draft--{AUTO}"
    assert run.smoke and not run.default and run.folder == folder and run.pick(10, 2) == 2
    assert run.results == folder / "results" and run.figures == folder / "figures" and run.results.is_dir()


def test_only_the_embedded_default_run_writes_the_shipped_folders(monkeypatch, local_pairs):
    monkeypatch.setenv("SPECDEC_SMOKE", "1")
    assert setup(smoke=False).smoke
    monkeypatch.setenv("SPECDEC_SMOKE", "0")
    run = setup(smoke=False)
    assert run.default and not run.smoke and run.pick(10, 2) == 10
    assert run.results == paths.results_dir() and run.figures == paths.figures_dir()
    others = [setup(target=str(local_pairs / "tiny-4l"), draft=str(local_pairs / "tiny-1l")),
              setup(dtype=OTHER), setup(run_name="mine")]
    names = [f"tiny-4l--tiny-1l--{AUTO}", f"smollm2-135m-instruct--smollm2-135m-draft--{OTHER}", "mine"]
    for run, name in zip(others, names):
        assert not run.default and run.folder == run.root / "out" / "runs" / name
        assert run.results == run.folder / "results" and run.figures == run.folder / "figures"


def test_the_dtype_is_recorded_in_titles_and_every_csv_row(tmp_path, local_pairs):
    run = setup(smoke=True, dtype="bfloat16")
    assert run.dtype == torch.bfloat16 and run.title("speedup") == \
        "speedup (bfloat16, smollm2-135m-instruct / smollm2-135m-draft)"
    written = pd.read_csv(run.save_csv(pd.DataFrame({"x": [1, 2]}), "t.csv"))
    assert list(written.dtype) == ["bfloat16"] * 2 and set(written.target) == {"smollm2-135m-instruct"}
    assert setup(smoke=True, dtype="float32").title("speedup") == \
        "speedup (float32, smollm2-135m-instruct / smollm2-135m-draft)"


def test_run_names_are_file_names():
    assert short_name("meta-llama/Llama-3.2-1B") == "Llama-3.2-1B" and short_name("/a/b c/") == "b-c"
    assert run_name_for("org/T", "/x/D", torch.float16) == "T--D--float16"


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "cuda:7"}, "torch sees no CUDA device|torch sees 1 CUDA"),
    ({"device": "tpu"}, "not a device name|not supported here"),
    ({"dtype": "int8"}, "dtype 'int8' is not one we run; use 'auto' or one of"),
    ({"target": "/no/such/folder"}, "not a folder, not a package name"),
    ({"draft": "no/such-model-xyz"}, "not in the Hugging Face hub cache; asking the hub failed"),
])
def test_bad_parameters_are_refused_before_any_work(kwargs, message, tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)  # a refusal must come before any folder is made
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        setup(smoke=True, **kwargs)
    assert not (tmp_path / "out").exists()


def test_parameter_paths_resolve_from_the_repository_root(tmp_path):
    run = setup(smoke=True)
    assert run.path("data/prompts") == paths.repo_root() / "data" / "prompts"
    assert run.path(tmp_path) == tmp_path and run.path(str(tmp_path)) == Path(tmp_path)


def test_printed_paths_carry_no_machine_prefix(tmp_path):
    run = setup(smoke=True)
    assert run.shown(run.root / "data" / "drafts") == "data/drafts"
    assert run.shown(Path.home() / ".cache" / "x") == "~/.cache/x"
    assert run.shown("/elsewhere/file") == "/elsewhere/file"


def test_a_dtype_the_device_cannot_run_is_refused(monkeypatch):
    from specdec_lite.core import models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(ValueError, match="does not support bfloat16; use dtype='float16' or 'auto'"):
        models.resolve_dtype("bfloat16", "cuda")
    assert models.resolve_dtype("auto", "cuda") == torch.float16  # "auto" picks what the GPU has
    for native, dtype in ((True, torch.bfloat16), (False, torch.float32)):  # on the CPU: bfloat16 where native
        monkeypatch.setattr(models, "cpu_has_native_bfloat16", lambda native=native: native)
        assert models.resolve_dtype("auto", "cpu") == dtype
    assert models.resolve_dtype("bf16", "cpu") == torch.bfloat16
