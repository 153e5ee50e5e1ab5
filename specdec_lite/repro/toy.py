"""Toy Markov language models behind the same protocol as the real ones (see ``lm.py``).

A first-order Markov model: the next-token distribution depends on the last token only. Their "cache" is just
the number of tokens each row has seen, so ragged batches of hundreds of thousands of rows run through the very
loop the real models run; that is what the Monte Carlo unbiasedness tests use.

Includes the toy models of the source articles (cited by id; see docs/SOURCES.md):
- article 000: 7 tokens, two-state tables (one distribution after token 0, another after any other token);
- article 004: 5 tokens, target rows drawn from Dirichlet(1) with numpy seed 42, draft = 0.6 target + 0.4 uniform.
"""
from __future__ import annotations

import numpy as np
import torch

from ..core.lm import LanguageModel


class MarkovLM(LanguageModel):
    """transition[a, b] = P(next = b | last = a); rows must sum to 1."""

    ragged_batches = True  # per-row cache lengths: batches whose rows accept different counts are fine
    supports_trees = True  # a node's logits depend on its own token only: no mask needed

    def __init__(self, transition):
        t = torch.as_tensor(np.asarray(transition, dtype=np.float64))
        if t.dim() != 2 or t.shape[0] != t.shape[1]:
            raise ValueError(f"transition must be a square (V, V) matrix, got {tuple(t.shape)}")
        if (t < 0).any() or not torch.allclose(t.sum(1), torch.ones(t.shape[0], dtype=t.dtype), atol=1e-9):
            raise ValueError("transition rows must be probability distributions (non-negative, summing to 1)")
        self.transition = t
        self.log_transition = t.log()  # -inf for impossible transitions: softmax gives them 0
        self.vocab_size = t.shape[0]
        self.lengths: list[int] = []  # tokens each row's cache holds

    def reset(self, batch_size: int, padding: list[int] | None = None, tokens: int | None = None) -> None:
        self.lengths = [0] * batch_size

    def feed(self, tokens: torch.Tensor, num_logits: int | None = None) -> torch.Tensor:
        self.lengths = [length + tokens.shape[1] for length in self.lengths]
        logits = self.log_transition[tokens]  # (B, n, V) float64
        return logits if num_logits is None else logits[:, -num_logits:]

    def feed_tree(self, tokens: torch.Tensor, mask=None, position_ids=None) -> torch.Tensor:
        """A first-order model needs no mask: a node's logits depend on its own token only."""
        return self.feed(tokens)

    def compact(self, keep: torch.Tensor) -> None:
        self.lengths = [int(keep[0]) + len(keep)] * len(self.lengths)

    def crop(self, lengths: list[int]) -> None:
        if any(new > old for new, old in zip(lengths, self.lengths)):
            raise ValueError("cannot roll a cache forward")
        self.lengths = list(lengths)

    def cache_lengths(self) -> list[int]:
        return list(self.lengths)

    def sequence_probability(self, tokens: torch.Tensor, after: int) -> torch.Tensor:
        """P(tokens | last prompt token = after) for each row of tokens (N, n): the target's exact law."""
        prev = torch.cat([torch.full((tokens.shape[0], 1), after, dtype=torch.long), tokens[:, :-1]], dim=1)
        return self.transition[prev, tokens].prod(dim=1)


def _two_state(after_zero, otherwise) -> np.ndarray:
    """7x7 transition matrix: row 0 is ``after_zero``, rows 1..6 are ``otherwise``."""
    return np.array([after_zero] + [otherwise] * 6, dtype=np.float64)


def article000_pair() -> tuple[MarkovLM, MarkovLM]:
    """(target, draft) of article 000's numerical example. The article calls the draft p and the target q;
    here, as everywhere in this package, p is the target."""
    target = _two_state([0.50, 0.18, 0.11, 0.08, 0.06, 0.04, 0.03], [0.28, 0.22, 0.16, 0.11, 0.09, 0.08, 0.06])
    draft = _two_state([0.55, 0.15, 0.10, 0.07, 0.06, 0.04, 0.03], [0.30, 0.20, 0.15, 0.12, 0.10, 0.08, 0.05])
    return MarkovLM(target), MarkovLM(draft)


def article004_pair(seed: int = 42, vocab: int = 5) -> tuple[MarkovLM, MarkovLM]:
    """(target, draft) of article 004's demo: P ~ Dirichlet(1) rows from numpy's default_rng(seed);
    Q = 0.6 P + 0.4 uniform, renormalised."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(vocab), size=vocab)
    Q = 0.6 * P + 0.4 * np.ones((vocab, vocab)) / vocab
    Q = Q / Q.sum(axis=1, keepdims=True)
    return MarkovLM(P), MarkovLM(Q)


def random_pair(vocab: int = 6, concentration: float = 0.5, seed: int = 0) -> tuple[MarkovLM, MarkovLM]:
    """Target and draft drawn independently from Dirichlet(concentration): far apart, so rejections are common
    and every branch of the verifier is exercised."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(vocab, concentration), size=vocab)
    Q = rng.dirichlet(np.full(vocab, concentration), size=vocab)
    return MarkovLM(P), MarkovLM(Q)


def truncated_top_k(lm: MarkovLM, k: int) -> MarkovLM:
    """The model whose rows keep only their k most likely tokens, renormalised: what a verifier that truncates
    the target to its top-k samples from (claim C17)."""
    t = lm.transition.clone()
    kth = t.topk(k, dim=1).values[:, -1:]
    t = torch.where(t >= kth, t, torch.zeros_like(t))
    return MarkovLM(t / t.sum(1, keepdim=True))


def constant_alpha_pair(alpha: float) -> tuple[MarkovLM, MarkovLM]:
    """Context-free target p = (alpha, 1 - alpha, 0) and draft q = (alpha, 0, 1 - alpha): every position's
    acceptance probability (the overlap) is exactly alpha. The loop on this pair simulates any (alpha, gamma)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    p = torch.tensor([alpha, 1 - alpha, 0.0], dtype=torch.float64).repeat(3, 1)
    q = torch.tensor([alpha, 0.0, 1 - alpha], dtype=torch.float64).repeat(3, 1)
    return MarkovLM(p), MarkovLM(q)
