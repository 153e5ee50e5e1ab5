"""The notebooks' shared set-up: parameters checked before any work, one output folder per run, only a
publishing run writing the shipped figures, results and checkpoints, and smoke mode saying what it replaces."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from specdec_lite import paths
from specdec_lite.tuning.devices import dtype_name, resolve_dtype
from specdec_lite.repro.notebook import run_name_for, setup, short_name

AUTO = dtype_name(resolve_dtype("auto", "cpu"))  # the CPU's "auto" dtype: bfloat16 with native bfloat16, else float32
OTHER = "float32" if AUTO == "bfloat16" else "bfloat16"


@pytest.fixture(autouse=True)
def no_mode_from_the_environment(monkeypatch):
    monkeypatch.delenv("SPECDEC_SMOKE", raising=False)
    monkeypatch.delenv("SPECDEC_PUBLISH", raising=False)


def test_smoke_runs_write_under_out_smoke_named_from_the_pair(capsys):
    run = setup(smoke=True)
    folder = run.root / "out" / "smoke" / f"smollm2-135m-instruct--smollm2-135m-draft--{AUTO}"
    assert run.smoke and not run.published and run.folder == folder and run.pick(10, 2) == 2
    assert run.results == folder / "results" and run.figures == folder / "figures" and run.results.is_dir()
    assert run.drafts == folder / "drafts"
    printed = capsys.readouterr().out
    assert printed.startswith("smoke: True | publish: False") and f"writes to {run.shown(folder)}/" in printed


def test_runs_write_under_out_runs_unless_they_publish(monkeypatch, local_pairs, capsys):
    monkeypatch.setenv("SPECDEC_SMOKE", "0")
    run = setup(smoke=False)  # what JupyterLab's Run All does
    assert not run.published and not run.smoke and run.pick(10, 2) == 10
    assert run.folder == run.root / "out" / "runs" / f"smollm2-135m-instruct--smollm2-135m-draft--{AUTO}"
    assert "(publish = True: the shipped ones)" in capsys.readouterr().out
    others = [setup(target=str(local_pairs / "tiny-4l"), draft=str(local_pairs / "tiny-1l")),
              setup(dtype=OTHER), setup(run_name="mine")]
    names = [f"tiny-4l--tiny-1l--{AUTO}", f"smollm2-135m-instruct--smollm2-135m-draft--{OTHER}", "mine"]
    for run, name in zip(others, names):
        assert not run.published and run.folder == run.root / "out" / "runs" / name
        assert run.results == run.folder / "results" and run.figures == run.folder / "figures"


def test_only_a_publishing_run_writes_the_shipped_folders(monkeypatch, capsys):
    for run in (setup(publish=True), setup(target="smollm2-135m-instruct", draft="smollm2-135m", publish=True,
                                           check_draft=False)):  # 00_train_heads names the heads' prefix
        assert run.published and run.results == paths.results_dir() and run.figures == paths.figures_dir()
        assert run.drafts == paths.drafts_dir() and run.document("docs/RESULTS.md") == run.root / "docs" / "RESULTS.md"
    assert "publish: True | " in capsys.readouterr().out
    monkeypatch.setenv("SPECDEC_PUBLISH", "1")  # as make reproduce sets it
    assert setup().published and "publish: True (SPECDEC_PUBLISH=1)" in capsys.readouterr().out
    assert setup(run_name="x").results == paths.results_dir()  # a run name names out/ folders only


@pytest.mark.parametrize("kwargs, message", [
    ({"smoke": True}, "a smoke run never does"),
    ({"draft": "n-gram"}, "writes under out/runs/: set publish = False"),
])
def test_publishing_anything_but_the_shipped_pair_at_full_size_is_refused(kwargs, message, tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)
    with pytest.raises(ValueError, match=message):
        setup(publish=True, **kwargs)
    assert not (tmp_path / "out").exists()


def test_smoke_mode_prints_each_parameter_it_replaces(capsys):
    small = setup(smoke=True)
    capsys.readouterr()
    assert small.scale(n_samples=(200_000, 20_000), real_runs=(600, 40)) == (20_000, 40)
    assert capsys.readouterr().out == "smoke replaces n_samples = 200000 by 20000, real_runs = 600 by 40\n"
    full = setup()
    capsys.readouterr()
    assert full.scale(n_samples=(200_000, 20_000)) == (200_000,) and capsys.readouterr().out == ""


def test_training_runs_write_checkpoints_and_text_only_where_they_may(capsys):
    run, shipped = setup(), setup(publish=True)
    capsys.readouterr()
    assert run.checkpoints(["a", "b"], retrain=True) == [run.drafts / "a", run.drafts / "b"]
    assert shipped.checkpoints(["smollm2-135m-draft"], retrain=True) == [paths.drafts_dir() / "smollm2-135m-draft"]
    assert "training replaces the shipped data/drafts/smollm2-135m-draft" in capsys.readouterr().out
    assert run.corpus(generates=False) == shipped.corpus(generates=True) == paths.corpus_dir()
    assert setup(smoke=True).corpus(generates=True) == setup(smoke=True).folder / "target_text"
    with pytest.raises(ValueError, match="appends to the training text in the cache: set publish = True"):
        run.corpus(generates=True)


def test_nothing_reads_the_machine_at_import():
    """Importing the notebooks' set-up does not read the CPU's flags (it used to, to pick the shipped run)."""
    code = ("import builtins, io\n"
            "seen = []\n"
            "real = io.open\n"
            "def spy(file, *a, **k):\n"
            "    seen.append(str(file))\n"
            "    return real(file, *a, **k)\n"
            "builtins.open = io.open = spy\n"
            "import specdec_lite.repro.notebook, specdec_lite.sweep\n"
            "print([f for f in seen if f == '/proc/cpuinfo'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_dtype_is_recorded_in_titles_and_every_csv_row(tmp_path, local_pairs):
    run = setup(smoke=True, dtype="bfloat16")
    assert run.dtype == torch.bfloat16 and run.title("speedup") == "speedup (bfloat16)"  # the shipped pair
    written = pd.read_csv(run.save_csv(pd.DataFrame({"x": [1, 2]}), "t.csv"))
    assert list(written.dtype) == ["bfloat16"] * 2 and set(written.target) == {"smollm2-135m-instruct"}
    other = setup(smoke=True, dtype="float32", target=str(local_pairs / "tiny-4l"), draft=str(local_pairs / "tiny-1l"))
    assert other.title("speedup") == "speedup (float32, tiny-4l / tiny-1l)"


def test_run_names_are_file_names():
    assert short_name("meta-llama/Llama-3.2-1B") == "Llama-3.2-1B" and short_name("/a/b c/") == "b-c"
    assert run_name_for("org/T", "/x/D", torch.float16) == "T--D--float16"


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "cuda:7"}, "torch sees no CUDA device|torch sees 1 CUDA"),
    ({"device": "tpu"}, "not a device name|not supported here"),
    ({"dtype": "int8"}, "dtype 'int8' is not one we run; use 'auto' or one of"),
    ({"target": "/no/such/folder"}, "cannot be loaded: no folder is there"),
    # offline: refused at once as unreachable; online: the hub's answer, in one line
    ({"draft": "no/such-model-xyz"}, "not in the Hugging Face (hub )?cache"),
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
    from specdec_lite.tuning import devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(ValueError, match="does not support bfloat16; use dtype='float16' or 'auto'"):
        devices.resolve_dtype("bfloat16", "cuda")
    assert devices.resolve_dtype("auto", "cuda") == torch.float16  # "auto" picks what the GPU has
    for native, dtype in ((True, torch.bfloat16), (False, torch.float32)):  # on the CPU: bfloat16 where native
        monkeypatch.setattr(devices, "cpu_has_native_bfloat16", lambda native=native: native)
        assert devices.resolve_dtype("auto", "cpu") == dtype
    assert devices.resolve_dtype("bf16", "cpu") == torch.bfloat16
