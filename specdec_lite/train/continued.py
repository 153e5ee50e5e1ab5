"""The first EAGLE head, continued on every reply the target has written.

The first head (``notebooks/00_train_heads.ipynb``) learned from 329k reply tokens to template-made instructions.
The EAGLE-3-style head (``eagle3.py``) saw more text, but most of it teacher-forced code and documentation, and the
trees draft fewer tokens a round on it (docs/SPEED.md). This run keeps the first head's architecture and recipe
(``heads.py``: the target's last hidden state by teacher forcing, smooth-L1 on the next feature plus cross-entropy
through the target's head, noise on the input features), starts from its weights and sub-vocabulary, and trains
on all the target's replies in ``data/target_text`` (the templates, and the harvested prompts of the four tasks,
``corpus.py --sources``). It holds out the same replies as the EAGLE-3 run (``eagle3.heldout_indices``: records
the first head never saw), so the heads are compared on the same text by the same function
(``eagle3.acceptance``).

    python -m specdec_lite.train.features --corpus data/target_text   # the features (resumable)
    python -m specdec_lite.train.continued --minutes 40               # resumes exactly: rerun to continue
    python -m specdec_lite.train.continued --publish                  # ship it if it beats the first head

The records used are fixed at the run's first start (``records`` in its ``training_config.json``), so a resumed
run draws the same batches after the corpus has grown. The run lives in ``data/training/<name>`` (head, AdamW's
moments and the random states: ``loop.TrainingLoop``), committed so a clone resumes it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.models import EMBEDDED_EAGLE, EMBEDDED_EAGLE_REPLIES, EMBEDDED_TARGET, load_model
from ..drafts.heads import read_head_config
from ..paths import drafts_dir, repo_root
from ..show import to_markdown
from . import cards, corpus, eagle3, features
from .heads import HeadTrainConfig, HeadTrainer, load_dataset
from .loop import CONFIG_FILE, STATE_FILE, copy_checkpoint, read_config, require_checkpoint, run_arguments

NAME = EMBEDDED_EAGLE_REPLIES
UNROLL = 3  # drafting steps compared at publishing (eagle3.acceptance)


def training_dir() -> Path:
    """The run's folder, inside the checkout so that it is committed and resumed by a later clone."""
    return repo_root() / "data" / "training" / NAME


def run_config(out_dir: Path, steps: int, corpus_dir: Path | None = None) -> HeadTrainConfig:
    """The run's settings: those stored in ``out_dir`` when it resumes, else the first head's recipe at half its
    peak learning rate, from the first head, on every record the corpus has now but the held-out ones."""
    if (out_dir / CONFIG_FILE).exists():
        return read_config(out_dir / CONFIG_FILE, HeadTrainConfig)
    n = len(corpus.load_index(corpus_dir))
    return HeadTrainConfig(steps=steps, lr=5e-4, warmup=100, eval_every=250, heldout=eagle3.heldout_indices(n),
                           start_from=EMBEDDED_EAGLE, records=n)


def make_trainer(target, out_dir: Path, cfg: HeadTrainConfig, corpus_dir: Path | None = None,
                 features_path: Path | None = None, target_name: str = EMBEDDED_TARGET) -> HeadTrainer:
    """The run's trainer (``cfg``: ``run_config``'s) over its records' features, extracted first where missing
    (resumable)."""
    features_path = features_path or features.features_dir(target_name)
    features.extract_features(target, corpus_dir, features_path, target_name, max_records=cfg.records)
    data, _ = load_dataset(features_path, cfg, corpus_dir, max_records=cfg.records)
    head_cfg = read_head_config(drafts_dir() / cfg.start_from)
    return HeadTrainer(target, head_cfg, data, cfg, out_dir)


def compare_heads(target, trainer: HeadTrainer, corpus_dir: Path | None = None) -> pd.DataFrame:
    """The head the run started from and the run's head on the same held-out replies: one row each."""
    rows = eagle3.heldout_rows(corpus.load_records(corpus_dir), trainer.cfg.heldout, trainer.cfg.max_len)
    heads = {f"{trainer.cfg.start_from} (the start)": drafts_dir() / trainer.cfg.start_from,
             f"{NAME} (step {trainer.step})": trainer.out_dir}
    table = {label: eagle3.head_acceptance(target, folder, rows, UNROLL) for label, folder in heads.items()}
    return pd.DataFrame.from_dict(table, orient="index").rename_axis("head")


def publish(target, trainer: HeadTrainer, corpus_dir: Path | None = None) -> pd.DataFrame:
    """Compare the run's head with the one it started from and, when it is better (``eagle3.is_better``: a higher
    T = 1 acceptance of the first drafted token and a greedy agreement no lower), copy it into the drafts folder
    with its card (both heads' figures); returns the comparison."""
    comparison = compare_heads(target, trainer, corpus_dir)
    print(to_markdown(comparison.reset_index()))
    if not eagle3.is_better(comparison):
        print(f"not published: the head at step {trainer.step} does not beat {trainer.cfg.start_from} on the held-out "
              "replies; train on (rerun without --publish)")
        return comparison
    out_dir = copy_checkpoint(trainer.out_dir, drafts_dir() / NAME)
    index = corpus.load_index(corpus_dir)[: trainer.cfg.records]
    cards.head_card(out_dir, trainer, index, trained_by="`python -m specdec_lite.train.continued`")
    cards.append_comparison(out_dir, comparison, "`specdec_lite.train.continued.compare_heads`")
    print(f"published to {out_dir}: load_draft('{NAME}'), or a tree draft on it with tree_draft(name, target, "
          f"head='{NAME}')")
    return comparison


def main(argv=None):
    args = run_arguments(__doc__, training_dir(), 4000, argv)
    out_dir = args.out
    if args.publish:
        require_checkpoint(out_dir, [STATE_FILE, CONFIG_FILE], "continued EAGLE head")
    target, _ = load_model(EMBEDDED_TARGET)
    if args.publish:
        publish(target, HeadTrainer.from_checkpoint(target, out_dir, "eagle"))
        return
    trainer = make_trainer(target, out_dir, run_config(out_dir, args.steps))
    trainer.run(max_minutes=args.minutes)
    print(trainer.log[-1])


if __name__ == "__main__":
    main()
