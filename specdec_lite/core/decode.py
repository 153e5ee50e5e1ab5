"""The speculative loop and the autoregressive baseline, through the same model wrappers.

One round, as in Leviathan et al. 2023 (Algorithm 1):
  draft   -> gamma tokens x_1..x_gamma and the distributions q they were drawn from
  target  -> one forward over (newest token, x_1..x_gamma): p for gamma+1 positions
  verify  -> n accepted drafts plus one corrected (or bonus) token
  emit    -> x_1..x_n, next
  rollback-> both caches keep only what was emitted, minus the newest token, which is fed next round
There is no separate prefill: in the first round the "newest token" is the whole prompt, so the prompt is
processed in the same forward that verifies the first drafts (as transformers' generate does).

Host reads: on a GPU every value read into Python waits for the device. A round reads what it decided once,
together (a chain round: the accepted counts and the EOS flags; plus the verifier's check of the distributions it
samples at T > 0), and keeps every length on the host as well, so that crops, statistics and the loop's end need
no other read; a plain step reads at most one flag (an EOS, or at T > 0 a row that cannot be sampled); a tree
round brings what its walk needs to the host in one transfer (``tree.py``). ``core.host_reads`` counts them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .drafter import Drafter, as_drafter
from .lm import as_language_model, cached_lengths, crop_to, feed_unseen, tokenizer_of
from .tokenizers import check_tokenizers
from .sampling import (SamplingParams, greedy_tokens, has_weight, probs_from_logits, refuse_without_weight, sample,
                       seen_mask)
from .tree import (attention_mask, compact_indices, positions, tree_outcome_distribution, verify_tree,
                   verify_tree_greedy)
from .verify import outcome_distribution, verify, verify_greedy


@dataclass(frozen=True)
class Verifier:
    """What checks the drafts at T > 0, as the loop samples it and as its exact law: a chain's ``verify`` and
    ``outcome_distribution``, a token tree's ``verify_tree`` and ``tree_outcome_distribution``, and the cache slots
    a tree round keeps. The default is the exact one; the mutation tests hand the loop and the enumeration broken
    ones (``repro/mutants.py``)."""

    chain: Callable = verify
    chain_law: Callable = outcome_distribution
    tree: Callable = verify_tree
    tree_law: Callable = tree_outcome_distribution
    keep: Callable = compact_indices


EXACT = Verifier()


@dataclass
class GenerationStats:
    """Per-run statistics. An 'accepted length' counts the tokens one round emitted, the corrected or bonus
    token included (so it is >= 1), as vLLM and Spec-Bench count it."""

    rounds: int = 0  # target forwards (the first one also processes the prompt)
    accepted_lengths: list = field(default_factory=list)  # per round and active row: accepted drafts + 1
    proposed_lengths: list = field(default_factory=list)  # per round and active row: drafts proposed (<= gamma)
    tree_depths: list = field(default_factory=list)  # per round (token trees only): depth of the proposed tree
    drafted: int = 0  # draft tokens (tree nodes) proposed to the verifier
    accepted: int = 0  # draft tokens the verifier accepted
    new_tokens: int = 0  # tokens returned (after max_new_tokens and EOS truncation), all rows
    draft_seconds: float = 0.0  # the first round includes each model's prompt forward (the prefill)
    target_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (the empirical alpha); nan when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens emitted per round, bonus/corrected token included."""
        return sum(self.accepted_lengths) / len(self.accepted_lengths) if self.accepted_lengths else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else float("nan")

    def record(self, accepted: list, proposed: list, draft_seconds: float, target_seconds: float,
               depth: int | None = None) -> None:
        """One round: per active row, the drafts accepted and proposed; the round's timings; a tree's depth."""
        self.rounds += 1
        self.drafted += sum(proposed)
        self.accepted += sum(accepted)
        self.accepted_lengths.extend(n + 1 for n in accepted)
        self.proposed_lengths.extend(proposed)
        if depth is not None:
            self.tree_depths.append(depth)
        self.draft_seconds += draft_seconds
        self.target_seconds += target_seconds


@dataclass
class Generation:
    sequences: list  # one 1-D LongTensor of new tokens per batch row
    stats: GenerationStats

    @property
    def tokens(self) -> torch.Tensor:
        """The new tokens (1-D) of a batch-1 run."""
        if len(self.sequences) != 1:
            raise ValueError(f"this run has {len(self.sequences)} rows; use .sequences")
        return self.sequences[0]


class Clock:
    """Wall time of a phase. With ``synchronize`` (the default) it waits for CUDA, so asynchronous kernels are
    charged to the right phase; without it a round costs no synchronization and the per-phase times of a GPU
    run mean little (the total is still measured after a final synchronization)."""

    def __init__(self, device: torch.device, synchronize: bool = True):
        self.cuda = torch.device(device).type == "cuda"
        self.synchronize = synchronize

    def now(self) -> float:
        if self.cuda and self.synchronize:
            torch.cuda.synchronize()
        return time.perf_counter()

    def total(self, start: float) -> float:
        """Seconds since ``start``, all queued work included."""
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start


def context_limit(*lms) -> tuple[int | None, str]:
    """The tightest context among the models (and static caches) of a run, and how to name it."""
    limits = [(lm.max_length, getattr(lm, "context_name", "the model's context")) for lm in lms
              if lm is not None and getattr(lm, "max_length", None) is not None]
    return min(limits, key=lambda item: item[0]) if limits else (None, "the model's context")


# ---------------------------------------------------------------- what is refused, before any work
def check_request(input_ids, max_length, gamma: int, max_new_tokens: int | list, sampling,
                  context_name: str = "the model's context") -> torch.Tensor:
    """Refuse bad requests before any work starts. Returns input_ids as (B, T) long. ``max_new_tokens``: an
    integer, or a list of them, each row's own (a server's batch of requests)."""
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per round) must be an integer >= 1, got {gamma!r}")
    limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens]
    if not limits or not all(isinstance(n, int) and n >= 1 for n in limits):
        raise ValueError(f"max_new_tokens must be an integer >= 1 (or a list of them, one per row), got "
                         f"{max_new_tokens!r}")
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}); give at least one prompt token, "
                         "e.g. the tokenizer's BOS token")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise TypeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if isinstance(max_new_tokens, (list, tuple)) and len(limits) != input_ids.shape[0]:
        raise ValueError(f"max_new_tokens gives {len(limits)} limits for {input_ids.shape[0]} rows: give one per row")
    max_new_tokens = max(limits)  # the context must hold the longest row
    if max_length is not None:
        T = input_ids.shape[1]
        if T >= max_length:
            raise ValueError(f"the input has {T} tokens but {context_name} is {max_length}; shorten the prompt")
        if T + max_new_tokens + gamma > max_length:
            raise ValueError(f"{T} prompt tokens + max_new_tokens {max_new_tokens} + gamma {gamma} exceed "
                             f"{context_name} ({max_length}); lower max_new_tokens to at most "
                             f"{max_length - T - gamma}, or preallocate more (use_static_cache(model, max_length=...))")
    return input_ids.long()


def padded(token_lists, pad_id: int = 0, left: bool = False):
    """(B, L) ids and their attention mask for a list of 1-D token sequences (tensors or lists), right-padded
    (teacher forcing, training), or with ``left`` left-padded (every sequence ends in the last column: prompts that
    decode together, as ``speculative_generate`` takes them with their ``attention_mask``)."""
    L = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(token_lists), L, dtype=torch.long)
    for r, tokens in enumerate(token_lists):
        span = slice(L - len(tokens), L) if left else slice(0, len(tokens))
        ids[r, span], mask[r, span] = torch.as_tensor(tokens), 1
    return ids, mask


def check_padding(input_ids: torch.Tensor, attention_mask, target,
                  sampling: SamplingParams) -> tuple[torch.Tensor, list[int] | None]:
    """A left-padded batch comes with its ``attention_mask`` (B, T) of 0 (pad) and 1 (token), as transformers'
    ``generate`` takes it. Refuses a mask that cannot be one (its shape, its values, padding on the right, a row
    without tokens), a batch that looks padded but has no mask, and padding with a repetition penalty (the pads
    would count as tokens the row has seen). Returns input_ids without the columns that are
    padding in every row, and each row's count of left pads (None: no row has any), as Python ints."""
    if attention_mask is None:
        check_unmasked_padding(input_ids, target)
        return input_ids, None
    mask = torch.as_tensor(attention_mask)
    mask = mask[None, :] if mask.dim() == 1 else mask
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(input_ids.shape)}: pass "
                         "the attention_mask the tokenizer returned with these input_ids")
    rows = mask.tolist()  # read once, before any work
    for b, row in enumerate(rows):
        if any(value not in (0, 1) for value in row):
            raise ValueError(f"attention_mask must hold 0 (padding) and 1 (token) only, row {b} holds "
                             f"{sorted(set(row) - {0, 1})}: pass the tokenizer's attention_mask")
        if 1 not in row:
            raise ValueError(f"row {b} of attention_mask is all zeros: every prompt needs at least one token")
        if 0 in row[row.index(1):]:
            raise ValueError(f"row {b} of attention_mask has padding after its tokens: pad on the left, as for "
                             "generate (tokenizer(..., padding_side='left'), or tokenizer.padding_side = 'left')")
    pads = [row.index(1) for row in rows]
    common = min(pads)
    pads = [pad - common for pad in pads]
    if any(pads) and sampling.repetition_penalty != 1.0:
        raise NotImplementedError("repetition_penalty with left-padded rows is not implemented (the pads would count "
                                  "as tokens the row has seen): batch prompts of equal length, run them one at a "
                                  "time, or use repetition_penalty=1.0")
    return input_ids[:, common:], (pads if any(pads) else None)


def check_unmasked_padding(input_ids: torch.Tensor, target) -> None:
    """Refuse a batch without a mask where some rows, not all, start with the target's pad token (its
    tokenizer's, or its generation config's): a left-padded batch given without its attention_mask."""
    pad = pad_token_of(target)
    if input_ids.shape[0] < 2 or pad is None:
        return
    starts = input_ids[:, 0].tolist()
    padded = [b for b, token in enumerate(starts) if token == pad]
    if padded and len(padded) < len(starts):
        raise ValueError(f"rows {padded} start with the pad token {pad} and others do not: a left-padded batch needs "
                         "its mask; pass attention_mask=... (what the tokenizer returned, as for generate)")


def pad_token_of(target) -> int | None:
    """The target's pad token: its registered tokenizer's, else its generation config's (None: unknown)."""
    model = hf_model_of(target)
    pad = getattr(tokenizer_of(model), "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    return pad if isinstance(pad, int) else None


def hf_model_of(target):
    """The Hugging Face model behind ``target`` (itself, or a wrapper's ``model``), or None (the toy models)."""
    return target if isinstance(target, torch.nn.Module) else getattr(target, "model", None)


def check_batch(input_ids, padding: list[int] | None, *lms) -> None:
    """Rows of a batch accept different numbers of drafts and end at different times: a batch needs wrappers whose
    rows may hold different numbers of tokens (``ragged_batches``: the toy models, Hugging Face models on the
    dynamic cache), and left padding needs wrappers that take it (``takes_padding``)."""
    B = input_ids.shape[0]
    for lm in (lm for lm in lms if lm is not None):
        if B > 1 and not getattr(lm, "ragged_batches", False):
            if getattr(lm, "static", None) is not None:
                raise NotImplementedError(
                    f"a batch of {B} prompts needs the dynamic cache (the static cache runs one prompt at a time): "
                    "load the model with load_model(..., cache='dynamic') or call use_dynamic_cache(model)")
            raise NotImplementedError(f"a batch of {B} prompts needs per-row cache lengths, which "
                                      f"{type(lm).__name__} does not keep: run it with batch size 1")
        if padding is not None and not getattr(lm, "takes_padding", False):
            raise NotImplementedError(f"{type(lm).__name__} takes no left padding: give it prompts of equal length "
                                      "(no padded rows in attention_mask)")


def check_batched_drafter(drafter: Drafter, input_ids) -> None:
    """Token trees draft for one prompt (a tree's forward, mask and walk are batch 1). Chain drafts take batches,
    feature-level ones included: ``EagleDraft`` and ``MedusaDraft`` keep each row's features, and the EAGLE head
    each row's entries under a key mask (``heads.py``)."""
    if input_ids.shape[0] > 1 and drafter.proposes_trees:
        raise NotImplementedError(
            f"{type(drafter).__name__} proposes token trees and drafts for one prompt at a time, got a batch of "
            f"{input_ids.shape[0]}: run it with batch size 1, or batch with a chain draft (a draft model, "
            "NGramDraft, LayerSkipDraft, an EAGLE or Medusa head)")


def batch_refusal(target, draft=None, sampling: SamplingParams = SamplingParams()) -> str | None:
    """Why ``target`` with ``draft`` (None: plain decoding) cannot decode a left-padded batch of prompts at
    ``sampling``, as the loop's checks would refuse it (``check_batch``, ``check_batched_drafter``); None where it
    can. A server asks before it gathers requests into a batch."""
    two = torch.zeros((2, 1), dtype=torch.long)
    target_lm = as_language_model(target)
    try:
        if draft is None:
            check_batch(two, [1, 0], target_lm)
        else:
            drafter = as_drafter(draft, target).at(sampling)
            check_batch(two, [1, 0], target_lm, getattr(drafter, "lm", None))
            check_batched_drafter(drafter, two)
    except NotImplementedError as err:
        return str(err)
    return None


def check_pair(target, target_lm, drafter: Drafter, input_ids, sampling: SamplingParams,
               padding: list[int] | None = None) -> None:
    """What a draft and a target must have in common, what a batch needs, and what token trees need; each refusal
    says what to do."""
    draft_lm = getattr(drafter, "lm", None)
    check_batch(input_ids, padding, target_lm, draft_lm)
    check_batched_drafter(drafter, input_ids)
    if drafter.vocab_size is not None and drafter.vocab_size != target_lm.vocab_size:
        raise ValueError(
            f"the draft's vocabulary ({drafter.vocab_size} tokens) cannot be aligned with the target's "
            f"({target_lm.vocab_size}); use a draft trained with the target's tokenizer")
    if draft_lm is not None and hasattr(draft_lm, "device") and draft_lm.device != target_lm.device:
        raise ValueError(f"the draft is on {draft_lm.device} but the target takes its input on {target_lm.device}; "
                         f"move the draft there first (draft.to({str(target_lm.device)!r}))")
    if drafter.uses_target_features and not getattr(target_lm, "supports_hidden", False):
        raise TypeError(f"{type(drafter).__name__} reads the target's hidden states, which "
                        f"{type(target_lm).__name__} does not provide; use a Hugging Face target")
    if drafter.proposes_trees:
        check_tree_request(input_ids, target_lm, sampling)
    draft_model = getattr(draft_lm, "model", None)  # tokenizers registered by load_model must be the same
    t_tok = tokenizer_of(target) if isinstance(target, torch.nn.Module) else None
    d_tok = tokenizer_of(draft_model) if isinstance(draft_model, torch.nn.Module) else None
    if t_tok is not None and d_tok is not None:
        check_tokenizers(t_tok, d_tok)


def check_tree_request(input_ids, target_lm, sampling: SamplingParams) -> None:
    """Token trees run at batch 1 (``check_batched_drafter``), without the repetition penalty (its per-node
    prefixes are not implemented)."""
    if sampling.repetition_penalty != 1.0:
        raise NotImplementedError("token trees do not support repetition_penalty; use a chain draft or penalty 1.0")
    if not hasattr(target_lm, "feed_tree"):
        raise TypeError(f"{type(target_lm).__name__} cannot score a token tree (no feed_tree)")


def end_tokens(target, eos_token_id=None, ignore_eos: bool = False) -> list[int]:
    """The token ids that end a row of a run on ``target``: ``eos_token_id`` when given (an id or a list of ids);
    else the target's own end-of-sequence token(s), where transformers' ``generate`` reads them
    (``generation_config.eos_token_id``, an id or a list); none for a model without a generation config (the toy
    models) or with ``ignore_eos=True`` (every run then makes exactly max_new_tokens tokens: timing, fixed-length
    statistics)."""
    if ignore_eos:
        if eos_token_id is not None:
            raise ValueError(f"eos_token_id={eos_token_id!r} and ignore_eos=True contradict each other: give "
                             "eos_token_id to stop at those tokens, or ignore_eos=True to run to max_new_tokens")
        return []
    if eos_token_id is None:
        eos_token_id = getattr(getattr(hf_model_of(target), "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return []
    ids = eos_token_id.tolist() if torch.is_tensor(eos_token_id) else eos_token_id
    return [int(e) for e in (ids if isinstance(ids, (list, tuple)) else [ids])]


# ---------------------------------------------------------------- the token buffer
def each_row(max_new_tokens: int | list, rows: int) -> list[int]:
    """Each row's max_new_tokens: the list given, or the one limit repeated."""
    return list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * rows


@dataclass
class Decoding:
    """The state both loops share: the token buffer, each row's length, and how the run ends.

    Lengths and stop flags are kept twice: on the buffer's device (``lengths``, ``finished``), where a round's
    indexing uses them, and on the host (``sizes``, ``stopped``), where the bookkeeping reads them (crops,
    statistics, the loop's end). A round moves the device copies with ``grow`` and the host ones with ``settle``,
    from what it read once."""

    seq: torch.Tensor  # (B, T + room) prompt, then the tokens emitted (and scratch past each row's length)
    lengths: torch.Tensor  # (B,) tokens in each row so far, on seq's device
    prompt_len: int
    max_new_tokens: int  # the longest row's limit (given a list: each row's own, kept in ``limits``)
    eos: list  # token ids that end a row
    sizes: list = field(init=False)  # the lengths, as Python ints
    stopped: list = field(init=False)  # (B,) rows that are done, as Python bools
    finished: torch.Tensor = field(init=False)  # the same flags, on seq's device

    def __post_init__(self):
        B, device = self.seq.shape[0], self.seq.device
        self.sizes, self.stopped = [self.prompt_len] * B, [False] * B
        self.finished = torch.zeros(B, dtype=torch.bool, device=device)
        self.eos_ids = torch.tensor(self.eos, dtype=torch.long, device=device) if self.eos else None
        self.limits = each_row(self.max_new_tokens, B)  # each row's max_new_tokens
        self.max_new_tokens = max(self.limits)
        # what grow compares with on the device: one number, or each row's where they differ
        self.row_limits = self.max_new_tokens if len(set(self.limits)) == 1 else \
            torch.tensor(self.limits, dtype=torch.long, device=device)

    @classmethod
    def start(cls, input_ids, max_new_tokens: int | list, room: int, eos: list) -> "Decoding":
        """A buffer for ``input_ids`` (B, T) with ``room`` extra slots for drafts past the end; ``max_new_tokens``:
        one limit, or each row's; ``eos``: the token ids that end a row (``end_tokens``)."""
        B, T = input_ids.shape
        most = max(each_row(max_new_tokens, B))
        # room for finished rows that keep drafting (their writes land past their length and are ignored)
        seq = torch.zeros(B, T + most + room, dtype=torch.long, device=input_ids.device)
        seq[:, :T] = input_ids
        return cls(seq, torch.full((B,), T, dtype=torch.long, device=input_ids.device), T, max_new_tokens, eos)

    @property
    def done(self) -> bool:
        return all(self.stopped)

    def grow(self, counts: torch.Tensor, width: int) -> torch.Tensor | None:
        """On the device: rows still running take the ``counts[b]`` tokens (at most ``width``) just written at
        their ends. Returns which rows emitted an end-of-sequence token among them ((B,) bool, still on the
        device), or None when no token ends a row."""
        start, running = self.lengths, ~self.finished
        # no row has stopped (known on the host): every row grows, no mask needed
        self.lengths = start + counts if not any(self.stopped) else torch.where(running, start + counts, start)
        hit = None
        if self.eos_ids is not None:
            offsets = torch.arange(width, device=self.seq.device)
            new = self.seq.gather(1, start[:, None] + offsets)
            hit = (torch.isin(new, self.eos_ids) & (offsets < counts[:, None])).any(1) & running
            self.finished = self.finished | hit
        self.finished = self.finished | (self.lengths - self.prompt_len >= self.row_limits)
        return hit

    def settle(self, counts: list[int], hit: list | None) -> list[int]:
        """On the host, from what the round read: the rows still running grow by ``counts[b]`` and stop at
        their max_new_tokens or where ``hit[b]`` (an EOS; None: none). Returns the rows that were running."""
        running = [b for b, stopped in enumerate(self.stopped) if not stopped]
        for b in running:
            self.sizes[b] += counts[b]
            self.stopped[b] = self.sizes[b] - self.prompt_len >= self.limits[b] or bool(hit and hit[b])
        return running

    def emitted(self) -> list:
        """Each row's new tokens so far, cut at its max_new_tokens and just after its first EOS (nothing after EOS
        is emitted); the buffer is read once."""
        rows = self.seq[:, self.prompt_len: self.prompt_len + self.max_new_tokens].tolist()
        out = []
        for row, size, limit in zip(rows, self.sizes, self.limits):
            new = row[: min(size - self.prompt_len, limit)]
            end = next((i + 1 for i, token in enumerate(new) if token in self.eos), len(new))
            out.append(torch.tensor(new[:end], dtype=torch.long))
        return out

    def finish(self, stats: GenerationStats, clock: Clock, start: float) -> Generation:
        """The run's ``Generation``: each row as ``emitted`` gives it."""
        out = self.emitted()
        stats.new_tokens = sum(len(s) for s in out)
        stats.total_seconds = clock.total(start)
        return Generation(out, stats)


def reset_cache(lm, batch_size: int, padding: list[int] | None) -> None:
    """An empty cache for a run; ``padding`` (left pads per row) is handed over only when some row has pads, so
    that protocol objects whose ``reset`` takes no padding run unpadded batches as before."""
    if padding is None:
        lm.reset(batch_size)
    else:
        lm.reset(batch_size, padding=padding)


def read_together(*values: torch.Tensor | None) -> list:
    """The one host read of a round: (B,) tensors (None: skipped) stacked and copied together; each comes back
    as a list of ints, None where it was None."""
    given = [v for v in values if v is not None]
    if not given:
        return [None] * len(values)
    read = iter(torch.stack([v.long() for v in given]).tolist())
    return [None if v is None else next(read) for v in values]


def greedy_choice(logits: torch.Tensor, sampling: SamplingParams, seen) -> torch.Tensor:
    """The argmax after the repetition penalty (the other settings do not move the argmax)."""
    if sampling.repetition_penalty == 1.0:
        return greedy_tokens(logits)
    return probs_from_logits(logits, sampling, seen).argmax(-1)


# ---------------------------------------------------------------- the loop
def speculative_generate(target, draft, input_ids, *, attention_mask=None, gamma: int = 4,
                         max_new_tokens: int = 128, sampling: SamplingParams = SamplingParams(), seed: int = 0,
                         eos_token_id=None, ignore_eos: bool = False, timed: bool = True, verifier: Verifier = EXACT,
                         on_round: Callable[[list], None] | None = None) -> Generation:
    """Speculative decoding: ``draft`` proposes gamma tokens, ``target`` verifies them in one forward.

    target: a Hugging Face causal LM or a toy model; draft: a Hugging Face causal LM with the target's
    tokenizer, a toy model, or a Drafter (``NGramDraft``, ``LayerSkipDraft``, a head, a tree drafter). input_ids:
    (T,) or (B, T). A batch of prompts of different lengths comes left-padded with its ``attention_mask`` (B, T), as
    transformers' ``generate`` takes it (``check_padding``); each row is decoded as it would be alone. Batches run
    on Hugging Face models on the dynamic cache (``lm.py``: masked slots) and on the toy models, with every chain
    draft, the EAGLE and Medusa heads included (each row's features and head entries are its own, ``heads.py``);
    token trees and the static cache run one prompt at a time (``check_pair``). With
    ``sampling.temperature == 0`` each row's output is the target's own greedy output, token for token (bitwise
    where the target's forwards are batch-invariant, see ``load_model``; a batch's forwards may round differently
    from a lone prompt's, so a near-tie of the argmax can part a row from it). A row ends at max_new_tokens (an
    integer, or a list: each row's own) or just after an end-of-sequence token: by default the target's own (its
    generation config's ``eos_token_id``, as transformers' ``generate``; none for the toy models), else
    ``eos_token_id`` (an id or a list);
    ``ignore_eos=True`` runs every row to max_new_tokens (equal work for timing). ``timed=False`` skips the per-round
    device synchronization (the stats' per-phase seconds then mean little on a GPU). ``verifier`` is the exact
    one unless a test hands in a broken one. ``on_round``, when given, is called after every round with each
    row's new tokens so far (``Decoding.emitted``): what a server streams as the rounds finish.
    """
    target_lm, drafter = as_language_model(target), as_drafter(draft, target).at(sampling)
    max_length, context_name = context_limit(target_lm, getattr(drafter, "lm", None))
    input_ids = check_request(input_ids, max_length, gamma, max_new_tokens, sampling, context_name)
    input_ids, padding = check_padding(input_ids, attention_mask, target, sampling)
    check_pair(target, target_lm, drafter, input_ids, sampling, padding)
    eos = end_tokens(target, eos_token_id, ignore_eos)
    one_round = tree_round if drafter.proposes_trees else chain_round

    clock, stats = Clock(target_lm.device, synchronize=timed), GenerationStats()
    start = clock.now()
    input_ids = input_ids.to(target_lm.device)
    run = Decoding.start(input_ids, max_new_tokens, 2 * gamma + 2, eos)
    generator = torch.Generator(device=target_lm.device).manual_seed(seed)
    reset_cache(target_lm, input_ids.shape[0], padding)
    if padding is None:  # drafters whose begin takes no padding run unpadded batches as before
        drafter.begin(input_ids)
    else:
        drafter.begin(input_ids, padding=padding)
    while not run.done:
        one_round(target_lm, drafter, run, gamma, sampling, generator, stats, clock, verifier)
        if on_round is not None:
            on_round(run.emitted())
    return run.finish(stats, clock, start)


def chain_round(target_lm, drafter: Drafter, run: Decoding, gamma, sampling, generator, stats, clock, verifier):
    """One round with a chain of drafts, for every row (rows already finished do not advance). Reads the accepted
    counts and the EOS flags once, together (and the verifier its check at T > 0)."""
    seq, lengths = run.seq, run.lengths
    # 1) draft: k <= gamma tokens and the q they were drawn from
    t0 = clock.now()
    drafts, q = drafter.propose(seq, lengths, gamma, sampling, generator)  # (B, k), (B, k, V) | None
    t1 = clock.now()

    # 2) target: one forward over the newest token and the drafts -> logits at k+1 positions
    k = drafts.shape[1]
    if drafter.uses_target_features:  # the draft reads the target's hidden states of this forward
        logits, hidden, first = feed_unseen(target_lm, seq, run.sizes, drafts, num_logits=k + 1,
                                            hidden_layers=drafter.feature_layers)
        drafter.observe(hidden, first)
    else:
        logits = feed_unseen(target_lm, seq, run.sizes, drafts, num_logits=k + 1)  # (B, k+1, V)
    seen = seen_mask(seq, lengths, drafts, target_lm.vocab_size) if sampling.repetition_penalty != 1 else None

    # 3) verify: n accepted drafts, then the corrected or bonus token
    if sampling.greedy:
        n, next_token = verify_greedy(drafts, greedy_choice(logits, sampling, seen))
    else:
        n, next_token = verifier.chain(drafts, q, probs_from_logits(logits, sampling, seen), generator)

    # 4) emit x_1..x_n, next_token; read what the round decided, once
    emitted = torch.cat([drafts, next_token[:, None]], dim=1)
    emitted[torch.arange(len(n), device=seq.device), n] = next_token
    seq.scatter_(1, lengths[:, None] + torch.arange(k + 1, device=seq.device)[None, :], emitted)
    n_read, hit = read_together(n, run.grow(n + 1, k + 1))
    running = run.settle([accepted + 1 for accepted in n_read], hit)

    # 5) rollback: caches keep everything but the newest token
    kept = [size - 1 for size in run.sizes]
    crop_to(target_lm, kept)
    drafter.rollback(kept)
    stats.record([n_read[b] for b in running], [k] * len(running), t1 - t0, clock.now() - t1)


def tree_round(target_lm, drafter: Drafter, run: Decoding, gamma, sampling, generator, stats, clock, verifier):
    """One round with a token tree (batch 1): propose a tree of depth <= gamma, score every node in one forward,
    walk down the accepted path, keep only its cache entries. The walk reads once (``tree.py``); the emitted
    tokens are then known on the host."""
    seq, L = run.seq, run.sizes[0]
    # 1) draft: a tree whose root is the newest token seq[L-1]
    t0 = clock.now()
    tree = drafter.propose_tree(seq, run.lengths, gamma, sampling, generator)
    t1 = clock.now()

    # 2) target: the tokens the cache has not seen (the root last), then the nodes, under the tree mask
    cached = cached_lengths(target_lm)[0]
    prefix = L - cached
    tokens = torch.cat([seq[:, cached:L], tree.tokens[1:].to(seq.device)[None]], dim=1)
    dtype = getattr(getattr(target_lm, "model", None), "dtype", torch.float32)
    mask = attention_mask(tree, cached, prefix, dtype, seq.device)
    position_ids = positions(tree, cached, prefix, seq.device)
    if drafter.uses_target_features:
        logits, hidden = target_lm.feed_tree(tokens, mask, position_ids, hidden_layers=drafter.feature_layers)
    else:
        logits = target_lm.feed_tree(tokens, mask, position_ids)
    node_logits = logits[0, prefix - 1:]  # (n, V): the root and every node

    # 3) verify: the accepted path (node indices) and the corrected or bonus token
    if sampling.greedy:
        path, next_token = verify_tree_greedy(tree, greedy_tokens(node_logits))
    else:
        path, next_token = verifier.tree(tree, probs_from_logits(node_logits, sampling), generator)

    # 4) emit the path's tokens, then next_token (known on the host: nothing to read)
    emitted = [tree.token_list[i] for i in path] + [next_token]
    seq[0, L: L + len(emitted)] = torch.tensor(emitted, device=seq.device)
    run.grow(run.lengths.new_full((1,), len(emitted)), len(emitted))
    run.settle([len(emitted)], [any(token in run.eos for token in emitted)])

    # 5) keep only the root's and the path's cache entries; the drafter sees the same
    target_lm.compact(verifier.keep(path, L - 1))
    if drafter.uses_target_features:
        rows = torch.tensor(list(range(prefix)) + [prefix - 1 + i for i in path], device=hidden.device)
        drafter.observe(hidden[:, rows], cached)
    drafter.rollback([run.sizes[0] - 1])
    stats.record([len(path)], [tree.size - 1], t1 - t0, clock.now() - t1, depth=max(tree.depth_list()))


def autoregressive_generate(target, input_ids, *, attention_mask=None, max_new_tokens: int = 128,
                            sampling: SamplingParams = SamplingParams(), seed: int = 0,
                            eos_token_id=None, ignore_eos: bool = False, timed: bool = True,
                            on_round: Callable[[list], None] | None = None) -> Generation:
    """The baseline: one target forward per token, through the same wrapper, sampling rule and generator;
    ``attention_mask`` (a left-padded batch), ``eos_token_id``, ``ignore_eos`` and ``on_round`` as in
    ``speculative_generate`` (``on_round`` is called after every token)."""
    target_lm = as_language_model(target)
    max_length, context_name = context_limit(target_lm)
    input_ids = check_request(input_ids, max_length, 1, max_new_tokens, sampling, context_name)
    input_ids, padding = check_padding(input_ids, attention_mask, target, sampling)
    check_batch(input_ids, padding, target_lm)
    eos = end_tokens(target, eos_token_id, ignore_eos)

    clock, stats = Clock(target_lm.device, synchronize=timed), GenerationStats()
    start = clock.now()
    run = Decoding.start(input_ids.to(target_lm.device), max_new_tokens, 4, eos)
    generator = torch.Generator(device=target_lm.device).manual_seed(seed)
    reset_cache(target_lm, run.seq.shape[0], padding)
    rows = torch.arange(run.seq.shape[0], device=run.seq.device)
    ones = torch.ones_like(rows)
    penalty = sampling.repetition_penalty != 1
    while not run.done:
        t0 = clock.now()
        seq, lengths = run.seq, run.lengths
        logits = feed_unseen(target_lm, seq, run.sizes, num_logits=1)  # (B, 1, V); the prompt in the first step
        seen = seen_mask(seq, lengths, seq[:, :0], target_lm.vocab_size) if penalty else None
        valid = None  # at T > 0, which rows could be sampled: read with the EOS flags, once
        if sampling.greedy:
            next_token = greedy_choice(logits, sampling, seen)[:, -1]
        else:
            probs = probs_from_logits(logits[:, -1], sampling, None if seen is None else seen[:, -1])
            next_token, valid = sample(probs, generator, check=False), has_weight(probs)
        if not any(run.stopped):  # until a row stops, every row is as long as the first: one slice
            seq[:, run.sizes[0]] = next_token
        else:
            seq[rows, lengths] = torch.where(run.finished, seq[rows, lengths], next_token)
        hit, valid = read_together(run.grow(ones, 1), valid)
        if valid is not None:
            refuse_without_weight(valid)
        run.settle([1] * len(rows), hit)
        crop_to(target_lm, [size - 1 for size in run.sizes])  # finished rows forget the token they were fed
        stats.record([], [], 0.0, clock.now() - t0)
        if on_round is not None:
            on_round(run.emitted())
    stats.accepted_lengths = [1] * stats.rounds  # one token a round
    return run.finish(stats, clock, start)
