"""EAGLE heads continued on more of the target's replies, each run starting from the head before it.

The first head (``notebooks/00_train_heads.ipynb``) learned from 329k reply tokens to template-made instructions.
The EAGLE-3-style head (``eagle3.py``) saw more text, but most of it teacher-forced code and documentation, and the
trees draft fewer tokens a round on it (docs/SPEED.md). The runs here keep the first head's architecture and recipe
(``heads.py``: the target's last hidden state by teacher forcing, smooth-L1 on the next feature plus cross-entropy
through the target's head, noise on the input features), start from the weights and sub-vocabulary of the head
before (``STARTS``), and train on replies in ``data/target_text`` the corpus held at their first start:

    smollm2-135m-eagle-replies  from the first head, on the replies to the templates and to the harvested prompts
                                of the four tasks (``corpus.py --sources``)
    smollm2-135m-eagle-self     from that head, on those and the replies to the requests the target wrote itself
                                (``self_prompts.py``), which read like the evaluation's prompts
    smollm2-135m-eagle-ttt      from that head, on the replies to the target's own requests only (those it saw
                                and the newer ones), unrolled ``UNROLL`` drafting steps on its own predictions
                                (EAGLE-3's training-time test, ``heads.eagle_loss``), not teacher-forced only
    smollm2-135m-eagle-ttt2     from that head, the same way, on every reply to the target's own requests written
                                since (about a fifth more)
    smollm2-135m-eagle-deep     from smollm2-135m-eagle-self grown to two decoder layers (the second starts as the
                                identity, so the run begins from that head's predictions), teacher-forced as it
                                was, on every reply to the target's own requests: more of the same text did not
                                move the one-layer heads, so this tries more capacity
    smollm2-135m-eagle-deep-ttt from that head, unrolled on its own predictions, on every reply the corpus holds
                                (the held-out ones of its start aside), at a batch a GPU affords
                                (``--device cuda --batch-size 64``)

Each holds out the EAGLE-3 run's replies (``eagle3.heldout_indices``: records the first head never saw); a later
run also holds out ``eagle3.HELDOUT_RECORDS`` of the records its start never saw, spread evenly over them
(``new_heldout``), and a run on no record newer than its start's holds out its start's held-out records. A run is
compared with its start on its held-out replies by ``eagle3.acceptance``.

    python -m specdec_lite.train.features --corpus data/target_text      # the features (resumable)
    python -m specdec_lite.train.continued --head smollm2-135m-eagle-self --minutes 40   # resumes exactly
    python -m specdec_lite.train.continued --head smollm2-135m-eagle-self --publish      # ship it if it is better

On a GPU, ``--device cuda`` extracts the features and trains there (the target in ``--dtype``, float32 for exact
features); ``--batch-size`` (records a step) is fixed at the first start, like ``--steps`` and ``--lr``.

The records used are fixed at the run's first start (``records`` in its ``training_config.json``), so a resumed
run draws the same batches after the corpus has grown. A run lives under the cache folder, ``<cache>/training/<head>``
(head, AdamW's moments and the random states: ``loop.TrainingLoop``): a later run on the same machine resumes it; it
is never committed.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from ..core.models import (EMBEDDED_EAGLE, EMBEDDED_EAGLE_DEEP, EMBEDDED_EAGLE_DEEP_TTT,
                           EMBEDDED_EAGLE_REPLIES, EMBEDDED_EAGLE_SELF, EMBEDDED_EAGLE_TTT, EMBEDDED_EAGLE_TTT2,
                           EMBEDDED_TARGET, load_model)
from ..drafts.heads import read_head_config
from .. import paths
from ..paths import drafts_dir
from ..show import to_markdown
from . import cards, corpus, eagle3, features
from .heads import HeadTrainConfig, HeadTrainer, load_dataset
from .loop import CONFIG_FILE, copy_checkpoint, read_config, run_arguments

STARTS = {EMBEDDED_EAGLE_REPLIES: EMBEDDED_EAGLE, EMBEDDED_EAGLE_SELF: EMBEDDED_EAGLE_REPLIES,
          EMBEDDED_EAGLE_TTT: EMBEDDED_EAGLE_SELF, EMBEDDED_EAGLE_TTT2: EMBEDDED_EAGLE_TTT,
          EMBEDDED_EAGLE_DEEP: EMBEDDED_EAGLE_SELF, EMBEDDED_EAGLE_DEEP_TTT: EMBEDDED_EAGLE_DEEP}  # head: its start
NAME = EMBEDDED_EAGLE_DEEP_TTT  # the newest run
PEAK_LR = 5e-4  # the continued runs' peak learning rate, half the first head's (a run may set its own: --lr)
UNROLL = 3  # drafting steps compared at publishing (eagle3.acceptance), and trained on by the unrolled runs
UNROLLED = {EMBEDDED_EAGLE_TTT, EMBEDDED_EAGLE_TTT2, EMBEDDED_EAGLE_DEEP_TTT}  # trained with training-time test
SELF_MADE_ONLY = {EMBEDDED_EAGLE_TTT, EMBEDDED_EAGLE_TTT2, EMBEDDED_EAGLE_DEEP}  # the runs on the replies to the
# target's own requests only: their start has trained on the text before them, whose features would take far longer
# to extract on a CPU
TRAINED_ELSEWHERE = {EMBEDDED_EAGLE_DEEP_TTT: (
    "--device cuda --dtype float32 --batch-size 64 --steps 6205",
    "on an NVIDIA H200, where the minutes below were measured (the features were extracted there in 33 s); its "
    "`training_state.pt` stayed there, so a later run warm-starts from the committed head")}  # a run made off this
# machine: (its arguments beyond --head, where), for its card
LAYERS = {EMBEDDED_EAGLE_DEEP: 2}  # decoder layers of a run that grows its start (the others keep its one)


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


def run_config(out_dir: Path, steps: int, corpus_dir: Path | None = None, start_from: str = EMBEDDED_EAGLE,
               unroll: int = 1, lr: float = PEAK_LR, self_made_only: bool = False,
               batch_size: int = HeadTrainConfig.batch_size) -> HeadTrainConfig:
    """The run's settings: those stored in ``out_dir`` when it resumes, else the first head's recipe at peak
    learning rate ``lr`` (by default half the first head's) and ``batch_size`` records a step, from ``start_from``,
    on every record the corpus has now but the held-out ones: the EAGLE-3 run's, and for a start that is itself a
    continued head, ``new_heldout`` of the records it never saw, or its own held-out records when the corpus has
    none it never saw. With ``unroll`` > 1, training-time test of that many steps. With ``self_made_only``
    (``SELF_MADE_ONLY``), on the replies to the target's own requests only (from the first of them on)."""
    if (out_dir / CONFIG_FILE).exists():
        return read_config(out_dir / CONFIG_FILE, HeadTrainConfig)
    index = corpus.load_index(corpus_dir)
    n = len(index)
    start = drafts_dir() / start_from / CONFIG_FILE
    start_cfg = read_config(start, HeadTrainConfig) if start.exists() else None  # None: not a continued head
    if start_cfg and start_cfg.records == n:
        heldout = list(start_cfg.heldout)
    else:
        heldout = eagle3.heldout_indices(n) + (new_heldout(start_cfg.records, n) if start_cfg else [])
    first = corpus.first_self_made(index) if self_made_only else 0
    return HeadTrainConfig(steps=steps, lr=lr, warmup=100, eval_every=250, heldout=heldout, start_from=start_from,
                           records=n, unroll=unroll, first_record=first, batch_size=batch_size)


def make_trainer(target, out_dir: Path, cfg: HeadTrainConfig, corpus_dir: Path | None = None,
                 features_path: Path | None = None, target_name: str = EMBEDDED_TARGET,
                 num_layers: int | None = None) -> HeadTrainer:
    """The run's trainer (``cfg``: ``run_config``'s) over its records' features, extracted first where missing
    (resumable); with ``num_layers``, its head has that many decoder layers (its start's first ones, then new ones
    that begin as the identity), else as many as its start's."""
    features_path = features_path or features.features_dir(target_name)
    features.extract_features(target, corpus_dir, features_path, target_name, max_records=cfg.records,
                              first_record=cfg.first_record)
    data, _ = load_dataset(features_path, cfg, corpus_dir, max_records=cfg.records, device=target.device)
    head_cfg = read_head_config(drafts_dir() / cfg.start_from)
    if num_layers is not None:
        head_cfg = replace(head_cfg, num_layers=num_layers)
    return HeadTrainer(target, head_cfg, data, cfg, out_dir)


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
    cards.head_card(out_dir, trainer, index, trained_by=f"`{command}` {where}".strip())
    cards.append_comparison(out_dir, comparison, "`specdec_lite.train.continued.compare_heads`",
                            "the head it started from")
    print(f"published to {out_dir}: load_draft('{name}'), or a tree draft on it with tree_draft(name, target, "
          f"head='{name}')")
    return comparison


def main(argv=None):
    args = run_arguments(__doc__, training_dir, 4000, argv, heads=[NAME, *sorted(set(STARTS) - {NAME})], lr=PEAK_LR,
                         batch_size=HeadTrainConfig.batch_size)
    out_dir = args.out
    target, _ = load_model(EMBEDDED_TARGET, args.device, args.dtype)
    if target.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the head's products in TF32: several times float32's speed
    if args.publish:
        publish(target, HeadTrainer.from_checkpoint(target, out_dir, "eagle"), args.head)
        return
    unroll = UNROLL if args.head in UNROLLED else 1
    cfg = run_config(out_dir, args.steps, start_from=STARTS[args.head], unroll=unroll, lr=args.lr,
                     self_made_only=args.head in SELF_MADE_ONLY, batch_size=args.batch_size)
    trainer = make_trainer(target, out_dir, cfg, num_layers=LAYERS.get(args.head))
    trainer.run(max_minutes=args.minutes)
    print(trainer.log[-1])


if __name__ == "__main__":
    main()
