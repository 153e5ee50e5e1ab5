"""The training text, restored from the repository's history into the cache.

Only retraining reads the training text: the target-made text (``tokens.bin``, ``index.jsonl``,
``self_requests.jsonl``; 36,495 records, 4.5 million reply tokens, 34 MB) and the teacher text (12 MB). It was
tracked under ``data/`` until commit ``TEXT_COMMIT`` and left the tree so that a clone stays light; a training
run reads it from the cache (``paths.corpus_dir()``, ``paths.teacher_dir()``), where this command writes it, in
seconds, from that commit:

    python -m specdec_lite.train.restore        # `make drafts` runs it first

Restored rather than regenerated: the shipped checkpoints were trained on the first records of exactly this text
(their ``training_data.json``), and the target took hours of a 2-core CPU to write it, sampling at T > 0, so a new
run writes other text. Where the history is not at hand, a shallow clone fetches it (``git fetch --unshallow``);
without git, new text is made by ``python -m specdec_lite.train.corpus`` (see its docstring for the commands and
their speed), ``python -m specdec_lite.train.self_prompts`` and ``python -m specdec_lite.train.teacher``.
"""
from __future__ import annotations

import argparse
import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from .. import paths

TEXT_COMMIT = "7635d78fdd8fe6251b80c9b39b48d6e806fbe55a"  # a commit that tracks the shipped training text
REGENERATE = ("without the history, make new text: python -m specdec_lite.train.corpus (templates, --sources, "
              "--self-made), python -m specdec_lite.train.teacher")


def missing_text(folder: Path, what: str) -> FileNotFoundError:
    """The error for training text that is not where a run looks, saying how to get it."""
    return FileNotFoundError(f"no {what} in {folder}: restore the shipped training text with "
                             f"`python -m specdec_lite.train.restore` (from the repository's history, seconds), or "
                             f"{REGENERATE}")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    except FileNotFoundError:
        raise RuntimeError(f"restoring the training text needs git, which is not installed; {REGENERATE}") from None


def check_commit(repo: Path, commit: str = TEXT_COMMIT) -> None:
    """Refuse, before any work, a checkout whose history lacks ``commit`` (a shallow clone, a source archive)."""
    if _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise RuntimeError(f"{repo} does not hold commit {commit[:12]}, which has the training text: in a shallow "
                           f"clone run `git fetch --unshallow` and retry; {REGENERATE}")


def restore_text(commit: str = TEXT_COMMIT) -> dict[str, Path]:
    """Write each training-text folder of ``commit`` to its place in the cache (``paths.training_text_dirs``),
    unless one is there already (a run may have appended to it: it is left as it is). Returns {"target_text":
    where it is, "teacher_text": where it is}."""
    repo = paths.repo_root()
    check_commit(repo, commit)
    places = {}
    for tracked, destination in paths.training_text_dirs().items():
        places[destination.name] = destination
        if (destination / "index.jsonl").exists():
            print(f"{destination} is there already: left as it is")
            continue
        archive = _git(repo, "archive", "--format=tar", commit, tracked)
        if archive.returncode != 0:
            raise RuntimeError(f"git archive {commit[:12]} {tracked} failed: {archive.stderr.decode().strip()}")
        destination.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=destination.parent) as unpacked:  # whole or not at all
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(unpacked, filter="data")
            os.replace(Path(unpacked) / tracked, destination)
        print(f"restored {tracked} of {commit[:12]} to {destination}")
    return places


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default=TEXT_COMMIT, help="the commit to take the text from")
    restore_text(parser.parse_args(argv).commit)


if __name__ == "__main__":
    main()
