"""Training the EAGLE-3-style head (``drafts.heads.FusedEagleHead``) on millions of tokens.

What differs from ``heads.py`` (the first EAGLE-style head):

- **Features on the fly.** Stored features would take 3.5 kB a token for three layers (17 GB for 5M tokens), so each
  step runs the target (as loaded: bfloat16 where the CPU has it natively) over its batch and reads the hidden
  states of a low, a middle and a high layer (``heads.fused_layers``) and the last one (the labels).
- **Training-time test.** The head is unrolled ``unroll`` steps on its own predictions (``EagleHead.unrolled``):
  step k at position i reads the head's step k-1 prediction, as when it drafts its (k+1)-th token. The loss is
  the cross-entropy of each step's distribution against the target's (both over the sub-vocabulary), averaged
  over the steps; no feature regression.
- **More text.** Rows come from the target's own replies (``corpus.py``; the loss counts reply positions) and,
  a ``teacher_share`` of them, from teacher-forced text (``teacher.py``; every position counts).

Held-out: a fixed list of the target's replies that the first head never trained on (records from
``FIRST_HEAD_RECORDS`` on, every ``HELDOUT_EVERY``-th), kept out of training, so the two heads are compared on the
same text (``acceptance``). The data used (record and chunk counts) is fixed at the first run and stored in the
training config, so a run resumed later, in another process (``training_state.pt``: ``loop.TrainingLoop``), draws
the same batches, even after the corpus has grown.

    python -m specdec_lite.train.eagle3 --minutes 90       # resumes: rerun to continue
    python -m specdec_lite.train.eagle3 --publish          # ship it (data/drafts/) if it beats the shipped head

The run lives under the cache folder, ``<cache>/training/smollm2-135m-eagle3`` (``training_dir``): its training
state (70 MB: the head, AdamW's moments, the random states) is resumed exactly by a later run on the same machine and
is never committed. A head that beats the shipped one on the held-out records is copied to ``data/drafts/`` with its
card (``--publish``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch

from ..core.lm import selected_hidden
from ..names import EMBEDDED_EAGLE_DEEP_TTT, EMBEDDED_TARGET
from ..core.models import load_model
from ..drafts.heads import (EagleHead, OutputLayer, build_head, fused_layers, head_config_for,
                            read_head, save_head)
from .. import paths
from ..paths import drafts_dir
from . import corpus, teacher
from ..tokenizers import padded
from .batching import draftable_tokens
from .heads import soft_cross_entropy
from ..show import to_markdown
from .cards import eagle3_card
from .loop import (CONFIG_FILE, STATE_FILE, LoopConfig, TrainingLoop, copy_checkpoint, read_config,
                   require_checkpoint, run_arguments, write_config)

FIRST_HEAD_RECORDS = 2524  # target-made records the first EAGLE head trained on (its training_data.json)
HELDOUT_EVERY = 20
HELDOUT_RECORDS = 75
NAME = "smollm2-135m-eagle3"  # the run; shipped only if it beats the EAGLE head "auto" uses (see
# data/results/heads.csv)


@dataclass
class Eagle3TrainConfig:
    steps: int = 6000  # the learning-rate schedule's length
    batch_size: int = 8  # rows per step
    max_len: int = 256  # tokens per row
    lr: float = 5e-4
    warmup: int = 200
    weight_decay: float = 0.0
    unroll: int = 3  # training-time test steps
    teacher_share: float = 0.5  # of the rows, from teacher-forced text
    sub_vocab_size: int = 8192
    eval_every: int = 100  # also how often it saves
    seed: int = 0
    target_records: int = 0  # how many target-made records the run draws from (fixed at its first start)
    teacher_chunks: int = 0  # and how many teacher-text chunks
    heldout: list = field(default_factory=list)  # the held-out record indices


def heldout_indices(n_records: int) -> list[int]:
    """Target-made records the first head never saw: from FIRST_HEAD_RECORDS on, every HELDOUT_EVERY-th."""
    picked = list(range(FIRST_HEAD_RECORDS, n_records, HELDOUT_EVERY))[:HELDOUT_RECORDS]
    if len(picked) < HELDOUT_RECORDS:
        raise ValueError(f"only {len(picked)} held-out records: the corpus needs more than "
                         f"{FIRST_HEAD_RECORDS + HELDOUT_EVERY * HELDOUT_RECORDS} records (python -m "
                         "specdec_lite.train.corpus --sources)")
    return picked


def heldout_rows(records, indices, max_len: int) -> list[tuple[torch.Tensor, int]]:
    """The records ``indices`` names, as ``acceptance`` reads them: (token ids within ``max_len``, reply start)."""
    return [(torch.from_numpy(records[i][1][:max_len]), records[i][0]["prompt_len"]) for i in indices]


class TextMix:
    """Training rows: (token ids, first position whose token counts) from the target's replies and from
    teacher-forced text, in a fixed proportion."""

    def __init__(self, cfg: Eagle3TrainConfig, corpus_dir: Path | None = None, teacher_dir: Path | None = None):
        records = corpus.load_records(corpus_dir)[: cfg.target_records]
        held = set(cfg.heldout)
        self.cfg = cfg
        self.replies = [(torch.from_numpy(a[: cfg.max_len]), e["prompt_len"]) for i, (e, a) in enumerate(records)
                        if i not in held and e["prompt_len"] < min(len(a), cfg.max_len) - 2]
        self.heldout = heldout_rows(records, cfg.heldout, cfg.max_len)
        self.chunks = [torch.from_numpy(a) for _, a in teacher.load_chunks(teacher_dir)[: cfg.teacher_chunks]]

    def sample(self, generator: torch.Generator) -> list[tuple[torch.Tensor, int]]:
        rows = []
        for _ in range(self.cfg.batch_size):
            if self.chunks and torch.rand((), generator=generator) < self.cfg.teacher_share:
                chunk = self.chunks[int(torch.randint(len(self.chunks), (), generator=generator))]
                start = int(torch.randint(max(1, len(chunk) - self.cfg.max_len + 1), (), generator=generator))
                rows.append((chunk[start: start + self.cfg.max_len], 0))
            else:
                rows.append(self.replies[int(torch.randint(len(self.replies), (), generator=generator))])
        return rows


@torch.no_grad()
def target_batch(target, rows, layers) -> dict:
    """One target forward over ``rows``: ids (B, L), the hidden states at ``layers`` (B, L, k H), the last
    hidden states (B, L, H) and which positions' next-next token counts (B, L - 1)."""
    ids, valid = padded([t for t, _ in rows])
    out = target(input_ids=ids.to(target.device), attention_mask=valid.to(target.device), output_hidden_states=True,
                 logits_to_keep=1)
    starts = torch.tensor([s for _, s in rows])
    position = torch.arange(ids.shape[1] - 1)[None, :]
    counts = valid[:, 2:].bool() & (position[:, 1:] + 2 >= starts[:, None])  # token i+2 exists and counts
    counts = torch.cat([counts, torch.zeros(len(rows), 1, dtype=torch.bool)], dim=1)
    return {"ids": ids, "hidden": selected_hidden(out.hidden_states, layers).float().cpu(),
            "last": out.hidden_states[-1].float().cpu(), "counts": counts}


def unrolled_loss(head: EagleHead, embed, output: OutputLayer, batch: dict, unroll: int):
    """(loss, predictions per step, counted positions per step): the mean over steps of the soft cross-entropy
    against the target (over the sub-vocabulary) at every counted position; step k counts positions >= k."""
    with torch.no_grad():
        embeddings = embed(batch["ids"][:, 1:].to(embed.weight.device)).float().cpu()
        target_sub = output.sub_logits(batch["last"][:, 1:])
    steps = head.unrolled(head.real_features(batch["hidden"][:, :-1]), embeddings, unroll)
    losses, counted = [], []
    for k, predicted in enumerate(steps):
        counts = batch["counts"].clone()
        counts[:, :k] = False  # step k needs k earlier positions
        losses.append(soft_cross_entropy(output.sub_logits(predicted[counts]), target_sub[counts]).mean())
        counted.append(counts)
    return torch.stack(losses).mean(), steps, counted


@torch.no_grad()
def step_metrics(output: OutputLayer, predicted, target_last, chunk: int = 256) -> dict:
    """Against the target over its whole vocabulary, at the given positions (N, H) of one step: the greedy
    agreement (the head's top token, over its sub-vocabulary, is the target's) and the expected acceptance of a
    draft sampled from q at T = 1, sum_x min(p, q)."""
    agree = accept = 0.0
    for i in range(0, len(predicted), chunk):
        sub = output.sub_logits(predicted[i: i + chunk]).float()
        p = (target_last[i: i + chunk].to(output.weight.dtype) @ output.full_weight.T).float().softmax(-1)
        q = output.logits(predicted[i: i + chunk]).float().softmax(-1)
        agree += (output.sub_to_full(sub.argmax(-1)) == p.argmax(-1)).sum().item()
        accept += torch.minimum(p, q).sum().item()
    n = max(1, len(predicted))
    return {"agreement": agree / n, "acceptance_t1": accept / n}


@torch.no_grad()
def acceptance(head: EagleHead, target, output: OutputLayer, rows, layers, unroll: int, batch_size: int = 8) -> dict:
    """Held-out metrics over ``rows``: the loss, and per drafting step ``step_metrics`` (position-weighted)."""
    embed = target.get_input_embeddings()
    sums, counts, losses = {}, {}, []
    for i in range(0, len(rows), batch_size):
        batch = target_batch(target, rows[i: i + batch_size], layers)
        loss, steps, counted = unrolled_loss(head, embed, output, batch, unroll)
        losses.append(loss.item())
        for k, (predicted, counts_k) in enumerate(zip(steps, counted)):
            n = int(counts_k.sum())
            for name, value in step_metrics(output, predicted[counts_k], batch["last"][:, 1:][counts_k]).items():
                key = f"heldout_{name}_step{k + 1}"
                sums[key] = sums.get(key, 0.0) + value * n
                counts[key] = counts.get(key, 0) + n
    return {"heldout_ce": sum(losses) / len(losses), **{k: sums[k] / max(1, counts[k]) for k in sums}}


class Eagle3Trainer:
    """One resumable training run into ``out_dir`` (``loop.TrainingLoop``, exact resume)."""

    def __init__(self, target, target_name: str, cfg: Eagle3TrainConfig, out_dir: Path,
                 corpus_dir: Path | None = None, teacher_dir: Path | None = None):
        self.target, self.out_dir = target, Path(out_dir)
        if (self.out_dir / CONFIG_FILE).exists():  # a run to resume: its data and settings, not today's
            cfg = read_config(self.out_dir / CONFIG_FILE, Eagle3TrainConfig)
        elif not cfg.target_records:
            n = len(corpus.load_index(corpus_dir))
            cfg = Eagle3TrainConfig(**{**asdict(cfg), "target_records": n, "heldout": heldout_indices(n),
                                       "teacher_chunks": len(teacher.load_index(teacher_dir))})
        self.cfg = cfg
        self.data = TextMix(cfg, corpus_dir, teacher_dir)
        self.layers = fused_layers(target)
        self.head_cfg = head_config_for(target, "eagle", target_name, sub_vocab_size=cfg.sub_vocab_size,
                                        feature_layers=self.layers)
        self.vocab_ids = self._vocabulary()
        self.output = OutputLayer(target, self.head_cfg.vocab_size, self.vocab_ids)
        with torch.random.fork_rng():  # the same initial weights for the same seed
            torch.manual_seed(cfg.seed)
            self.head = build_head(self.head_cfg)
        self.embed = target.get_input_embeddings()
        self.loop = TrainingLoop(self.head, self.loss, self.sample, self.evaluate,
                                 LoopConfig.of(cfg, betas=(0.9, 0.95)), self.save, self.out_dir, keep_state=True,
                                 desc="eagle3 training")
        self.loop.resume()

    def _vocabulary(self) -> torch.Tensor:
        """The sub-vocabulary: the checkpoint's when resuming, else the most frequent reply tokens (and EOS)."""
        if (self.out_dir / "head.safetensors").exists():
            return read_head(self.out_dir)[2]
        return draftable_tokens(self.data.replies, self.head_cfg.vocab_size, self.cfg.sub_vocab_size,
                                self.target.config.eos_token_id)

    def sample(self, generator):
        return target_batch(self.target, self.data.sample(generator), self.layers)

    def loss(self, batch):
        return unrolled_loss(self.head, self.embed, self.output, batch, self.cfg.unroll)[0]


    def evaluate(self) -> dict:
        return acceptance(self.head, self.target, self.output, self.data.heldout, self.layers, self.cfg.unroll)

    def save(self):
        save_head(self.head, self.head_cfg, self.vocab_ids, self.out_dir)
        write_config(self.out_dir / CONFIG_FILE, self.cfg)

    def run(self, max_minutes: float | None = None, progress: bool = True) -> list[dict]:
        self.loop.cfg = replace(self.loop.cfg, max_minutes=max_minutes)
        return self.loop.run(progress)


def training_dir() -> Path:
    """The run's folder under the cache (``paths.training_dir``): its state is resumed on this machine, never
    committed; the head it publishes goes to ``data/drafts/``."""
    return paths.training_dir(NAME)


def head_acceptance(target, folder: Path, rows, unroll: int) -> dict:
    """The held-out metrics (``acceptance``) over ``rows`` of the EAGLE head saved in ``folder``, reading the layers
    it was trained on."""
    head, cfg, vocab_ids = read_head(folder)
    output = OutputLayer(target, cfg.vocab_size, vocab_ids)
    return acceptance(head.eval(), target, output, rows, tuple(cfg.feature_layers) or (-1,), unroll)


def shipped_head_acceptance(target, trainer: Eagle3Trainer, name: str = EMBEDDED_EAGLE_DEEP_TTT) -> dict:
    """The shipped EAGLE head's held-out metrics on the same records, through the same function (it never trained
    on them: its held-out records include ``heldout_indices``')."""
    return head_acceptance(target, drafts_dir() / name, trainer.data.heldout, trainer.cfg.unroll)


def compare_heads(target, trainer: Eagle3Trainer) -> pd.DataFrame:
    """The shipped EAGLE head and this run's saved head on the same held-out records, both read from their folders
    by the same function, so that the run's head is judged in the float16 weights it ships in: one row each, the
    loss and per drafting step the greedy agreement and the T = 1 acceptance."""
    heldout, unroll = trainer.data.heldout, trainer.cfg.unroll
    rows = {f"{EMBEDDED_EAGLE_DEEP_TTT} (shipped head)": shipped_head_acceptance(target, trainer),
            f"{NAME} (step {trainer.loop.step})": head_acceptance(target, trainer.out_dir, heldout, unroll)}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("head")


def chain_tokens(row, kind: str = "acceptance_t1") -> float:
    """The drafted tokens a chain of the compared steps gets accepted, by the held-out figures of one head (a row
    of ``compare_heads``): a1 + a1 a2 + a1 a2 a3 + ..., step k's figure being measured after k - 1 steps drafted
    on the head's own predictions from the real tokens, so given that the earlier drafts were accepted."""
    total, reached, k = 0.0, 1.0, 1
    while f"heldout_{kind}_step{k}" in row:
        reached *= row[f"heldout_{kind}_step{k}"]
        total += reached
        k += 1
    return total


def is_better(comparison: pd.DataFrame) -> bool:
    """Whether the second head of ``compare_heads`` beats the first: more drafted tokens accepted by a chain of the
    compared steps at T = 1 (``chain_tokens``), and a greedy agreement at the first drafted token no lower. A
    chain or a tree gains from every step, which a head trained unrolled improves most."""
    first, new = comparison.iloc[0], comparison.iloc[1]
    return bool(chain_tokens(new) > chain_tokens(first)
                and new["heldout_agreement_step1"] >= first["heldout_agreement_step1"])


def publish(target, trainer: Eagle3Trainer) -> pd.DataFrame:
    """Compare the run's head with the shipped one (``compare_heads``) and, when it is better (``is_better``), copy
    it into the drafts folder with its card (the shipped head's figures beside its own); returns the comparison."""
    comparison = compare_heads(target, trainer)
    print(to_markdown(comparison.reset_index()))
    if not is_better(comparison):
        print(f"not published: the head at step {trainer.loop.step} does not beat {EMBEDDED_EAGLE_DEEP_TTT} on the "
              "held-out records; train on (rerun without --publish)")
        return comparison
    out_dir = copy_checkpoint(trainer.out_dir, drafts_dir() / NAME)
    eagle3_card(out_dir, trainer, comparison)
    print(f"published to {out_dir}: load_draft('{out_dir}'), or a tree draft on it with tree_draft(name, target, "
          f"head='{NAME}'); 'auto' uses the head loading.recommended_eagle names (docs/SPEED.md)")
    return comparison


def main(argv=None):
    args = run_arguments(__doc__, training_dir(), Eagle3TrainConfig.steps, argv)
    out_dir = args.out
    if args.publish:
        require_checkpoint(out_dir, [STATE_FILE, CONFIG_FILE], "EAGLE-3 training")
    target, _ = load_model(EMBEDDED_TARGET)
    trainer = Eagle3Trainer(target, EMBEDDED_TARGET, Eagle3TrainConfig(steps=args.steps), out_dir)
    if args.publish:
        publish(target, trainer)
        return
    trainer.run(args.minutes)
    print(trainer.loop.log[-1])


if __name__ == "__main__":
    main()
