"""Training the feature-level drafts of ``heads.py`` from the target alone (run by
``notebooks/00_train_heads.ipynb``).

Data: target-made text (``corpus.py``) and the target's last hidden states over it by teacher forcing
(``features.py``). Every label comes from those features, so no target forward runs during training:

- EAGLE-style head, at position i: input (f_i + noise, embedding of token i+1), output f'_{i+1}. Loss =
  ``regression_weight`` x smooth-L1(f'_{i+1}, f_{i+1}) + ``ce_weight`` x cross-entropy of the head's distribution
  lm_head(f'_{i+1}) against the target's lm_head(f_{i+1}) (both over the sub-vocabulary). The noise (uniform,
  +-``feature_noise``) makes the head robust to its own prediction errors when it drafts on them; with ``unroll``
  > 1 it also trains on them (EAGLE-3's training-time test: the same loss after each of ``unroll`` drafting steps
  on its own predictions, step k weighted 0.8^(k-1)).
- Medusa head k (0-based), at position i: cross-entropy of lm_head(head_k(f_i)) against the target's
  distribution of the token i+2+k, lm_head(f_{i+1+k}).

Losses count only positions whose predicted token lies in a reply (the prompt is context). Held-out records
(5%) give the greedy agreement per head position (argmax over the sub-vocabulary equals the target's).
The optimisation (schedule, clipping, evaluation, checkpoints with the optimizer and random states, time budget,
resume) is ``loop.TrainingLoop``; the model card is ``cards.head_card``. A rerun resumes from the checkpoints.
``HeadTrainer.from_checkpoint`` reads a finished checkpoint back without training data (head, configs, log), to
re-evaluate it and rewrite its card without retraining.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..drafts.heads import (HeadConfig, OutputLayer, build_head, check_head_target, head_config_for,
                            parameter_count, read_head, save_head)
from ..paths import HEAD_CONFIG, drafts_dir
from ..tokenizers import padded
from .batching import draftable_tokens
from .corpus import load_records
from .features import load_features
from .loop import (CONFIG_FILE, LOG_FILE, LoopConfig, TrainingLoop, heldout_split, mean_over_chunks, read_config,
                   read_log, require_checkpoint, write_config)


@dataclass
class HeadTrainConfig:
    steps: int = 3000
    batch_size: int = 8  # records per step
    max_len: int = 256  # tokens per record, longer ones are cut
    lr: float = 1e-3  # peak AdamW learning rate (linear warm-up, cosine decay to 0 at ``steps``)
    warmup: int = 100
    weight_decay: float = 0.0
    regression_weight: float = 1.0  # EAGLE: smooth-L1 on the predicted feature
    ce_weight: float = 0.1  # EAGLE: cross-entropy through the target's head
    feature_noise: float = 0.1  # EAGLE: uniform noise on input features
    unroll: int = 1  # EAGLE-3's training-time test: drafting steps on the head's own predictions (1: none)
    heldout_fraction: float = 0.05
    eval_every: int = 200
    seed: int = 0
    heldout: list = field(default_factory=list)  # corpus record indices held out (empty: a random heldout_fraction)
    start_from: str = ""  # a shipped head (drafts folder name) whose weights and sub-vocabulary training starts from
    records: int = 0  # the corpus records before this one are the run's data (0: as many as are given)
    first_record: int = 0  # and those from this one on


STEP_WEIGHT = 0.8  # the weight of each further unrolled step (EAGLE-3's): a later token is accepted less often
HEAD_KINDS = ("eagle", "medusa")
HEAD_FILES = (HEAD_CONFIG, "head.safetensors", CONFIG_FILE, LOG_FILE)  # a finished head checkpoint


def check_kinds(kinds) -> list[str]:
    """The head kinds asked for; an unknown one is refused before any work starts."""
    unknown = sorted(set(kinds) - set(HEAD_KINDS))
    if unknown:
        raise ValueError(f"kinds must be 'eagle' and/or 'medusa', got {unknown}")
    return list(kinds)


class FeatureDataset:
    """Records of the corpus with their features, in memory; a fixed held-out split by record: the records
    ``cfg.heldout`` names (their corpus indices; ``records`` are the corpus's from ``cfg.first_record`` on), else a
    random ``cfg.heldout_fraction`` of them."""

    def __init__(self, records, features: np.ndarray, cfg: HeadTrainConfig, device="cpu"):
        self.device = torch.device(device)
        self.items = []  # (tokens (L,), features (L, H) float16 on ``device``, reply_start)
        record_of = []  # the corpus index of each item
        for i, (entry, arr) in enumerate(records):
            n = min(len(arr), cfg.max_len)
            if entry["prompt_len"] < n - 2:
                start = entry["offset"]
                self.items.append((torch.from_numpy(arr[:n]),
                                   torch.from_numpy(np.array(features[start: start + n])).to(self.device),
                                   entry["prompt_len"]))
                record_of.append(cfg.first_record + i)
        if cfg.heldout:
            held = set(cfg.heldout)
            self.heldout = [j for j, i in enumerate(record_of) if i in held]
            self.train = [j for j, i in enumerate(record_of) if i not in held]
            if not self.heldout:
                raise ValueError(f"none of the {len(held)} held-out records is among the {len(records)} given: "
                                 "give the corpus they index")
        else:
            self.heldout, self.train = heldout_split(len(self.items), cfg.heldout_fraction,
                                                     torch.Generator().manual_seed(cfg.seed))

    def batch(self, rows):
        """(ids (B, L), features (B, L, H) float32, valid (B, L) bool, reply_start (B,)), on the dataset's device."""
        ids, valid = (t.to(self.device) for t in padded([self.items[i][0] for i in rows]))
        H = self.items[rows[0]][1].shape[1]
        feats = torch.zeros(len(rows), ids.shape[1], H, device=self.device)
        for r, i in enumerate(rows):
            feats[r, : len(self.items[i][1])] = self.items[i][1].float()
        starts = torch.tensor([self.items[i][2] for i in rows], device=self.device)
        return ids, feats, valid.bool(), starts

    def sequences(self, rows=None):
        """[(tokens, reply_start)] as ``batching.draftable_tokens`` takes them."""
        return [(self.items[i][0], self.items[i][2]) for i in (rows if rows is not None else self.train)]


def soft_cross_entropy(logits, target_logits):
    """Cross-entropy of softmax(logits) against softmax(target_logits), per row."""
    return -(target_logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)


def eagle_loss(head, embed, output: OutputLayer, batch, cfg: HeadTrainConfig, train: bool = True):
    """(loss, metrics): see the module docstring. Position i's prediction is f'_{i+1}, which drafts token i+2. With
    ``cfg.unroll`` > 1 the head also drafts on its own predictions (``EagleHead.unrolled``, EAGLE-3's training-time
    test): step k at position i reads step k-1's prediction at i-1, and is held to the same f_{i+1}; the loss is
    the sum over the steps weighted ``STEP_WEIGHT`` ** (k - 1), and the metrics of step k > 1 are suffixed
    ``_step{k}``."""
    ids, feats, valid, starts = batch
    L = ids.shape[1]
    inputs = feats[:, :-1]
    if train and cfg.feature_noise > 0:
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * cfg.feature_noise
    with torch.no_grad():
        token_emb = embed(ids[:, 1:])
    if cfg.unroll > 1:
        steps = head.unrolled(inputs, token_emb, cfg.unroll)  # [(B, L-1, H)] per drafting step
    else:
        steps = [head(inputs, token_emb, torch.arange(L - 1, device=ids.device))]
    pos = torch.arange(L - 1, device=ids.device)[None, :]
    counted = valid[:, 1:] & (pos + 2 >= starts[:, None])  # token i+2 is a reply token (or the end)
    true = feats[:, 1:][counted]  # (N, H): the target's features, and below its logits, the same at every step
    with torch.no_grad():
        true_logits = output.sub_logits(true)
    losses, metrics = [], {}
    for k, predicted in enumerate(steps):
        drafted = (pos >= k).expand_as(counted)[counted]  # step k drafts on k earlier positions
        loss, step = feature_loss(output, predicted[counted][drafted], true[drafted], true_logits[drafted], cfg)
        losses.append(STEP_WEIGHT ** k * loss)
        metrics.update({name + (f"_step{k + 1}" if k else ""): value for name, value in step.items()})
    return torch.stack(losses).sum(), metrics


def feature_loss(output: OutputLayer, pred, true, target_logits, cfg: HeadTrainConfig):
    """(loss, metrics) of predicted features ``pred`` against the target's ``true`` ones (N, H) and its logits
    ``target_logits`` (N, S, over the sub-vocabulary): smooth-L1 plus the cross-entropy of the head's distribution
    against the target's, and the agreement."""
    regression = F.smooth_l1_loss(pred, true)
    logits = output.sub_logits(pred)
    ce = soft_cross_entropy(logits, target_logits).mean()
    agree = (logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
    loss = cfg.regression_weight * regression + cfg.ce_weight * ce
    return loss, {"regression": regression.item(), "ce": ce.item(), "agreement": agree.item()}


def medusa_loss(head, output: OutputLayer, batch):
    """(loss, metrics): head k at position i against the target's distribution of token i+2+k."""
    ids, feats, valid, starts = batch
    B, L, _ = feats.shape
    predicted = head(feats)  # (B, L, K, H)
    with torch.no_grad():
        target_logits_all = output.sub_logits(feats)  # (B, L, S): the target's distribution at every position
    losses, metrics = [], {}
    for k in range(predicted.shape[2]):
        span = L - 1 - k  # positions i with a feature f_{i+1+k}
        if span <= 0:
            continue
        pos = torch.arange(span, device=feats.device)[None, :]
        mask = valid[:, 1 + k:] & (pos + 2 + k >= starts[:, None])
        logits = output.sub_logits(predicted[:, :span, k][mask])
        target_logits = target_logits_all[:, 1 + k:][mask]
        losses.append(soft_cross_entropy(logits, target_logits).mean())
        metrics[f"agreement_head{k + 1}"] = (logits.argmax(-1) == target_logits.argmax(-1)).float().mean().item()
    loss = torch.stack(losses).mean()
    metrics["ce"] = loss.item()
    return loss, metrics


class HeadTrainer:
    """One training run of one head kind with ``loop.TrainingLoop``; ``run`` resumes from ``out_dir`` when a
    checkpoint is there. ``from_checkpoint`` gives the trainer of a finished checkpoint without training data. The
    head trains in float32 on the target's device, where the dataset's features must be (``load_dataset``)."""

    def __init__(self, target, head_cfg: HeadConfig, data: FeatureDataset | None, cfg: HeadTrainConfig,
                 out_dir: Path):
        if data is not None and data.device != target.device:
            raise ValueError(f"the features are on {data.device} and the target on {target.device}: load them where "
                             f"the target runs (load_dataset(..., device=target.device))")
        self.target, self.head_cfg, self.data, self.cfg = target, head_cfg, data, cfg
        self.out_dir = Path(out_dir)
        self.embed = target.get_input_embeddings()
        vocab = head_cfg.vocab_size
        if data is not None and head_cfg.sub_vocab_size and not cfg.start_from:
            self.vocab_ids = draftable_tokens(data.sequences(), vocab, head_cfg.sub_vocab_size,
                                              target.config.eos_token_id)
        else:  # the full vocabulary, or the checkpoint's (from_checkpoint) or the start's (_start_from)
            self.vocab_ids = None
        self.output = OutputLayer(target, vocab, self.vocab_ids)
        with torch.random.fork_rng(devices=[]):  # the initial weights are the seed's, whatever ran before
            torch.manual_seed(cfg.seed)
            self.head = build_head(head_cfg).to(target.device)
        if cfg.start_from:
            self._start_from(drafts_dir() / cfg.start_from)
        self.loop = TrainingLoop(self.head, lambda batch: self.loss(batch)[0], self.sample, self.evaluate,
                                 LoopConfig.of(cfg, betas=(0.9, 0.95)), self.save, self.out_dir, keep_state=True,
                                 desc=f"{head_cfg.kind} training")
        self._resume(full=data is not None)

    @classmethod
    def from_checkpoint(cls, target, out_dir: Path, kind: str | None = None) -> "HeadTrainer":
        """The trainer of a finished checkpoint as it was committed: its head (float16 weights, as float32), head
        config, training config (``training_config.json``) and log (``training_log.jsonl``), for the model card
        and the evaluation; nothing is read from ``training_state.pt`` and nothing is written. ``kind``: refuse a
        checkpoint of another kind. It has no training data, so it cannot ``run``."""
        out_dir = require_checkpoint(out_dir, HEAD_FILES, "head")
        _, head_cfg, _ = read_head(out_dir)
        if kind is not None and head_cfg.kind != kind:
            raise ValueError(f"{out_dir} holds a {head_cfg.kind} head, not a {kind} head; give another folder")
        check_head_target(head_cfg, target)
        return cls(target, head_cfg, None, read_config(out_dir / CONFIG_FILE, HeadTrainConfig), out_dir)

    step = property(lambda self: self.loop.step)
    log = property(lambda self: self.loop.log)

    def _start_from(self, folder: Path):
        """Begin with the weights and the sub-vocabulary of the shipped head in ``folder`` (same kind and target);
        a checkpoint in ``out_dir`` replaces them when the run resumes. A run with more decoder layers than its
        start grows it: the start's layers, then new ones that begin as the identity (``EagleHead``)."""
        head, cfg, vocab_ids = read_head(folder)
        shape = ("kind", "hidden_size", "vocab_size", "sub_vocab_size", "num_attention_heads", "intermediate_size",
                 "rope_theta", "feature_layers", "num_heads")
        differ = [k for k in shape if getattr(cfg, k) != getattr(self.head_cfg, k)]
        if cfg.num_layers > self.head_cfg.num_layers:
            differ.append("num_layers")
        if differ:
            raise ValueError(f"{folder} holds a head that differs from this run's in {differ}; start from a head "
                             "of the same kind and settings, or with fewer layers (or give this run its settings)")
        # read_head loaded the start strictly, so with the settings alike only the grown layers are missing
        self.head.load_state_dict(head.state_dict(), strict=False)
        self.vocab_ids = vocab_ids
        self.output = OutputLayer(self.target, self.head_cfg.vocab_size, vocab_ids)

    def _resume(self, full: bool = True):
        """Full resume from ``training_state.pt`` (float32 head, optimizer, log, random states; kept out of git),
        else (and always when not ``full``) a warm start from a committed checkpoint (float16 head and its log;
        the optimizer's moments start afresh, the batches from seed + step)."""
        if not (self.out_dir / HEAD_CONFIG).exists():
            return
        head, cfg, vocab_ids = read_head(self.out_dir)
        if cfg.kind != self.head_cfg.kind or cfg.target_fingerprint != self.head_cfg.target_fingerprint:
            raise ValueError(f"{self.out_dir} holds a {cfg.kind} head for target {cfg.target} "
                             f"({cfg.target_fingerprint}); give another out_dir or name")
        if not (full and self.loop.resume()):
            self.head.load_state_dict(head.state_dict())
            self.loop.log = read_log(self.out_dir / LOG_FILE)
            self.loop.step = self.loop.log[-1]["step"] if self.loop.log else 0
        self.vocab_ids = vocab_ids
        self.output = OutputLayer(self.target, self.head_cfg.vocab_size, vocab_ids)

    def loss(self, batch, train=True):
        if self.head_cfg.kind == "eagle":
            return eagle_loss(self.head, self.embed, self.output, batch, self.cfg, train)
        return medusa_loss(self.head, self.output, batch)

    def sample(self, generator: torch.Generator):
        """A training batch of ``batch_size`` records drawn with replacement."""
        rows = torch.randint(len(self.data.train), (self.cfg.batch_size,), generator=generator)
        return self.data.batch([self.data.train[int(j)] for j in rows])

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Mean held-out metrics of ``loss`` (no feature noise)."""
        means = mean_over_chunks(self.data.heldout, self.cfg.batch_size,
                                 lambda chunk: self.loss(self.data.batch(chunk), train=False)[1])
        return {f"heldout_{k}": v for k, v in means.items()}

    def save(self):
        """The head (float16) and its config; the loop adds the log and the training state."""
        save_head(self.head, self.head_cfg, self.vocab_ids, self.out_dir)
        write_config(self.out_dir / CONFIG_FILE, self.cfg)

    def run(self, progress: bool = True, max_minutes: float | None = None) -> list[dict]:
        if self.data is None:
            raise ValueError("this trainer was made from a checkpoint without training data; make one with "
                             "HeadTrainer(target, head_cfg, data, cfg, out_dir) to train")
        self.loop.cfg = replace(self.loop.cfg, max_minutes=max_minutes)
        return self.loop.run(progress)


def train_or_load(target, target_name: str, kind: str, out_dir: Path, data: FeatureDataset | None, *,
                  retrain: bool, steps: int, batch_size: int = 8, seed: int = 0, sub_vocab_size: int = 8192,
                  num_heads: int = 4, max_minutes: float | None = None, progress: bool = True) -> HeadTrainer:
    """The trainer of one head in ``out_dir``: trained on ``data`` for ``steps`` (resuming what is there) when
    ``retrain``, else the finished checkpoint as it is (``HeadTrainer.from_checkpoint``; ``data`` unused)."""
    if not retrain:
        return HeadTrainer.from_checkpoint(target, out_dir, kind)
    if data is None:
        raise ValueError("retrain needs training data: give load_dataset(...)'s dataset")
    cfg = HeadTrainConfig(steps=steps, batch_size=batch_size, seed=seed, eval_every=max(1, min(200, steps // 3)),
                          warmup=min(100, steps // 4 + 1))
    head_cfg = head_config_for(target, kind, target_name, sub_vocab_size=sub_vocab_size, num_heads=num_heads)
    trainer = HeadTrainer(target, head_cfg, data, cfg, out_dir)
    trainer.run(progress, max_minutes)
    return trainer


def describe(trainer: HeadTrainer) -> str:
    """One line on a head: its kind, size, steps and the records it trained on (when the trainer has them)."""
    data = (f"{len(trainer.data.train)} training / {len(trainer.data.heldout)} held-out records"
            if trainer.data is not None else "as shipped")
    return (f"{trainer.head_cfg.kind}: {parameter_count(trainer.head) / 1e6:.2f} M parameters, {trainer.step} steps, "
            f"{data}")


def load_dataset(features_dir: Path, cfg: HeadTrainConfig, corpus_dir=None, max_records: int | None = None,
                 device="cpu"):
    """The corpus records from ``cfg.first_record`` on that have features, up to ``max_records`` (all by default),
    their features on ``device`` (where the target, and so the training, runs)."""

    features, meta = load_features(features_dir)
    if cfg.first_record < meta["first_record"]:
        raise ValueError(f"{features_dir} has features of records {meta['first_record']} on, and {cfg.first_record} "
                         "on are asked for: extract them into another folder (python -m "
                         "specdec_lite.train.features --first-record N --out F)")
    end = max_records or meta["records_done"]
    if meta["records_done"] < end:
        raise ValueError(f"{features_dir} has features of corpus records up to {meta['records_done']}, and {end} are "
                         "asked for: extract the rest first (python -m specdec_lite.train.features)")
    records = load_records(corpus_dir)[cfg.first_record: end]
    return FeatureDataset(records, features, cfg, device), meta
