"""The dynamic tree's costs: measured in several passes with their spread, kept per machine and setting in a JSON
profile (``instruments.cost_profiles``), read back by a later build, measured again when the file is damaged or asked to."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec_lite as sd
from specdec_lite.instruments import cost_profiles
from specdec_lite.core.lm import use_static_cache
from specdec_lite.drafts import trees
from specdec_lite.drafts.trees import dynamic_tree_profile_key, measured_dynamic_tree

from conftest import tiny_llama
from test_heads import random_head_draft

SMALL = dict(max_depth=3, repeats=2, passes=3, tokens=(1, 2, 8))  # a quick measurement
PROMPT = torch.tensor([[5, 9, 11, 3, 7]])


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """The cost profiles folder of a fresh cache."""
    monkeypatch.setenv("SPECDEC_LITE_CACHE", str(tmp_path))
    # a tiny model's timings spread widely on a busy machine: these tests keep them (the refusal of a noisy
    # measurement has its own test)
    monkeypatch.setattr(cost_profiles, "MAX_SPREAD", float("inf"))
    return tmp_path / "cost_profiles"


def build(target, top_k=2, **options):
    return measured_dynamic_tree(random_head_draft(target, "eagle3"), target, top_k=top_k, **{**SMALL, **options})


def drafted_tree(drafter, target):
    """The tree ``drafter`` proposes after the target's forward over ``PROMPT``, as (tokens, parents) lists."""
    lm = sd.HFCausalLM(target)
    lm.reset(1)
    _, hidden = lm.feed(PROMPT[:, :-1], hidden_layers=drafter.feature_layers)
    drafter.begin(PROMPT)
    drafter.observe(hidden, 0)
    tree = drafter.propose_tree(PROMPT, torch.tensor([PROMPT.shape[1]]), 4, sd.SamplingParams(temperature=0), None)
    return tree.tokens.tolist(), tree.parents.tolist()


def test_a_second_build_reads_the_profile_instead_of_timing(profiles, monkeypatch, capsys):
    """The first build measures (3 passes: each cost the median over them, its [min, median, max] kept) and saves
    the profile; a second with the same key reads the file, saying so, without timing anything, and has the same
    costs, so the same budget decisions and trees; ``remeasure=True`` times again."""
    target = tiny_llama(vocab=64, seed=0)
    first = build(target)
    costs = first.costs
    assert costs["source"] == "measured" and costs["passes"] == 3
    assert list(profiles.iterdir()) == [Path(costs["file"])]  # one file, no temporary left behind
    assert set(costs["spread"]["v"]) == {1, 2, 8} and costs["spread"]["v"][1] == [1.0, 1.0, 1.0]
    for n, (low, median, high) in costs["spread"]["v"].items():
        assert low <= median <= high and median == costs["v"][n]
    low, median, high = costs["spread"]["head_cost"]
    assert 0 < low <= median <= high and median == first.head_cost
    assert f"saved as {Path(costs['file']).name} in paths.cost_profiles_dir()" in capsys.readouterr().out
    assert costs["cpus"] == os.cpu_count() and costs["load_average"] >= 0 and costs["measured_at"]

    def no_timing(*args, **kwargs):
        raise AssertionError("timed again although the profile is kept")

    monkeypatch.setattr(trees, "forward_seconds", no_timing)
    monkeypatch.setattr(trees, "round_seconds", no_timing)
    second = build(target)
    assert second.costs["source"] == "read" and second.costs["file"] == costs["file"]
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and f"read from {costs['file']}" in printed
    assert {**second.costs, "source": "measured"} == costs
    assert second.head_cost == first.head_cost
    assert [second.verify_cost(n) for n in range(1, 70)] == [first.verify_cost(n) for n in range(1, 70)]
    assert drafted_tree(second, target) == drafted_tree(first, target)
    with pytest.raises(AssertionError, match="timed again"):
        build(target, remeasure=True)


def test_the_profile_is_keyed_by_what_changes_the_costs(profiles):
    """A different dtype, top_k or KV cache is another key and another file; the same settings the same."""
    target = tiny_llama(vocab=64, seed=0)
    eagle = random_head_draft(target, "eagle3")
    key = dynamic_tree_profile_key(eagle, target, 2, **SMALL)
    assert key == dynamic_tree_profile_key(random_head_draft(target, "eagle3"), target, 2, **SMALL)
    machine = key["machine"]
    assert machine["processor"] and machine["threads"] == torch.get_num_threads() and machine["device"] == "cpu"
    assert (machine["dtype"], machine["cache"], machine["torch"]) == ("float32", "dynamic", torch.__version__)
    half = tiny_llama(vocab=64, seed=0).to(torch.bfloat16)
    other_keys = {"bfloat16": dynamic_tree_profile_key(random_head_draft(half, "eagle3"), half, 2, **SMALL),
                  "top_k 3": dynamic_tree_profile_key(eagle, target, 3, **SMALL)}
    static = use_static_cache(tiny_llama(vocab=64, seed=0), max_length=128)
    other_keys["static cache"] = dynamic_tree_profile_key(random_head_draft(static, "eagle3"), static, 2, **SMALL)
    assert other_keys["bfloat16"]["machine"]["dtype"] == "bfloat16"
    assert other_keys["static cache"]["machine"]["cache"] == "static, 128 tokens"
    path = cost_profiles.profile_path("dynamic-tree", key)
    assert path.parent == profiles
    others = {cost_profiles.profile_path("dynamic-tree", k) for k in other_keys.values()}
    assert len(others) == 3 and path not in others
    first, wider = build(target), build(target, top_k=3)
    assert wider.costs["source"] == "measured" and wider.costs["file"] != first.costs["file"]
    assert len(list(profiles.glob("*.json"))) == 2


@pytest.mark.parametrize("damage", ["truncated", "other format", "malformed spread"])
def test_a_damaged_or_other_version_profile_is_measured_again(profiles, capsys, damage):
    """A file that is not JSON, one of another format, or one whose spread is not [min, median, max] is measured
    again, saying why, and replaced by a good one that the next build reads."""
    target = tiny_llama(vocab=64, seed=0)
    path = Path(build(target).costs["file"])
    saved = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text(path.read_text()[:100])
    elif damage == "other format":
        path.write_text(json.dumps({**saved, "format": cost_profiles.FORMAT + 1}))
    else:
        saved["costs"]["spread"]["head_cost"] = [3.0, 2.0, 1.0]
        path.write_text(json.dumps(saved))
    capsys.readouterr()
    again = build(target)
    assert again.costs["source"] == "measured" and again.costs["file"] == str(path)
    why = {"truncated": "is unreadable (JSONDecodeError", "other format": f"has format {cost_profiles.FORMAT + 1}",
           "malformed spread": "holds malformed costs (ValueError: a spread must be [min, median, max]"}[damage]
    assert why in capsys.readouterr().out
    assert json.loads(path.read_text())["format"] == cost_profiles.FORMAT
    assert build(target).costs["source"] == "read"


def test_a_profile_measured_on_a_busy_machine_says_so():
    """Costs timed while other work shared the cores (a load average above the CPU count) come with a warning."""
    assert "busy then, load average 6.8 on 2 CPUs" in cost_profiles.busy_note({"load_average": 6.8, "cpus": 2})
    assert cost_profiles.busy_note({"load_average": 1.5, "cpus": 2}) == ""
    assert cost_profiles.busy_note({"load_average": None, "cpus": 2}) == ""


def test_a_noisy_measurement_is_used_but_not_kept_saying_so(tmp_path, monkeypatch, capsys):
    """Passes that differ by more than MAX_SPREAD of their median: the costs serve this build, no file is written,
    and the line says why; a steady measurement is kept."""
    monkeypatch.setenv("SPECDEC_LITE_CACHE", str(tmp_path))

    def measured(step_spread):
        return lambda: {"x": 1.0, "spread": {"target_step_seconds": step_spread, "v": {1: [1.0, 1.0, 1.0]}}}

    parse = lambda saved: {"x": saved["x"]}  # noqa: E731
    noisy = cost_profiles.kept_or_measured("test", {"k": 1}, measured([0.010, 0.020, 0.031]), parse)
    assert noisy["file"] is None and not (tmp_path / "cost_profiles").exists()
    assert "not kept: target_step_seconds ranged from 0.01 to 0.031" in capsys.readouterr().out
    steady = cost_profiles.kept_or_measured("test", {"k": 1}, measured([0.020, 0.021, 0.022]), parse)
    assert steady["file"] is not None and Path(steady["file"]).exists()


def test_shipped_defaults_serve_every_run_alike_until_a_calibration_is_kept(profiles, monkeypatch, capsys):
    """With defaults for this device class (a head folder's DEFAULT_COSTS), nothing is timed on load: two builds
    use the same costs and draft the same trees, saying the defaults serve; defaults for another class do not apply
    (the first load measures); remeasure=True (calibrate) keeps this machine's costs, which later builds read. A
    compiled target (a class of its own) without costs shipped for its class drafts with its device's eager ones."""
    target = tiny_llama(vocab=64, seed=0)
    measured = build(target).costs
    saved = json.loads(Path(measured["file"]).read_text())["costs"]
    Path(measured["file"]).unlink()
    default = {**saved, "v": {**saved["v"], "2": 9.0}}  # unlike what this machine measured: visibly the default
    default["spread"] = {**saved["spread"], "v": {**saved["spread"]["v"], "2": [9.0, 9.0, 9.0]}}
    assert trees.device_class(target) == "cpu-float32"
    assert trees.device_class(use_static_cache(tiny_llama(vocab=64, seed=0), compile=True)) == "cpu-float32-compiled"
    capsys.readouterr()

    def no_timing(*args, **kwargs):
        raise AssertionError("timed although defaults serve")

    with monkeypatch.context() as patch:
        patch.setattr(trees, "forward_seconds", no_timing)
        patch.setattr(trees, "round_seconds", no_timing)
        first, second = (build(target, defaults={"cpu-float32": default}) for _ in range(2))
    assert first.costs["source"] == second.costs["source"] == "default" and first.costs["v"][2] == 9.0
    assert "shipped defaults for cpu-float32" in capsys.readouterr().out
    assert drafted_tree(first, target) == drafted_tree(second, target)
    assert not list(profiles.glob("*.json"))
    assert build(target, defaults={"cuda-bfloat16": default}).costs["source"] == "measured"
    calibrated = build(target, defaults={"cpu-float32": default}, remeasure=True).costs
    assert calibrated["source"] == "measured" and calibrated["v"][2] != 9.0
    assert build(target, defaults={"cpu-float32": default}).costs["source"] == "read"
    compiled = use_static_cache(tiny_llama(vocab=64, seed=0), compile=True)  # no costs shipped for its own class
    with monkeypatch.context() as patch:
        patch.setattr(trees, "forward_seconds", no_timing)
        patch.setattr(trees, "round_seconds", no_timing)
        eager_defaults = build(compiled, defaults={"cpu-float32": default}).costs
    assert eager_defaults["source"] == "default" and eager_defaults["v"][2] == 9.0


def test_calibrate_keeps_this_machines_costs_and_ships_them_per_kind_of_device(profiles, tmp_path, monkeypatch):
    """sd.calibrate measures the dynamic tree's costs for the target's EAGLE head and keeps them, so "dynamic-tree"
    reads them; with ship=True they also become the head's defaults for this device class (processor named), which
    a machine without a kept profile drafts with."""
    from specdec_lite import paths
    from specdec_lite.drafts import heads

    target = tiny_llama(vocab=64, seed=0)
    draft = random_head_draft(target, "eagle")
    folder = tmp_path / "data" / "drafts" / "tiny-eagle"
    heads.save_head(draft.head, draft.cfg, None, folder)
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "data"))
    costs = sd.calibrate(target, ship=True)
    assert costs["source"] == "measured" and Path(costs["file"]).exists()
    shipped = json.loads((folder / trees.DEFAULT_COSTS).read_text())
    assert list(shipped) == ["cpu-float32"] and shipped["cpu-float32"]["processor"]
    assert shipped["cpu-float32"]["v"] == {str(n): v for n, v in costs["v"].items()}
    assert sd.load_draft("dynamic-tree", target).costs["source"] == "read"
    Path(costs["file"]).unlink()  # another machine of this kind, never calibrated: the shipped defaults
    assert sd.load_draft("dynamic-tree", target).costs["source"] == "default"


AUTO_TREES = """
import json
import specdec_lite as sd
from specdec_lite.tokenizers import chat_ids
target, draft, tokenizer = sd.load_pair(draft="auto")
runs = []
for text in ("Write a Python function that checks whether a number is prime.", "Say hello to a new colleague."):
    out = sd.speculative_generate(target, draft, chat_ids(tokenizer, text, target.device), max_new_tokens=24,
                                  sampling=sd.SamplingParams(temperature=0), ignore_eos=True)
    runs.append([out.tokens.tolist(), out.stats.proposed_lengths, out.stats.tree_depths])
print(json.dumps(runs))
"""


def test_two_processes_draft_the_same_trees_for_the_same_prompts():
    """``auto`` on the embedded target in its default dtype, greedy, two prompts, in two processes one after the
    other on the same cache folder: the same trees (nodes and depth of every round) and the same tokens. The tree
    sizes come from shipped or kept costs, never from a measurement made on the way (``drafts.loading``)."""
    runs = [subprocess.run([sys.executable, "-c", AUTO_TREES], capture_output=True, text=True, check=True)
            for _ in range(2)]
    first, second = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert all(len(tokens) == 24 and depths for tokens, _, depths in first), first  # trees were really drafted
    assert first == second
