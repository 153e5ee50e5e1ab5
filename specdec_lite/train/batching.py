"""The most frequent reply tokens of the training text, and a head's sub-vocabulary from them (padded batches of
token sequences: ``core.decode.padded``)."""
from __future__ import annotations

import torch


def frequent_tokens(sequences, vocab_size: int, n: int = 8192) -> torch.Tensor:
    """The n most frequent reply tokens of the training text (8,192 cover about 99.9% of it)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for tokens, reply_start in sequences:
        counts += torch.bincount(tokens[reply_start:], minlength=vocab_size)
    return counts.topk(min(n, vocab_size)).indices


def draftable_tokens(sequences, vocab_size: int, n: int, eos_token_id) -> torch.Tensor:
    """A head's sub-vocabulary: the ``n`` most frequent reply tokens (``frequent_tokens``), with the end-of-sequence
    ids (an int or a list) in place of the rarest where they are missing: ending a reply must always be draftable."""
    ids = frequent_tokens(sequences, vocab_size, n)
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    missing = [e for e in eos if e not in set(ids.tolist())]
    return torch.cat([ids[: len(ids) - len(missing)], torch.tensor(missing, dtype=ids.dtype)]) if missing else ids
