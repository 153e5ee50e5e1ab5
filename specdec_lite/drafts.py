"""Draft proposers behind one interface.

``begin(input_ids)`` prepares for a new prompt; ``propose(seq, lengths, gamma, sampling, generator)`` returns
``(tokens (B, k), q)`` with k <= gamma and q (B, k, V) the distribution each token was drawn from, or None for
point-mass drafts; ``rollback(kept)`` tells the drafter that row b's context is now ``seq[b, :kept[b] + 1]`` and
that its cache may keep at most the first ``kept[b]`` tokens (the newest token has not been fed to anyone).

``seq`` (B, T) is the loop's token buffer; row b is valid up to ``lengths[b]``.

Feature-level drafts (``heads.py``) set ``uses_target_features``; the loop then also calls
``observe(hidden, first_position)`` after each target forward with the target's last hidden states (B, n, H) of
the positions it fed, ``first_position`` onwards. The rollback that follows says which of them were kept.
"""
from __future__ import annotations

import copy

import torch

from .lm import HFCausalLM, as_language_model, feed_unseen, gather_tail, is_language_model
from .sampling import SamplingParams, probs_from_logits, sample, seen_mask


class Drafter:
    """Base class: a draft that proposes nothing (every round is then a plain target step)."""

    vocab_size: int | None = None
    uses_target_features = False

    def begin(self, input_ids: torch.Tensor) -> None:
        pass

    def observe(self, hidden: torch.Tensor, first_position: int) -> None:
        pass

    def propose(self, seq, lengths, gamma, sampling, generator):
        return seq.new_zeros(seq.shape[0], 0), None

    def rollback(self, kept: torch.Tensor) -> None:
        pass


def draw(logits, seq, lengths, drafted: list, sampling: SamplingParams, generator):
    """One draft token per row from next-token logits (B, V), after the tokens ``drafted`` so far this round:
    (token (B,), the distribution q (B, V) it was drawn from, under the same sampling settings as the target)."""
    seen = None
    if sampling.repetition_penalty != 1.0:
        so_far = torch.stack(drafted, 1) if drafted else seq.new_zeros(seq.shape[0], 0)
        seen = seen_mask(seq, lengths, so_far, logits.shape[-1])[:, -1]
    q = probs_from_logits(logits, sampling, seen)
    # greedy q is one-hot: its argmax is the draw, without a multinomial over the whole vocabulary
    return (q.argmax(-1) if sampling.greedy else sample(q, generator)), q


class ModelDraft(Drafter):
    """An independent draft model with its own KV cache: samples gamma tokens autoregressively from q."""

    def __init__(self, model):
        self.lm = as_language_model(model)
        self.vocab_size = self.lm.vocab_size

    def begin(self, input_ids: torch.Tensor) -> None:
        self.lm.reset(input_ids.shape[0])

    def propose(self, seq, lengths, gamma, sampling: SamplingParams, generator):
        # catch up on what the cache has not seen: the prompt in the first round (the prefill), then 1 token
        # after a rejection or 2 after a full acceptance
        logits = feed_unseen(self.lm, seq, lengths, num_logits=1)[:, -1]  # (B, V)
        tokens, qs = [], []
        for i in range(gamma):
            x_i, q_i = draw(logits, seq, lengths, tokens, sampling, generator)
            tokens.append(x_i)
            qs.append(q_i)
            if i < gamma - 1:
                logits = self.lm.feed(x_i[:, None])[:, -1]
        return torch.stack(tokens, 1), torch.stack(qs, 1)

    def rollback(self, kept: torch.Tensor) -> None:
        have = self.lm.cache_lengths()
        self.lm.crop(torch.minimum(have, kept.to(have.device)))


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


def _shallow_copy_module(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object that shares every parameter and submodule with ``module``."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def layer_subset_model(target: torch.nn.Module, layers: list[int]) -> torch.nn.Module:
    """The target run through a subset of its decoder layers (then its final norm and head), sharing all
    weights: no extra parameters. Works for Llama-style models (``model.model.layers``)."""
    inner = getattr(target, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise NotImplementedError(f"layer skipping needs a Llama-style model with .model.layers; "
                                  f"{type(target).__name__} has none")
    n_layers = len(inner.layers)
    if not layers or any(not 0 <= i < n_layers for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"layers must be distinct indices in 0..{n_layers - 1}, got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    new_layers = []
    for new_index, old_index in enumerate(layers):
        layer = _shallow_copy_module(inner.layers[old_index])
        attn = _shallow_copy_module(layer.self_attn)
        attn.layer_idx = new_index  # its slot in the draft's own cache
        layer._modules["self_attn"] = attn
        new_layers.append(layer)
    new_inner = _shallow_copy_module(inner)
    new_inner._modules["layers"] = torch.nn.ModuleList(new_layers)
    new_inner.config = config
    model = _shallow_copy_module(target)
    model._modules["model"] = new_inner
    model.config = config
    return model


class LayerSkipDraft(ModelDraft):
    """Self-speculation: the target's own layers, a subset of them, with their own KV cache.

    ``exit_layer=k`` keeps layers 0..k-1 (early exit); ``layers=[...]`` keeps any subset; by default the middle
    third is skipped. The final norm and output layer are the target's.
    """

    def __init__(self, target: torch.nn.Module, layers: list[int] | None = None, exit_layer: int | None = None):
        n = target.config.get_text_config(decoder=True).num_hidden_layers
        if layers is not None and exit_layer is not None:
            raise ValueError("give either layers or exit_layer, not both")
        if exit_layer is not None:
            if not 1 <= exit_layer <= n:
                raise ValueError(f"exit_layer must be in 1..{n}, got {exit_layer}")
            layers = list(range(exit_layer))
        if layers is None:
            layers = [i for i in range(n) if not n // 3 <= i < 2 * n // 3]
        self.layers = list(layers)
        target_lm = as_language_model(target)
        super().__init__(HFCausalLM(layer_subset_model(target, self.layers), vocab_size=target_lm.vocab_size))


def as_drafter(draft, target=None) -> Drafter:
    """Drafter objects pass through; models (Hugging Face or toy) become a ``ModelDraft``. A wrapper object
    given as both target and draft is copied, so that each role has its own cache."""
    if isinstance(draft, Drafter):
        return draft
    if is_language_model(draft) and draft is target:
        return ModelDraft(copy.copy(draft))
    if is_language_model(draft) or isinstance(draft, torch.nn.Module):
        return ModelDraft(draft)
    raise TypeError(f"draft must be a Hugging Face causal LM, a toy model or a Drafter, got {type(draft).__name__}")
