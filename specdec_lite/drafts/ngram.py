"""Prompt lookup (n-gram) drafting: a point-mass draft that needs no model."""
from __future__ import annotations

import torch

from ..core.lm import gather_tail
from ..core.drafter import Drafter


class NGramDraft(Drafter):
    """Prompt lookup: find the most recent earlier occurrence of the context's last n tokens (n from
    ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it. A point-mass draft (q = None),
    so it is exact under the same verifier; no model, no cache."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, seq, lengths, gamma, sampling, generator):
        B, T = seq.shape
        rows = torch.arange(B, device=seq.device)
        start = torch.full((B,), -1, dtype=torch.long, device=seq.device)  # where the continuation begins
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if T <= n:
                continue
            key = gather_tail(seq, lengths.clamp(min=n), n)  # (B, n)
            windows = seq.unfold(1, n, 1)  # (B, T-n+1, n): windows[b, s] = seq[b, s:s+n]
            pos = torch.arange(windows.shape[1], device=seq.device)[None, :]
            # an earlier occurrence: it must end before the last token, so something follows it
            hit = (windows == key[:, None, :]).all(-1) & (pos + n < lengths[:, None]) & (lengths[:, None] > n)
            last_hit = torch.where(hit, pos, -1).max(dim=1).values
            found = (start < 0) & (last_hit >= 0)
            start = torch.where(found, last_hit + n, start)
        available = torch.where(start >= 0, (lengths - start).clamp(max=gamma), 0)  # (B,)
        k = int(available.max())
        if k == 0:
            return seq.new_zeros(B, 0), None
        idx = (start.clamp(min=0)[:, None] + torch.arange(k, device=seq.device)[None, :]).clamp(max=T - 1)
        tokens = seq.gather(1, idx)
        # rows with a shorter (or no) continuation repeat their last known token: any point mass is exact
        last = seq[rows, lengths - 1]
        fill = torch.arange(k, device=seq.device)[None, :] >= available[:, None]
        return torch.where(fill, last[:, None], tokens), None
