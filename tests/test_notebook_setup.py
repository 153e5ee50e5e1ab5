"""The notebooks' shared set-up: smoke runs write under out/smoke, full runs to the shipped folders."""
from pathlib import Path

from specdec_lite import paths
from specdec_lite.repro.notebook import setup


def test_smoke_runs_never_write_over_shipped_results(monkeypatch):
    monkeypatch.delenv("SPECDEC_SMOKE", raising=False)
    run = setup(smoke=True)
    assert run.smoke and run.results == run.root / "out" / "smoke" / "results" and run.results.is_dir()
    assert run.figures == run.root / "out" / "smoke" / "figures" and run.pick(10, 2) == 2


def test_environment_switches_smoke_on_and_full_runs_use_shipped_folders(monkeypatch):
    monkeypatch.setenv("SPECDEC_SMOKE", "1")
    assert setup(smoke=False).smoke
    monkeypatch.setenv("SPECDEC_SMOKE", "0")
    run = setup(smoke=False)
    assert not run.smoke and run.results == paths.results_dir() and run.figures == paths.figures_dir()
    assert run.pick(10, 2) == 10


def test_parameter_paths_resolve_from_the_repository_root(tmp_path):
    run = setup(smoke=True)
    assert run.path("data/prompts") == paths.repo_root() / "data" / "prompts"
    assert run.path(tmp_path) == tmp_path and run.path(str(tmp_path)) == Path(tmp_path)


def test_printed_paths_carry_no_machine_prefix(tmp_path):
    run = setup(smoke=True)
    assert run.shown(run.root / "data" / "drafts") == "data/drafts"
    assert run.shown(Path.home() / ".cache" / "x") == "~/.cache/x"
    assert run.shown("/elsewhere/file") == "/elsewhere/file"
