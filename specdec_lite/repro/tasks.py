"""Prompt sets (JSONL); chat templating is ``tokenizers.chat_ids`` (imported here for the notebooks).

Format: one JSON object per line with at least ``{"id": str, "task": str, "prompt": str}``; any other field is
kept. ``data/prompts/`` ships 25 prompts per task for code, summarization, dialogue and translation, written
for this project. Any file (or folder of files) in this format can be passed to the notebooks.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..tokenizers import chat_ids  # noqa: F401 (the notebooks and scripts import it from here)
from ..paths import prompts_dir

TASKS = ("code", "summarization", "dialogue", "translation")
REQUIRED = ("id", "task", "prompt")


def load_prompts(path: str | Path | None = None, tasks=None, per_task: int | None = None,
                 skip_per_task: int = 0) -> list[dict]:
    """Prompts from a JSONL file or a folder of them; validated, ids unique. ``tasks``: the tasks the caller knows;
    a file with no prompts, or with a task outside them, is refused. ``per_task``: the first n of each task after
    the first ``skip_per_task`` (which leaves out, say, a benchmark's prompts)."""
    path = Path(path) if path is not None else prompts_dir()
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise FileNotFoundError(f"no prompt file at {path}: give a .jsonl file or a folder of them")
    records = []
    for f in files:
        for number, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{f}:{number}: not valid JSON ({err.msg})") from None
            missing = [k for k in REQUIRED if not isinstance(record.get(k), str) or not record.get(k)]
            if missing:
                raise ValueError(f"{f}:{number}: each line needs non-empty string fields {REQUIRED}; "
                                 f"missing or empty: {missing}")
            records.append(record)
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"prompt ids must be unique; repeated: {sorted({i for i in ids if ids.count(i) > 1})}")
    if not records:
        raise ValueError(f"{path} holds no prompts: each line needs a JSON object with fields {REQUIRED}")
    if tasks is not None:
        unknown = sorted({r["task"] for r in records} - set(tasks))
        if unknown:
            raise ValueError(f"{path} has prompts for tasks {unknown}, which this notebook does not know; "
                             f"use the tasks {list(tasks)} (the 'task' field of each line)")
    return records if per_task is None else first_per_task(records, per_task, skip_per_task)


def by_task(prompts: list[dict]) -> dict[str, list[dict]]:
    """The prompts of each task, in their order, tasks in order of first appearance."""
    grouped = {}
    for p in prompts:
        grouped.setdefault(p["task"], []).append(p)
    return grouped


def first_per_task(prompts: list[dict], n: int, skip: int = 0) -> list[dict]:
    """The first ``n`` prompts of each task after its first ``skip``, tasks in order of first appearance."""
    return [p for chosen in by_task(prompts).values() for p in chosen[skip:skip + n]]
