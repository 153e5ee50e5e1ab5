"""Training the feature-level drafts of ``heads.py`` from the target alone (run by
``notebooks/00_train_heads.ipynb``).

Data: target-made text (``corpus.py``) and the target's last hidden states over it by teacher forcing
(``features.py``). Every label comes from those features, so no target forward runs during training:

- EAGLE-style head, at position i: input (f_i + noise, embedding of token i+1), output f'_{i+1}. Loss =
  ``regression_weight`` x smooth-L1(f'_{i+1}, f_{i+1}) + ``ce_weight`` x cross-entropy of the head's distribution
  lm_head(f'_{i+1}) against the target's lm_head(f_{i+1}) (both over the sub-vocabulary). The noise (uniform,
  +-``feature_noise``) makes the head robust to its own prediction errors when it drafts on them.
- Medusa head k (0-based), at position i: cross-entropy of lm_head(head_k(f_i)) against the target's
  distribution of the token i+2+k, lm_head(f_{i+1+k}).

Losses count only positions whose predicted token lies in a reply (the prompt is context). Held-out records
(5%) give the greedy agreement per head position (argmax over the sub-vocabulary equals the target's).
Checkpoints (head, optimizer, log) are written every ``eval_every`` steps; a rerun resumes from them.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..drafts.heads import HeadConfig, OutputLayer, build_head, parameter_count, read_head, save_head
from ..paths import HEAD_CONFIG
from .batching import padded
from .corpus import load_records
from .draft import finish_card, frequent_tokens, warmup_cosine
from .features import load_features


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
    heldout_fraction: float = 0.05
    eval_every: int = 200
    seed: int = 0


class FeatureDataset:
    """Records of the corpus with their features, in memory; a fixed held-out split by record."""

    def __init__(self, records, features: np.ndarray, cfg: HeadTrainConfig):
        self.items = []  # (tokens (L,), features (L, H) float16, reply_start)
        for entry, arr in records:
            n = min(len(arr), cfg.max_len)
            if entry["prompt_len"] < n - 2:
                start = entry["offset"]
                self.items.append((torch.from_numpy(arr[:n]),
                                   torch.from_numpy(np.array(features[start: start + n])), entry["prompt_len"]))
        g = torch.Generator().manual_seed(cfg.seed)
        perm = torch.randperm(len(self.items), generator=g).tolist()
        n_held = max(1, int(len(perm) * cfg.heldout_fraction))
        self.heldout, self.train = perm[:n_held], perm[n_held:]

    def batch(self, rows):
        """(ids (B, L), features (B, L, H) float32, valid (B, L) bool, reply_start (B,))."""
        ids, valid = padded([self.items[i][0] for i in rows])
        H = self.items[rows[0]][1].shape[1]
        feats = torch.zeros(len(rows), ids.shape[1], H)
        for r, i in enumerate(rows):
            feats[r, : len(self.items[i][1])] = self.items[i][1].float()
        starts = torch.tensor([self.items[i][2] for i in rows])
        return ids, feats, valid.bool(), starts

    def sequences(self, rows=None):
        """[(tokens, reply_start)] as ``distill.frequent_tokens`` takes them."""
        return [(self.items[i][0], self.items[i][2]) for i in (rows if rows is not None else self.train)]


def _soft_ce(logits, target_logits):
    """Cross-entropy of softmax(logits) against softmax(target_logits), per row."""
    return -(target_logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)


def eagle_loss(head, embed, output: OutputLayer, batch, cfg: HeadTrainConfig, train: bool = True):
    """(loss, metrics): see the module docstring. Position i's prediction is f'_{i+1}, which drafts token i+2."""
    ids, feats, valid, starts = batch
    L = ids.shape[1]
    inputs = feats[:, :-1]
    if train and cfg.feature_noise > 0:
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * cfg.feature_noise
    with torch.no_grad():
        token_emb = embed(ids[:, 1:])
    predicted = head(inputs, token_emb, torch.arange(L - 1))  # (B, L-1, H)
    pos = torch.arange(L - 1)[None, :]
    mask = valid[:, 1:] & (pos + 2 >= starts[:, None])  # token i+2 is a reply token (or the end)
    pred, true = predicted[mask], feats[:, 1:][mask]
    regression = F.smooth_l1_loss(pred, true)
    logits, target_logits = output.sub_logits(pred), output.sub_logits(true)
    ce = _soft_ce(logits, target_logits).mean()
    agree = (logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
    loss = cfg.regression_weight * regression + cfg.ce_weight * ce
    return loss, {"regression": regression.item(), "ce": ce.item(), "agreement": agree.item()}


def medusa_loss(head, output: OutputLayer, batch, cfg: HeadTrainConfig, train: bool = True):
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
        pos = torch.arange(span)[None, :]
        mask = valid[:, 1 + k:] & (pos + 2 + k >= starts[:, None])
        logits = output.sub_logits(predicted[:, :span, k][mask])
        target_logits = target_logits_all[:, 1 + k:][mask]
        losses.append(_soft_ce(logits, target_logits).mean())
        metrics[f"agreement_head{k + 1}"] = (logits.argmax(-1) == target_logits.argmax(-1)).float().mean().item()
    loss = torch.stack(losses).mean()
    metrics["ce"] = loss.item()
    return loss, metrics


class HeadTrainer:
    """One training run of one head kind; ``run`` resumes from ``out_dir`` when a checkpoint is there."""

    def __init__(self, target, head_cfg: HeadConfig, data: FeatureDataset, cfg: HeadTrainConfig, out_dir: Path):
        self.target, self.head_cfg, self.data, self.cfg = target, head_cfg, data, cfg
        self.out_dir = Path(out_dir)
        self.embed = target.get_input_embeddings()
        vocab = head_cfg.vocab_size
        if head_cfg.sub_vocab_size:
            self.vocab_ids = frequent_tokens(data.sequences(), vocab, head_cfg.sub_vocab_size)
            eos = target.config.eos_token_id
            eos = [eos] if isinstance(eos, int) else list(eos or [])
            missing = [e for e in eos if e not in set(self.vocab_ids.tolist())]
            if missing:  # ending a reply must always be draftable
                self.vocab_ids = torch.cat([self.vocab_ids[: len(self.vocab_ids) - len(missing)], torch.tensor(missing)])
        else:
            self.vocab_ids = None
        self.output = OutputLayer(target, vocab, self.vocab_ids)
        self.head = build_head(head_cfg)
        self.log, self.step = [], 0
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     betas=(0.9, 0.95))
        self._resume()

    def _resume(self):
        """Full resume from ``training_state.pt`` (float32 head, optimizer, log; kept out of git), else a warm
        start from a committed checkpoint (float16 head and its log; the optimizer's moments start afresh)."""
        if not (self.out_dir / HEAD_CONFIG).exists():
            return
        head, cfg, vocab_ids = read_head(self.out_dir)
        if cfg.kind != self.head_cfg.kind or cfg.target_fingerprint != self.head_cfg.target_fingerprint:
            raise ValueError(f"{self.out_dir} holds a {cfg.kind} head for target {cfg.target} "
                             f"({cfg.target_fingerprint}); give another out_dir or name")
        state = self.out_dir / "training_state.pt"
        if state.exists():
            saved = torch.load(state, weights_only=False)
            self.head.load_state_dict(saved["head"])
            self.opt.load_state_dict(saved["optimizer"])
            self.step, self.log = saved["step"], saved["log"]
        else:
            self.head.load_state_dict(head.state_dict())
            log_path = self.out_dir / "training_log.jsonl"
            self.log = [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()] if log_path.exists() else []
            self.step = self.log[-1]["step"] if self.log else 0
        self.vocab_ids = vocab_ids
        self.output = OutputLayer(self.target, self.head_cfg.vocab_size, vocab_ids)

    def loss(self, batch, train=True):
        if self.head_cfg.kind == "eagle":
            return eagle_loss(self.head, self.embed, self.output, batch, self.cfg, train)
        return medusa_loss(self.head, self.output, batch, self.cfg, train)

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.head.eval()
        rows, totals = self.data.heldout, {}
        chunks = [rows[i: i + self.cfg.batch_size] for i in range(0, len(rows), self.cfg.batch_size)]
        for chunk in chunks:
            _, metrics = self.loss(self.data.batch(chunk), train=False)
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v / len(chunks)
        self.head.train()
        return {f"heldout_{k}": v for k, v in totals.items()}

    def save(self):
        save_head(self.head, self.head_cfg, self.vocab_ids, self.out_dir)
        torch.save({"head": self.head.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step,
                    "log": self.log}, self.out_dir / "training_state.pt")
        (self.out_dir / "training_log.jsonl").write_text("\n".join(json.dumps(e) for e in self.log) + "\n")
        (self.out_dir / "training_config.json").write_text(json.dumps(asdict(self.cfg), indent=1) + "\n")

    def run(self, progress: bool = True, max_minutes: float | None = None) -> list[dict]:
        from tqdm.auto import tqdm

        g = torch.Generator().manual_seed(self.cfg.seed + self.step)
        run_started = time.monotonic()
        started = run_started - 60 * (self.log[-1]["minutes"] if self.log else 0.0)  # cumulative on resume
        self.head.train()
        bar = tqdm(total=self.cfg.steps, initial=self.step, desc=f"{self.head_cfg.kind} training",
                   disable=not progress)
        while self.step < self.cfg.steps:
            rows = [self.data.train[int(j)] for j in torch.randint(len(self.data.train), (self.cfg.batch_size,),
                                                                    generator=g)]
            for group in self.opt.param_groups:
                group["lr"] = self.cfg.lr * warmup_cosine(self.step, self.cfg.warmup, self.cfg.steps)
            loss, metrics = self.loss(self.data.batch(rows))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
            self.opt.step()
            self.step += 1
            bar.update(1)
            out_of_time = max_minutes is not None and time.monotonic() - run_started > 60 * max_minutes
            if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps or out_of_time:
                entry = {"step": self.step, "train_loss": loss.item(), **self.evaluate(),
                         "minutes": (time.monotonic() - started) / 60}
                self.log.append(entry)
                bar.set_postfix({k: f"{v:.3f}" for k, v in entry.items() if "agreement" in k})
                self.save()
            if out_of_time:
                break
        bar.close()
        self.head.eval()
        return self.log


def load_dataset(features_dir: Path, cfg: HeadTrainConfig, corpus_dir=None, max_records: int | None = None):
    """The corpus records that have features (the first ``records_done`` of the index)."""

    features, meta = load_features(features_dir)
    records = load_records(corpus_dir)[: meta["records_done"]]
    return FeatureDataset(records[:max_records] if max_records else records, features, cfg), meta


def write_head_card(out_dir: Path, trainer: HeadTrainer, corpus_index: list, evaluation=None) -> str:
    """README.md beside the weights: what it is, size, data, steps, loss curve, held-out acceptance."""
    out_dir, cfg, hc = Path(out_dir), trainer.cfg, trainer.head_cfg
    params = parameter_count(trainer.head)
    size = (out_dir / "head.safetensors").stat().st_size / 1e6
    reply_tokens = sum(e["gen_len"] for e in corpus_index)
    families = sorted({e["family"] for e in corpus_index})
    vocab = f"the {hc.sub_vocab_size} most frequent reply tokens" if hc.sub_vocab_size else "the full vocabulary"
    if hc.kind == "eagle":
        what = (f"EAGLE-style head (Li et al. 2024): a linear fusion of (target feature, token embedding) into "
                f"width {hc.hidden_size}, then one decoder layer ({hc.num_attention_heads} heads, MLP "
                f"{hc.intermediate_size}, RoPE base {hc.rope_theta:g}); it predicts the target's next feature, "
                "which the target's own output layer reads.")
        loss = (f"{cfg.regression_weight} x smooth-L1 on the predicted feature + {cfg.ce_weight} x cross-entropy "
                f"against the target's distribution; input features with uniform noise +-{cfg.feature_noise}")
    else:
        what = (f"{hc.num_heads} Medusa heads (Cai et al. 2024): residual blocks f + SiLU(W f + b) on the target's "
                "last feature; head k predicts the token k places after the target's next token, through the "
                "target's own output layer.")
        loss = "mean over heads of the cross-entropy against the target's distribution of that token"
    columns = [k for k in (trainer.log[-1] if trainer.log else {}) if k.startswith("heldout_")]
    lines = [
        f"# {out_dir.name}: {'an EAGLE-style head' if hc.kind == 'eagle' else 'Medusa heads'} for {hc.target}", "",
        "Trained by specdec_lite (`notebooks/00_train_heads.ipynb`) from the target alone. Load it with "
        f"`specdec_lite.load_pair(target, draft=\"{out_dir.name}\")` or `specdec_lite.heads.load_head(folder, "
        "target)`; it refuses any other target (hidden size, vocabulary, weights fingerprint "
        f"`{hc.target_fingerprint}`).", "",
        "## Architecture", what,
        f"Output over {vocab} (q is zero elsewhere; exact, since the verifier gets that q). {params / 1e6:.2f} M "
        f"trained parameters; `head.safetensors` (float16) {size:.1f} MB. The target's embedding and output "
        "layer are used, not copied.", "",
        "## Training data",
        f"{len(corpus_index)} records written by the target ({reply_tokens} reply tokens; families "
        f"{', '.join(families)}; `specdec_lite/corpus.py`) and the target's last hidden state at every token by "
        "teacher forcing (`specdec_lite/features.py`). None of the instructions overlaps the evaluation prompts.",
        "",
        "## Training",
        f"{trainer.step} AdamW steps of {cfg.batch_size} records (peak lr {cfg.lr}, warm-up {cfg.warmup}, cosine); "
        f"loss: {loss}. {cfg.heldout_fraction:.0%} of the records held out; agreement = the head's argmax equals "
        "the target's (over the sub-vocabulary), teacher-forced.", "",
        "| step | minutes | train loss | " + " | ".join(c.replace("heldout_", "held-out ") for c in columns) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in columns) + " |",
    ]
    for e in trainer.log:
        lines.append(f"| {e['step']} | {e['minutes']:.1f} | {e['train_loss']:.3f} | "
                     + " | ".join(f"{e.get(c, float('nan')):.3f}" for c in columns) + " |")
    return finish_card(out_dir, lines, evaluation)
