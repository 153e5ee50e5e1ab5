"""The training loop shared by the standalone draft and the heads.

``TrainingLoop(model, loss, sample, evaluate, cfg, save, out_dir).run()`` trains ``model`` with AdamW, a linear
warm-up and cosine decay of the learning rate, and gradient-norm clipping. Every ``eval_every`` steps (and at the
last step) it evaluates on held-out data and appends a log entry; every ``checkpoint_every`` steps (and at the
end) it calls ``save()`` and writes the log to ``out_dir/training_log.jsonl``. With ``keep_state`` it also writes
``out_dir/training_state.pt`` (float32 weights, optimizer, step, log, random states), from which a new loop over
the same folder resumes exactly where the old one stopped. ``max_minutes`` bounds one call of ``run``: when it
is spent the loop evaluates, saves and returns. ``read_log`` and ``read_config`` read a finished checkpoint's
log and settings back, ``require_checkpoint`` refuses an incomplete folder saying what to do, and
``copy_checkpoint`` copies a checkpoint elsewhere (reading its source only).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch

from ..tuning.devices import DTYPE_HELP

STATE_FILE = "training_state.pt"
LOG_FILE = "training_log.jsonl"
CONFIG_FILE = "training_config.json"


@dataclass
class LoopConfig:
    steps: int  # optimizer steps in all (the schedule's length)
    lr: float  # peak AdamW learning rate
    warmup: int = 100  # linear warm-up steps, then cosine decay to 0 at ``steps``
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    clip: float = 1.0  # gradient-norm clipping
    eval_every: int = 100  # held-out evaluation (and a log entry) every this many steps
    checkpoint_every: int | None = None  # save every this many steps (None: at every evaluation)
    max_minutes: float | None = None  # stop one ``run`` after this many minutes (None: no limit)
    seed: int = 0  # seeds the batch generator, when the caller gives none, and torch (seed + step on a warm start)

    @classmethod
    def of(cls, cfg, betas: tuple[float, float], max_minutes: float | None = None) -> "LoopConfig":
        """From a model's training config (its steps, lr, warmup, weight_decay, eval_every, seed)."""
        return cls(steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup, weight_decay=cfg.weight_decay, betas=betas,
                   eval_every=cfg.eval_every, max_minutes=max_minutes, seed=cfg.seed)


def heldout_split(n: int, fraction: float, generator: torch.Generator) -> tuple[list[int], list[int]]:
    """(held-out, training) record indices: a random permutation of range(n), its first max(1, n * fraction) held
    out. ``generator`` is advanced by the permutation."""
    perm = torch.randperm(n, generator=generator).tolist()
    n_held = max(1, int(n * fraction))
    return perm[:n_held], perm[n_held:]


def mean_over_chunks(rows: list[int], size: int, metrics_of: Callable[[list[int]], dict]) -> dict:
    """The mean, over consecutive chunks of ``size`` rows, of the metrics dict ``metrics_of(chunk)`` returns (each
    chunk weighs the same): the held-out evaluation of the draft and of the heads."""
    chunks = [rows[i: i + size] for i in range(0, len(rows), size)]
    totals: dict = {}
    for chunk in chunks:
        for k, v in metrics_of(chunk).items():
            totals[k] = totals.get(k, 0.0) + float(v)
    return {k: v / len(chunks) for k, v in totals.items()}


def warmup_cosine(step: int, warmup: int, steps: int) -> float:
    """Learning-rate factor at ``step``: linear warm-up over ``warmup`` steps, cosine decay to 0 at ``steps``."""
    return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


def write_log(path: Path, log: list[dict]) -> None:
    """One JSON object per line."""
    Path(path).write_text("\n".join(json.dumps(e) for e in log) + "\n")


def write_config(path: Path, cfg) -> None:
    """A training config dataclass as indented JSON (``training_config.json``)."""
    Path(path).write_text(json.dumps(asdict(cfg), indent=1) + "\n")


def read_log(path: Path) -> list[dict]:
    """The entries of a ``training_log.jsonl`` (none when there is no such file)."""
    path = Path(path)
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def read_config(path: Path, cls):
    """A training config dataclass ``cls`` from its ``training_config.json`` (as ``write_config`` wrote it)."""
    values = json.loads(Path(path).read_text())
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{path} has settings {cls.__name__} does not know: {unknown}")
    return cls(**values)


def require_checkpoint(out_dir: Path, files, what: str) -> Path:
    """``out_dir``, after checking that it holds every file of a finished checkpoint; else a FileNotFoundError
    that names the missing files and what to do."""
    out_dir = Path(out_dir)
    missing = [f for f in files if not (out_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{out_dir} is not a finished {what} checkpoint: missing {', '.join(missing)}. Train it first "
            "(the training notebook with retrain = True), or restore the shipped one "
            "(git checkout -- data/drafts/<name>)")
    return out_dir


def copy_checkpoint(source: Path, out_dir: Path) -> Path:
    """Copy the files of a checkpoint folder into ``out_dir`` (nothing when both are the same folder); the source
    is only read, and a ``training_state.pt`` in ``out_dir`` (of whatever was there) is removed. Returns
    ``out_dir``. A smoke run reuses a shipped checkpoint this way without writing to it."""
    source, out_dir = Path(source), Path(out_dir)
    if not source.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {source}: train it first (retrain = True) or restore it "
                                "(git checkout -- data/drafts/<name>)")
    if out_dir.resolve() != source.resolve():
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / STATE_FILE).unlink(missing_ok=True)
        for f in source.iterdir():
            if f.is_file() and f.name != STATE_FILE:
                shutil.copyfile(f, out_dir / f.name)
    return out_dir


class TrainingLoop:
    """Trains ``model`` on ``loss(sample(generator))``; ``evaluate()`` returns held-out metrics (a dict, run in
    eval mode without gradients); ``save()`` writes the caller's checkpoint. ``step`` and ``log`` may be set
    before ``run`` for a warm start; ``resume()`` loads them (and everything else) from ``training_state.pt``."""

    def __init__(self, model: torch.nn.Module, loss: Callable[[Any], torch.Tensor],
                 sample: Callable[[torch.Generator], Any], evaluate: Callable[[], dict], cfg: LoopConfig,
                 save: Callable[[], None], out_dir: Path, keep_state: bool = False,
                 generator: torch.Generator | None = None, desc: str = "training"):
        self.model, self.loss_fn, self.sample, self.evaluate_fn = model, loss, sample, evaluate
        self.cfg, self.save_fn, self.out_dir, self.keep_state = cfg, save, Path(out_dir), keep_state
        self.generator, self.desc = generator, desc
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     betas=cfg.betas)
        self.step, self.log = 0, []

    @property
    def state_path(self) -> Path:
        return self.out_dir / STATE_FILE

    def resume(self) -> bool:
        """Load ``training_state.pt`` when there is one; True if it was there. Says where it looked and what it
        found."""
        if not self.state_path.exists():
            print(f"{self.desc}: no training state at {self.state_path}: starting from step 0")
            return False
        saved = torch.load(self.state_path, weights_only=False, map_location="cpu")  # copied to the model's device
        self.model.load_state_dict(saved["model"] if "model" in saved else saved["head"])  # "head": older files
        self.opt.load_state_dict(saved["optimizer"])
        self.step, self.log = saved["step"], saved["log"]
        if "generator" in saved:  # older files have no random states: the batches restart from seed + step
            self.generator = torch.Generator()
            self.generator.set_state(saved["generator"])
            torch.set_rng_state(saved["torch_rng"])
        if saved.get("cuda_rng") is not None and torch.cuda.is_available():  # a run on a GPU draws its noise there
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        print(f"{self.desc}: resuming from {self.state_path} at step {self.step}")
        return True

    def checkpoint(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.save_fn()
        write_log(self.out_dir / LOG_FILE, self.log)
        if self.keep_state:
            torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step,
                        "log": self.log, "generator": self.generator.get_state(),
                        "torch_rng": torch.get_rng_state(),
                        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None},
                       self.state_path)

    def evaluate(self) -> dict:
        self.model.eval()
        with torch.no_grad():
            metrics = self.evaluate_fn()
        self.model.train()
        return metrics

    def run(self, progress: bool = True) -> list[dict]:
        """Train up to ``cfg.steps`` (or until ``cfg.max_minutes`` are spent); returns the log."""
        from ..show import progress_bar

        cfg = self.cfg
        if self.generator is None:  # a first start (a resumed run has the saved random states)
            self.generator = torch.Generator().manual_seed(cfg.seed + self.step)
            torch.manual_seed(cfg.seed + self.step)  # the loss's own draws (the heads' feature noise)
        run_started = time.monotonic()
        started = run_started - 60 * (self.log[-1]["minutes"] if self.log else 0.0)  # cumulative on resume
        checkpoint_every = cfg.checkpoint_every or cfg.eval_every
        self.model.train()
        bar = progress_bar(total=cfg.steps, initial=self.step, desc=self.desc, disable=not progress)
        while self.step < cfg.steps:
            for group in self.opt.param_groups:
                group["lr"] = cfg.lr * warmup_cosine(self.step, cfg.warmup, cfg.steps)
            loss = self.loss_fn(self.sample(self.generator))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip)
            self.opt.step()
            self.step += 1
            bar.update(1)
            out_of_time = cfg.max_minutes is not None and time.monotonic() - run_started > 60 * cfg.max_minutes
            last = self.step == cfg.steps or out_of_time
            if self.step % cfg.eval_every == 0 or last:
                self.log.append({"step": self.step, "train_loss": loss.item(), **self.evaluate(),
                                 "minutes": (time.monotonic() - started) / 60})
                bar.set_postfix({k: f"{v:.3f}" for k, v in self.log[-1].items() if "agreement" in k})
            if self.step % checkpoint_every == 0 or last:
                self.checkpoint()
            if out_of_time:
                break
        bar.close()
        self.model.eval()
        return self.log


def run_arguments(description: str, default_out, steps: int, argv=None, heads=None,
                  lr: float | None = None, batch_size: int | None = None) -> argparse.Namespace:
    """The command line of a resumable training run that ships its model when it beats the shipped one: --out,
    --minutes, --steps, --threads (applied here) and --publish; with ``heads`` (the runs' names, the default
    first) also --head, and ``default_out`` is then a function of the head's name; with ``lr`` (the recipe's peak
    learning rate) also --lr; with ``batch_size`` (the recipe's) also --batch-size, --device and --dtype (where
    the target loads and trains: a larger batch is for a GPU). Publishing compares on the CPU."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if heads:
        parser.add_argument("--head", choices=heads, default=heads[0], help=f"the run (default {heads[0]})")
    where = default_out(heads[0]) if heads else default_out
    parser.add_argument("--out", default=None, help=f"checkpoint folder (default {where})")
    parser.add_argument("--minutes", type=float, default=None, help="stop (evaluated and saved) after this long")
    parser.add_argument("--steps", type=int, default=steps, help="the schedule's length (fixed at the first start)")
    if lr is not None:
        parser.add_argument("--lr", type=float, default=lr, help=f"the peak learning rate (fixed at the first start; "
                                                                 f"default {lr})")
    if batch_size is not None:
        parser.add_argument("--batch-size", type=int, default=batch_size,
                            help=f"records a step (fixed at the first start; default {batch_size})")
        parser.add_argument("--device", default="cpu", help="where the target loads and the training runs")
        parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--publish", action="store_true",
                        help="no training: compare the checkpoint with the head it must beat and ship it if it is "
                             "better")
    args = parser.parse_args(argv)
    if args.publish and getattr(args, "device", "cpu") != "cpu":
        parser.error("--publish compares the heads on the CPU: leave out --device")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out = Path(args.out) if args.out else (default_out(args.head) if heads else default_out)
    return args
