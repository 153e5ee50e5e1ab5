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
round brings what its walk needs to the host in one transfer (``tree.py``). ``instruments.host_reads`` counts them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .drafter import Drafter
from .lm import feed_unseen
from .stats import Clock, Generation, GenerationStats
from .sampling import (SamplingParams, greedy_tokens, has_weight, probs_from_logits, refuse_without_weight, sample,
                       seen_mask)
from .tree import (attention_mask, compact_indices, positions, tree_outcome_distribution, verify_tree,
                   verify_tree_greedy)
from .verify import outcome_distribution, verify, verify_greedy


@dataclass
class Request:
    """What the loop runs on, once a request passed its checks (``requests.check_generation``)."""

    target_lm: object  # the target's wrapper (``lm.py``)
    drafter: Drafter | None  # the drafter at this request's sampling (None: plain decoding)
    input_ids: torch.Tensor  # (B, T) long, without the columns that are padding in every row
    padding: list[int] | None  # each row's left pads (None: no row has any)
    eos: list[int]  # the token ids that end a row


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
        one limit, or each row's; ``eos``: the token ids that end a row (``requests.end_tokens``)."""
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
        """Each row's new tokens so far, cut at its max_new_tokens and just after its first EOS; one read."""
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


def read_together(*values: torch.Tensor | None) -> list:
    """The round's one host read: (B,) tensors (None: skipped) copied together, each back as a list of ints."""
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
def run_speculative(request: Request, gamma: int, max_new_tokens: int | list, sampling: SamplingParams, seed: int,
                    timed: bool, verifier: Verifier, on_round: Callable[[list], None] | None) -> Generation:
    """The speculative loop over a checked ``request`` (``generate.speculative_generate`` is its entry)."""
    target_lm, drafter, input_ids, padding, eos = (request.target_lm, request.drafter, request.input_ids,
                                                   request.padding, request.eos)
    one_round = tree_round if drafter.proposes_trees else chain_round

    clock, stats = Clock(target_lm.device, synchronize=timed), GenerationStats()
    start = clock.now()
    input_ids = input_ids.to(target_lm.device)
    run = Decoding.start(input_ids, max_new_tokens, 2 * gamma + 2, eos)
    generator = torch.Generator(device=target_lm.device).manual_seed(seed)
    target_lm.reset(input_ids.shape[0], padding=padding, tokens=run.seq.shape[1])
    drafter.begin(input_ids, padding=padding, tokens=run.seq.shape[1])
    while not run.done:
        one_round(target_lm, drafter, run, gamma, sampling, generator, stats, clock, verifier)
        if on_round is not None and on_round(run.emitted()):
            break
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
    target_lm.crop(kept)
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

    # 2) target: the unseen tokens (the root last), then the nodes under the tree mask (a lone root: a plain feed)
    cached = target_lm.cache_lengths()[0]
    prefix = L - cached
    tokens = torch.cat([seq[:, cached:L], tree.tokens[1:].to(seq.device)[None]], dim=1)
    dtype = getattr(getattr(target_lm, "model", None), "dtype", torch.float32)
    layers = {"hidden_layers": drafter.feature_layers} if drafter.uses_target_features else {}
    out = target_lm.feed(tokens, num_logits=1, **layers) if tree.size == 1 else target_lm.feed_tree(
        tokens, attention_mask(tree, cached, prefix, dtype, seq.device), positions(tree, cached, prefix, seq.device),
        **layers)
    logits, hidden = out if layers else (out, None)
    node_logits = logits[0, -tree.size:]  # (n, V): the root and every node

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


def run_plain(request: Request, max_new_tokens: int | list, sampling: SamplingParams, seed: int, timed: bool,
              on_round: Callable[[list], None] | None) -> Generation:
    """The baseline, one target forward per token, over a checked ``request`` (``generate.autoregressive_generate``
    is its entry): the same wrapper, sampling rule and generator as the speculative loop."""
    target_lm, input_ids, padding, eos = request.target_lm, request.input_ids, request.padding, request.eos
    clock, stats = Clock(target_lm.device, synchronize=timed), GenerationStats()
    start = clock.now()
    run = Decoding.start(input_ids.to(target_lm.device), max_new_tokens, 4, eos)
    generator = torch.Generator(device=target_lm.device).manual_seed(seed)
    target_lm.reset(run.seq.shape[0], padding=padding, tokens=run.seq.shape[1])
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
        target_lm.crop([size - 1 for size in run.sizes])  # finished rows forget the token they were fed
        stats.record([], [], 0.0, clock.now() - t0)
        if on_round is not None and on_round(run.emitted()):
            break
    stats.accepted_lengths = [1] * stats.rounds  # one token a round
    return run.finish(stats, clock, start)
