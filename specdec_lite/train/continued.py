"""The EAGLE head "auto" uses, ``smollm2-135m-eagle-deep-ttt``, continued on more of the target's replies.

That head is the last of a line of runs, each from the head before it (the first from ``notebooks/00_train_heads``;
then on more replies, on replies to requests the target wrote itself, unrolled on its own predictions, grown to two
decoder layers), which ``data/results/heads.csv`` lists with their scores and the commands that train them from
git commit 7635d78. The shipped head keeps that recipe (``heads.py``: the target's last hidden state by teacher
forcing, smooth-L1 on the next feature plus cross-entropy through the target's head, noise on the input features,
unrolled ``UNROLL`` drafting steps on its own predictions: EAGLE-3's training-time test, ``heads.eagle_loss``). A
run here warm-starts from the shipped head's weights and sub-vocabulary (``START``) and trains on every reply
the corpus (``paths.corpus_dir()``) holds at its first start.

It holds out the EAGLE-3 run's replies (``eagle3.heldout_indices``: records the first head never saw) and
``eagle3.HELDOUT_RECORDS`` of the records the shipped head never saw, spread evenly over them (``new_heldout``), or,
on no record newer than the shipped head's, the shipped head's held-out records. It is compared with the shipped
head on its held-out replies by ``eagle3.acceptance`` and replaces it only when better.

    python -m specdec_lite.train.features                                # the features (resumable)
    python -m specdec_lite.train.continued --minutes 40    # resumes exactly (--device cuda --batch-size 64: a GPU)
    python -m specdec_lite.train.continued --publish       # ship it if it is better

On a GPU, ``--device cuda`` extracts the features and trains there (the target in ``--dtype``, float32 for exact
features); ``--batch-size`` (records a step) is fixed at the first start, like ``--steps`` and ``--lr``.

The records used are fixed at the run's first start (``records`` in its ``training_config.json``), so a resumed
run draws the same batches after the corpus has grown. A run lives under the cache folder, ``<cache>/training/<head>``
(head, AdamW's moments and the random states: ``loop.TrainingLoop``): a later run on the same machine resumes it; it
is never committed.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from ..names import EMBEDDED_EAGLE_DEEP_TTT, EMBEDDED_TARGET
from ..core.models import load_model
from ..drafts.heads import read_head_config
from .. import paths
from ..paths import drafts_dir
from ..show import to_markdown
from . import cards, corpus, eagle3, features
from .heads import HeadTrainConfig, HeadTrainer, load_dataset
from .loop import CONFIG_FILE, copy_checkpoint, read_config, run_arguments

NAME = EMBEDDED_EAGLE_DEEP_TTT  # the run, published under this name
START = EMBEDDED_EAGLE_DEEP_TTT  # the shipped head it warm-starts from (and must beat to replace)
PEAK_LR = 5e-4  # the continued runs' peak learning rate, half the first head's (a run may set its own: --lr)
UNROLL = 3  # drafting steps trained on (training-time test) and compared at publishing (eagle3.acceptance)
TRAINED_ELSEWHERE = {EMBEDDED_EAGLE_DEEP_TTT: (
    "--device cuda --dtype float32 --batch-size 64 --steps 6205",
    "on an NVIDIA H200, where the minutes below were measured (the features were extracted there in 33 s); its "
    "`training_state.pt` stayed there, so a later run warm-starts from the committed head")}  # a run made off this
# machine: (its arguments beyond --head, where), for its card


def training_dir(name: str = NAME) -> Path:
    """A run's folder under the cache (``paths.training_dir``): resumed on this machine, never committed."""
    return paths.training_dir(name)


def new_heldout(seen: int, n_records: int) -> list[int]:
    """``eagle3.HELDOUT_RECORDS`` of records ``seen`` to ``n_records`` (those a start that trained on the first
    ``seen`` never saw), evenly spread over them (the corpus appends a family at a time)."""
    count = eagle3.HELDOUT_RECORDS
    if n_records - seen < 2 * count:
        raise ValueError(f"only {n_records - seen} records are new since the head this run starts from; write more "
                         "first (python -m specdec_lite.train.corpus --self-made)")
    every = (n_records - seen) // count
    return list(range(seen, n_records, every))[:count]


def run_config(out_dir: Path, steps: int, corpus_dir: Path | None = None, start_from: str = START,
               unroll: int = 1, lr: float = PEAK_LR, batch_size: int = HeadTrainConfig.batch_size,
               first_record: int = 0) -> HeadTrainConfig:
    """The run's settings: those stored in ``out_dir`` when it resumes, else the first head's recipe at peak
    learning rate ``lr`` (by default half the first head's) and ``batch_size`` records a step, from ``start_from``,
    on every record the corpus has now but the held-out ones: the EAGLE-3 run's, and for a start that is itself a
    continued head, ``new_heldout`` of the records it never saw, or its own held-out records when the corpus has
    none it never saw. With ``unroll`` > 1, training-time test of that many steps. ``first_record`` > 0 trains on
    the records from that one on only (a rehearsal at small scale: ``gpu_train``); the held-out records stay the
    same, and those before it are judged (``compare_heads``) but not evaluated during training."""
    if (out_dir / CONFIG_FILE).exists():
        return read_config(out_dir / CONFIG_FILE, HeadTrainConfig)
    index = corpus.load_index(corpus_dir)
    n = len(index)
    if not 0 <= first_record < n:
        raise ValueError(f"first_record must be in 0..{n - 1} (the corpus has {n} records), got {first_record}")
    start = drafts_dir() / start_from / CONFIG_FILE
    start_cfg = read_config(start, HeadTrainConfig) if start.exists() else None  # None: not a continued head
    if start_cfg and start_cfg.records == n:
        heldout = list(start_cfg.heldout)
    else:
        heldout = eagle3.heldout_indices(n) + (new_heldout(start_cfg.records, n) if start_cfg else [])
    return HeadTrainConfig(steps=steps, lr=lr, warmup=100, eval_every=250, heldout=heldout, start_from=start_from,
                           records=n, unroll=unroll, batch_size=batch_size, first_record=first_record)


def make_trainer(target, out_dir: Path, cfg: HeadTrainConfig, corpus_dir: Path | None = None,
                 features_path: Path | None = None, target_name: str = EMBEDDED_TARGET) -> HeadTrainer:
    """The run's trainer (``cfg``: ``run_config``'s) over its records' features, extracted first where missing
    (resumable); its head has its start's shape."""
    features_path = features_path or features.features_dir(target_name)
    features.extract_features(target, corpus_dir, features_path, target_name, max_records=cfg.records,
                              first_record=cfg.first_record)
    data, _ = load_dataset(features_path, cfg, corpus_dir, max_records=cfg.records, device=target.device)
    return HeadTrainer(target, read_head_config(drafts_dir() / cfg.start_from), data, cfg, out_dir)


def compare_heads(target, trainer: HeadTrainer, name: str, corpus_dir: Path | None = None) -> pd.DataFrame:
    """The head the run started from and the run's head (``name``) on the same held-out replies: one row each."""
    rows = eagle3.heldout_rows(corpus.load_records(corpus_dir), trainer.cfg.heldout, trainer.cfg.max_len)
    heads = {f"{trainer.cfg.start_from} (the start)": drafts_dir() / trainer.cfg.start_from,
             f"{name} (step {trainer.step})": trainer.out_dir}
    table = {label: eagle3.head_acceptance(target, folder, rows, UNROLL) for label, folder in heads.items()}
    return pd.DataFrame.from_dict(table, orient="index").rename_axis("head")


def publish(target, trainer: HeadTrainer, name: str, corpus_dir: Path | None = None) -> pd.DataFrame:
    """Compare the run's head with the one it started from and, when it is better (``eagle3.is_better``: more
    tokens accepted by a chain of ``UNROLL`` drafts at T = 1, a greedy agreement at the first no lower), copy it
    into the drafts folder as ``name`` with its card (both heads' figures); returns the comparison."""
    comparison = compare_heads(target, trainer, name, corpus_dir)
    print(to_markdown(comparison.reset_index()))
    if not eagle3.is_better(comparison):
        print(f"not published: the head at step {trainer.step} does not beat {trainer.cfg.start_from} on the held-out "
              "replies; train on (rerun without --publish)")
        return comparison
    out_dir = copy_checkpoint(trainer.out_dir, drafts_dir() / name)
    index = corpus.load_index(corpus_dir)[trainer.cfg.first_record: trainer.cfg.records]
    arguments, where = TRAINED_ELSEWHERE.get(name, ("", ""))
    command = f"python -m specdec_lite.train.continued --head {name} {arguments}".strip()
    cards.head_card(out_dir, trainer, cards.training_data(index), trained_by=f"`{command}` {where}".strip())
    cards.append_comparison(out_dir, comparison, "`specdec_lite.train.continued.compare_heads`",
                            "the head it started from")
    print(f"published to {out_dir}: load_draft('{name}'), or a tree draft on it with tree_draft(name, target, "
          f"head='{name}')")
    return comparison


def load_target(device: str = "cpu", dtype: str = "auto"):
    """The embedded target where the run trains, in ``dtype``; on a GPU, float32 matrix products run in TF32 from
    here on (the head's: several times float32's speed; the features' and the comparison's too, as in the H200
    run)."""
    target, _ = load_model(EMBEDDED_TARGET, device, dtype)
    if target.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    return target


def main(argv=None):
    args = run_arguments(__doc__, training_dir, 4000, argv, heads=[NAME], lr=PEAK_LR,
                         batch_size=HeadTrainConfig.batch_size)
    out_dir = args.out
    target = load_target(args.device, args.dtype)
    if args.publish:
        publish(target, HeadTrainer.from_checkpoint(target, out_dir, "eagle"), args.head)
        return
    cfg = run_config(out_dir, args.steps, unroll=UNROLL, lr=args.lr, batch_size=args.batch_size)
    trainer = make_trainer(target, out_dir, cfg)
    trainer.run(max_minutes=args.minutes)
    print(trainer.log[-1])


if __name__ == "__main__":
    main()
