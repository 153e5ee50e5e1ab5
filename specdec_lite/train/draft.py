"""A small draft model for a target, trained from the target alone.

Recipe (run by ``notebooks/00_train_draft.ipynb``):
1. target-made text (``corpus.py``): replies the target wrote to template-made instructions;
2. soft labels: the target's top-k next-token probabilities at every reply position, by teacher forcing;
3. a small Llama with the target's tokenizer (tied embeddings initialised by PCA of the target's), trained on
   0.5 * cross-entropy on the target's own tokens + 0.5 * cross-entropy against the top-k soft labels.
The result is a plain transformers model (``save_pretrained``), usable as a draft anywhere. The optimisation
itself (schedule, clipping, evaluation, checkpoints, time budget) is ``loop.TrainingLoop``; the model card is
``cards.draft_card``. ``load_trained`` reads a finished checkpoint back (model, training config, log), to
re-evaluate it and rewrite its card without retraining.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..tokenizers import padded
from .batching import frequent_tokens
from .loop import (CONFIG_FILE, LOG_FILE, LoopConfig, TrainingLoop, heldout_split, mean_over_chunks, read_config,
                   read_log, require_checkpoint, write_config, write_log)

DRAFT_FILES = ("config.json", "model.safetensors", CONFIG_FILE, LOG_FILE)  # a finished draft checkpoint


@dataclass
class DraftConfig:
    hidden_size: int = 128  # width; the tied 49,152-wide output layer dominates the step cost
    num_hidden_layers: int = 2  # each layer costs about 1-1.5 ms per step on a 2-core CPU
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 2048


@dataclass
class TrainConfig:
    steps: int = 2000  # optimizer steps
    batch_size: int = 8  # records per step
    max_len: int = 256  # tokens per record (prompt + reply), longer ones are cut
    lr: float = 3e-3  # peak AdamW learning rate (linear warm-up, cosine decay)
    warmup: int = 100
    weight_decay: float = 0.01
    soft_weight: float = 0.5  # weight of the soft-label term; 1 - soft_weight for the hard tokens
    topk: int = 32  # soft labels per position
    heldout_fraction: float = 0.05
    eval_every: int = 100
    seed: int = 0


def make_draft(target, cfg: DraftConfig = DraftConfig()):
    """A fresh Llama draft with the target's vocabulary and special tokens; embeddings = PCA of the target's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tcfg = target.config
    # the draft is a model of its own: its RoPE base and other unset fields keep LlamaConfig's defaults
    config = LlamaConfig(vocab_size=tcfg.vocab_size, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
                         num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                         max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
                         bos_token_id=tcfg.bos_token_id, eos_token_id=tcfg.eos_token_id,
                         pad_token_id=tcfg.pad_token_id)
    draft = LlamaForCausalLM(config)
    with torch.no_grad():
        E = target.get_input_embeddings().weight.float().cpu()
        centered = E - E.mean(0, keepdim=True)
        # principal directions of the target's embedding rows; keep the top hidden_size of them
        _, _, Vh = torch.linalg.svd(centered, full_matrices=False)
        projected = centered @ Vh[: cfg.hidden_size].T
        projected = projected / projected.std() * 0.05  # small rows: tied logits start near uniform
        draft.get_input_embeddings().weight.copy_(projected)
    return draft


def records_to_batches(records, max_len: int):
    """[(tokens (L,), reply_start)] cut to max_len."""
    out = []
    for entry, arr in records:
        tokens = torch.from_numpy(arr[:max_len].astype(np.int64))
        if entry["prompt_len"] < len(tokens) - 1:
            out.append((tokens, entry["prompt_len"]))
    return out


@torch.inference_mode()
def teacher_topk(target, sequences, k: int = 32, batch_size: int = 16, progress: bool = True):
    """The target's top-k next-token probabilities at every position of each sequence (teacher forcing).
    Returns [(indices (L, k) int32, probs (L, k) float16)] aligned with ``sequences`` (position i predicts
    token i+1)."""
    from ..show import progress_bar

    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    out = [None] * len(sequences)
    device = target.device
    for start in progress_bar(range(0, len(order), batch_size), desc="teacher top-k", disable=not progress):
        idx = order[start: start + batch_size]
        ids, mask = padded([sequences[i][0] for i in idx])
        logits = target(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        top = logits.softmax(-1).topk(k, dim=-1)
        for r, i in enumerate(idx):
            n = len(sequences[i][0])
            out[i] = (top.indices[r, :n].int().cpu(), top.values[r, :n].half().cpu())
    return out


def _batch(sequences, soft, rows, pad_id: int):
    ids, mask = padded([sequences[i][0] for i in rows], pad_id)
    L, k = ids.shape[1], soft[rows[0]][0].shape[1]
    loss_mask = torch.zeros(len(rows), L, dtype=torch.bool)  # positions whose next token is a reply token
    soft_idx = torch.zeros(len(rows), L, k, dtype=torch.long)
    soft_p = torch.zeros(len(rows), L, k)
    for r, i in enumerate(rows):
        tokens, reply_start = sequences[i]
        n = len(tokens)
        loss_mask[r, reply_start - 1: n - 1] = True
        soft_idx[r, :n], soft_p[r, :n] = soft[i][0].long(), soft[i][1].float()
    return ids, mask, loss_mask, soft_idx, soft_p


def draft_loss(draft, ids, mask, loss_mask, soft_idx, soft_p, soft_weight: float, support: torch.Tensor):
    """0.5 CE on the target's tokens + 0.5 CE against the target's renormalised top-k, at the reply positions;
    also greedy agreement (draft argmax == target's top-1).

    For speed the softmax runs over a support (the frequent tokens plus every token this batch's labels name)
    rather than all 49,152: the output layer and its softmax dominate the cost of a step."""
    hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state[loss_mask]  # (N, H)
    next_tokens = ids[:, 1:][loss_mask[:, :-1]]  # (N,)
    t_idx, t_p = soft_idx[loss_mask], soft_p[loss_mask]  # (N, k)
    support = torch.unique(torch.cat([support, next_tokens, t_idx.flatten()]))  # (S,)
    lookup = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
    lookup[support] = torch.arange(len(support))
    weight = draft.get_output_embeddings().weight[support]  # (S, H)
    logp = F.log_softmax((hidden @ weight.T).float(), dim=-1)  # (N, S)
    hard = F.nll_loss(logp, lookup[next_tokens])
    t_p = t_p / t_p.sum(-1, keepdim=True)
    soft_ce = -(t_p * logp.gather(-1, lookup[t_idx])).sum(-1).mean()
    agree = (support[logp.argmax(-1)] == t_idx[:, 0]).float().mean()
    return (1 - soft_weight) * hard + soft_weight * soft_ce, hard.detach(), soft_ce.detach(), agree.detach()


def train_draft(draft, sequences, soft, cfg: TrainConfig, out_dir: Path, progress: bool = True,
                log_path: Path | None = None, max_minutes: float | None = None, resume: bool = False) -> list[dict]:
    """Train ``draft`` in place with ``loop.TrainingLoop``; saves it (float16 safetensors) to out_dir every eval
    and at the end (and to ``log_path``, when given, its log). ``resume``: keep a ``training_state.pt`` in out_dir
    and continue from it when one is there. Returns the log: step, train loss, held-out hard/soft CE and greedy
    agreement with the target."""
    g = torch.Generator().manual_seed(cfg.seed)
    held, train = heldout_split(len(sequences), cfg.heldout_fraction, g)  # g then draws the batches
    pad = draft.config.pad_token_id or 0
    support = frequent_tokens([sequences[i] for i in train], draft.config.vocab_size)

    def sample(generator):
        return _batch(sequences, soft, [train[int(j)] for j in torch.randint(len(train), (cfg.batch_size,),
                                                                              generator=generator)], pad)

    def save():
        save_draft(draft, out_dir, cfg=cfg)
        if log_path is not None:
            write_log(log_path, loop.log)

    loop = TrainingLoop(draft, lambda batch: draft_loss(draft, *batch, cfg.soft_weight, support)[0], sample,
                        lambda: heldout_metrics(draft, sequences, soft, held, cfg, support),
                        LoopConfig.of(cfg, (0.9, 0.98), max_minutes), save, out_dir, keep_state=resume, generator=g,
                        desc="draft training")
    if resume:
        loop.resume()
    return loop.run(progress)


@torch.no_grad()
def heldout_metrics(draft, sequences, soft, held, cfg: TrainConfig, support) -> dict:
    """Mean hard CE, soft CE and greedy agreement over the held-out records (the training loop runs it in eval
    mode)."""
    pad = draft.config.pad_token_id or 0

    def metrics_of(rows):
        _, hard, soft_ce, agree = draft_loss(draft, *_batch(sequences, soft, rows, pad), cfg.soft_weight, support)
        return {"heldout_hard_ce": hard, "heldout_soft_ce": soft_ce, "heldout_agreement": agree}
    return mean_over_chunks(held, cfg.batch_size, metrics_of)


def save_draft(draft, out_dir: Path, log=None, cfg: TrainConfig | None = None) -> None:
    """float16 weights (half the disk; loaded back as float32 on the CPU by ``load_model``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    half = type(draft)(draft.config).half()
    half.load_state_dict(draft.state_dict())
    half.save_pretrained(out_dir)
    if log is not None:
        write_log(out_dir / LOG_FILE, log)
    if cfg is not None:
        write_config(out_dir / CONFIG_FILE, cfg)


def load_trained(out_dir: Path, device: str = "cpu"):
    """(draft in float32 and eval mode, its ``TrainConfig``, its log) from a finished checkpoint folder, as
    ``train_draft`` saved it; nothing is written. A missing or incomplete folder is refused, saying what to do."""
    from transformers import AutoModelForCausalLM

    out_dir = require_checkpoint(out_dir, DRAFT_FILES, "draft")
    draft = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    return draft, read_config(out_dir / CONFIG_FILE, TrainConfig), read_log(out_dir / LOG_FILE)


def directory_megabytes(path: Path) -> float:
    """Size of the files directly in ``path``, in MB (the draft's folder has a 25 MB budget)."""
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file()) / 1e6
