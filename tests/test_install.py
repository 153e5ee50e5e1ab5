"""Shipped data is found through specdec_lite.paths, in a checkout, through $SPECDEC_LITE_DATA, and in a
non-editable install run from another directory."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_lite import paths
from specdec_lite.repro.tasks import load_prompts

ROOT = Path(__file__).resolve().parents[1]


def test_checkout_finds_the_repository_data(monkeypatch):
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    assert paths.data_dir() == ROOT / "data"
    assert (paths.drafts_dir() / "smollm2-135m-draft" / "config.json").exists()
    assert len(load_prompts()) == 100 and paths.results_dir() == ROOT / "data" / "results"


def test_environment_override(monkeypatch, tmp_path):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "mine.jsonl").write_text(json.dumps({"id": "a", "task": "code", "prompt": "hi"}) + "\n")
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path))
    assert paths.drafts_dir() == tmp_path / "drafts"
    assert [p["id"] for p in load_prompts()] == ["a"]
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="SPECDEC_LITE_DATA"):
        paths.data_dir()


@pytest.mark.slow
def test_non_editable_install_loads_the_default_pair_from_elsewhere(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(ROOT)], check=True, capture_output=True)
    shipped = site / "specdec_lite" / "shipped"
    assert (shipped / "drafts" / "smollm2-135m-eagle-deep-ttt" / "head_config.json").exists()
    assert not list(shipped.rglob("training_state.pt")) and not (shipped / "results").exists()
    code = ("import specdec_lite as sd; from specdec_lite import paths; "
            "target, draft, tok = sd.load_pair(device='cpu'); "
            "head = sd.load_draft('smollm2-135m-medusa', target); "
            "print(sd.__file__, paths.data_dir(), type(draft).__name__, type(head).__name__)")
    env = {k: v for k, v in os.environ.items() if k != paths.DATA_ENV}
    env["PYTHONPATH"] = str(site)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    module_file, data_dir, draft_kind, head_kind = run.stdout.split()
    assert Path(module_file).is_relative_to(site) and Path(data_dir) == shipped
    assert draft_kind == "LlamaForCausalLM" and head_kind == "MedusaDraft"
