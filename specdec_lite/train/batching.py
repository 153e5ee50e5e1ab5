"""Padded batches of token sequences (right-padded for teacher forcing and training, left-padded for prefilling
prompts that then decode together); the most frequent reply tokens."""
from __future__ import annotations

import torch


def padded(token_lists, pad_id: int = 0, left: bool = False):
    """(B, L) ids and their attention mask for a list of 1-D token sequences (tensors or lists), right-padded, or
    with ``left`` left-padded (every sequence ends in the last column)."""
    L = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(token_lists), L, dtype=torch.long)
    for r, tokens in enumerate(token_lists):
        span = slice(L - len(tokens), L) if left else slice(0, len(tokens))
        ids[r, span], mask[r, span] = torch.as_tensor(tokens), 1
    return ids, mask


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
