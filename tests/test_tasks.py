"""Prompt sets: the shipped ones, the format's validation, and no leakage into the training prompts."""
import json
import re

import pytest

from specdec_lite.repro import tasks
from specdec_lite.train import corpus


def test_shipped_prompt_sets():
    prompts = tasks.load_prompts()
    by_task = {t: [p for p in prompts if p["task"] == t] for t in tasks.TASKS}
    assert all(len(v) >= 25 for v in by_task.values()), {t: len(v) for t, v in by_task.items()}
    assert {p["task"] for p in prompts} == set(tasks.TASKS)
    first = tasks.load_prompts(tasks=tasks.TASKS, per_task=2)
    assert [p["id"] for p in first] == [p["id"] for t in dict.fromkeys(q["task"] for q in prompts)
                                        for p in [q for q in prompts if q["task"] == t][:2]]


def test_empty_files_and_unknown_tasks_are_refused_with_what_to_do(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no prompts: each line needs a JSON object"):
        tasks.load_prompts(empty)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "a", "task": "poetry", "prompt": "x"}) + "\n")
    assert tasks.load_prompts(other)[0]["task"] == "poetry"  # any task, when the caller does not restrict them
    with pytest.raises(ValueError, match=r"tasks \['poetry'\], which this notebook does not know; use the tasks"):
        tasks.load_prompts(other, tasks=tasks.TASKS)


def test_format_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: .*missing or empty: \\['task'\\]"):
        tasks.load_prompts(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="not valid JSON"):
        tasks.load_prompts(bad)
    dup = tmp_path / "dup.jsonl"
    dup.write_text("\n".join(json.dumps({"id": "a", "task": "t", "prompt": "p"}) for _ in range(2)))
    with pytest.raises(ValueError, match="unique"):
        tasks.load_prompts(dup)
    with pytest.raises(FileNotFoundError, match="no prompt file"):
        tasks.load_prompts(tmp_path / "missing.jsonl")


def words(text):
    return re.findall(r"\w+", text.lower())


def ngrams(text, n=8):
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def test_training_prompts_do_not_leak_into_evaluation_prompts(restored_text):
    """No evaluation prompt equals, contains or shares an 8-word run with any prompt used to make training text
    (the template-made ones, and every prompt recorded in the shipped target-made text)."""
    recorded = corpus.load_index(restored_text["target_text"])
    assert len(recorded) == 36_495
    train = {p["prompt"] for p in corpus.training_prompts()} | {e["prompt"] for e in recorded}
    train_grams = set().union(*(ngrams(t) for t in train))
    for p in tasks.load_prompts():
        assert p["prompt"] not in train
        assert not any(p["prompt"] in t or t in p["prompt"] for t in train), p["id"]
        shared = ngrams(p["prompt"]) & train_grams
        assert not shared, (p["id"], sorted(shared)[:3])


def test_first_per_task_keeps_file_order():
    prompts = [{"id": str(i), "task": t, "prompt": "x"} for i, t in enumerate("aabbbab")]
    assert [p["id"] for p in tasks.first_per_task(prompts, 2)] == ["0", "1", "2", "3"]
    assert [p["id"] for p in tasks.first_per_task(prompts, 2, skip=1)] == ["1", "5", "3", "4"]
    assert [p["id"] for p in tasks.first_per_task(prompts, 2, skip=3)] == ["6"]  # only b has a fourth


def test_prompts_outside_the_benchmarks_are_the_next_of_each_task():
    benchmark = tasks.load_prompts(tasks=tasks.TASKS, per_task=5)
    others = tasks.load_prompts(tasks=tasks.TASKS, per_task=5, skip_per_task=5)
    assert len(others) == 20 and not {p["id"] for p in benchmark} & {p["id"] for p in others}
    assert [p["task"] for p in others] == [p["task"] for p in benchmark]
