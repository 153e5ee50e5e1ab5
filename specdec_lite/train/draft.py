"""A small draft model for a target, trained from the target alone (issue: trained draft).

Recipe (run by ``notebooks/00_train_draft.ipynb``):
1. target-made text (``corpus.py``): replies the target wrote to template-made instructions;
2. soft labels: the target's top-k next-token probabilities at every reply position, by teacher forcing;
3. a small Llama with the target's tokenizer (tied embeddings initialised by PCA of the target's), trained on
   0.5 * cross-entropy on the target's own tokens + 0.5 * cross-entropy against the top-k soft labels.
The result is a plain transformers model (``save_pretrained``), usable as a draft anywhere.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..repro.report import to_markdown
from .batching import padded


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
    from tqdm.auto import tqdm

    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    out = [None] * len(sequences)
    device = target.device
    for start in tqdm(range(0, len(order), batch_size), desc="teacher top-k", disable=not progress):
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


def frequent_tokens(sequences, vocab_size: int, n: int = 8192) -> torch.Tensor:
    """The n most frequent reply tokens of the training text (8,192 cover about 99.9% of it)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for tokens, reply_start in sequences:
        counts += torch.bincount(tokens[reply_start:], minlength=vocab_size)
    return counts.topk(min(n, vocab_size)).indices


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


def warmup_cosine(step: int, warmup: int, steps: int) -> float:
    """Learning-rate factor at ``step``: linear warm-up over ``warmup`` steps, cosine decay to 0 at ``steps``."""
    return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


def train_draft(draft, sequences, soft, cfg: TrainConfig, out_dir: Path, progress: bool = True,
                log_path: Path | None = None, max_minutes: float | None = None) -> list[dict]:
    """Train ``draft`` in place; saves it (float16 safetensors) to out_dir every eval and at the end.
    Returns the log: step, train loss, held-out hard/soft CE and greedy agreement with the target."""
    from tqdm.auto import tqdm

    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(sequences), generator=g).tolist()
    n_held = max(1, int(len(perm) * cfg.heldout_fraction))
    held, train = perm[:n_held], perm[n_held:]
    pad = draft.config.pad_token_id or 0
    support = frequent_tokens([sequences[i] for i in train], draft.config.vocab_size)
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, cfg.warmup, cfg.steps))
    log, started = [], time.monotonic()
    draft.train()
    bar = tqdm(range(cfg.steps), desc="draft training", disable=not progress)
    for step in bar:
        rows = [train[int(j)] for j in torch.randint(len(train), (cfg.batch_size,), generator=g)]
        loss, hard, soft_ce, agree = draft_loss(draft, *_batch(sequences, soft, rows, pad), cfg.soft_weight, support)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        last = step == cfg.steps - 1 or (max_minutes is not None and time.monotonic() - started > 60 * max_minutes)
        if (step + 1) % cfg.eval_every == 0 or last:
            entry = {"step": step + 1, "train_loss": float(loss.detach()),
                     **heldout_metrics(draft, sequences, soft, held, cfg, support),
                     "minutes": (time.monotonic() - started) / 60}
            log.append(entry)
            bar.set_postfix(agree=f"{entry['heldout_agreement']:.3f}")
            save_draft(draft, out_dir, log, cfg)
            if log_path is not None:
                Path(log_path).write_text("\n".join(json.dumps(e) for e in log) + "\n")
        if last:
            break
    draft.eval()
    return log


@torch.no_grad()
def heldout_metrics(draft, sequences, soft, held, cfg: TrainConfig, support) -> dict:
    draft.eval()
    pad = draft.config.pad_token_id or 0
    totals = np.zeros(3)
    chunks = [held[i: i + cfg.batch_size] for i in range(0, len(held), cfg.batch_size)]
    for rows in chunks:
        _, hard, soft_ce, agree = draft_loss(draft, *_batch(sequences, soft, rows, pad), cfg.soft_weight, support)
        totals += [float(hard), float(soft_ce), float(agree)]
    draft.train()
    hard, soft_ce, agree = totals / len(chunks)
    return {"heldout_hard_ce": hard, "heldout_soft_ce": soft_ce, "heldout_agreement": agree}


def save_draft(draft, out_dir: Path, log=None, cfg: TrainConfig | None = None) -> None:
    """float16 weights (half the disk; loaded back as float32 on the CPU by ``load_model``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    half = type(draft)(draft.config).half()
    half.load_state_dict(draft.state_dict())
    half.save_pretrained(out_dir)
    if log is not None:
        (out_dir / "training_log.jsonl").write_text("\n".join(json.dumps(e) for e in log) + "\n")
    if cfg is not None:
        (out_dir / "training_config.json").write_text(json.dumps(asdict(cfg), indent=1) + "\n")


def directory_megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file()) / 1e6


def write_model_card(out_dir: Path, draft, target_name: str, corpus_index: list, log: list, cfg: TrainConfig,
                     evaluation=None) -> str:
    """README.md beside the weights: architecture, size, data, steps, loss curve, held-out acceptance."""
    out_dir = Path(out_dir)
    params = sum(p.numel() for p in draft.parameters())
    c = draft.config
    reply_tokens = sum(e["gen_len"] for e in corpus_index)
    temps = sorted({e["temperature"] for e in corpus_index})
    families = sorted({e["family"] for e in corpus_index})
    lines = [
        f"# {out_dir.name}: a draft model for {target_name}", "",
        "Trained by specdec_lite (`notebooks/00_train_draft.ipynb`) from the target alone. A plain transformers "
        "Llama with the target's tokenizer: `AutoModelForCausalLM.from_pretrained(this_folder)` works anywhere.", "",
        "## Architecture",
        f"Llama, {c.num_hidden_layers} layers, width {c.hidden_size}, {c.num_attention_heads} heads "
        f"({c.num_key_value_heads} key/value), MLP {c.intermediate_size}, vocabulary {c.vocab_size} (tied input/"
        f"output embeddings, initialised by PCA of the target's). {params / 1e6:.2f} M parameters, stored in float16: "
        f"{directory_megabytes(out_dir):.1f} MB for the whole folder.", "",
        "## Training data",
        f"{len(corpus_index)} replies written by the target ({reply_tokens} reply tokens) to template-made "
        f"instructions ({', '.join(families)}; `specdec_lite/corpus.py`), sampled at temperatures {temps} "
        "(0 = greedy). None of those instructions overlaps the evaluation prompts in `data/prompts/` (a test "
        f"checks it). Labels: the target's own tokens and its top-{cfg.topk} next-token probabilities by "
        f"teacher forcing; loss = {1 - cfg.soft_weight:.1f} x cross-entropy on the tokens + {cfg.soft_weight:.1f} x "
        "cross-entropy against the renormalised top-k.", "",
        "## Training",
        f"{log[-1]['step'] if log else 0} AdamW steps of {cfg.batch_size} records (peak lr {cfg.lr}, warm-up "
        f"{cfg.warmup}, cosine), {cfg.heldout_fraction:.0%} of the records held out. Loss curve "
        "(`training_log.jsonl`):", "",
        "| step | train loss | held-out CE (tokens) | held-out CE (top-k) | held-out greedy agreement |",
        "| --- | --- | --- | --- | --- |",
    ]
    for e in log:
        lines.append(f"| {e['step']} | {e['train_loss']:.3f} | {e['heldout_hard_ce']:.3f} | "
                     f"{e['heldout_soft_ce']:.3f} | {e['heldout_agreement']:.3f} |")
    return finish_card(out_dir, lines, evaluation)


def finish_card(out_dir: Path, lines: list[str], evaluation=None) -> str:
    """Append the held-out acceptance table (when given) and write the card to ``out_dir/README.md``."""
    if evaluation is not None:
        lines = lines + ["", "## Held-out acceptance (evaluation prompts, chat template, gamma 4)", "",
                         to_markdown(evaluation)]
    text = "\n".join(lines) + "\n"
    (Path(out_dir) / "README.md").write_text(text)
    return text
