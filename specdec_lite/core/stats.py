"""What a run returns: its new tokens and statistics, and the clock that times its phases."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


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
