"""One small protocol every model is wrapped in, so toy models, tiny random models and real models run the
same loop:

- ``reset(batch_size)``: empty cache;
- ``feed(tokens, num_logits=None)``: append tokens (B, n) to the cache, return next-token logits (B, n, V) for the
  fed positions (only the last ``num_logits`` of them when given); Hugging Face models also take
  ``return_hidden=True`` and then return (logits, last hidden states (B, n, H) of all fed positions), the
  features that feature-level drafts (``heads.py``) read;
- ``crop(lengths)``: roll the cache back so row b keeps its first ``lengths[b]`` tokens;
- ``cache_lengths()``: (B,) tokens each row's cache holds.

``vocab_size`` is the width of the logits the wrapper returns (the aligned vocabulary), ``max_length`` the
context the model supports (None: unbounded).
"""
from __future__ import annotations

import inspect
import weakref

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Tokenizers known for models: filled by ``models.load_model`` and ``register_tokenizer``; read by the
# compatibility checks. A weak mapping, so it never keeps a model alive.
_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def register_tokenizer(model: torch.nn.Module, tokenizer) -> None:
    """Tell specdec_lite which tokenizer a Hugging Face model uses (``load_model`` does this for you)."""
    _TOKENIZERS[model] = tokenizer


def tokenizer_of(model):
    try:
        return _TOKENIZERS.get(model)
    except TypeError:
        return None


def usable_vocab_size(model: torch.nn.Module) -> int:
    """Logits width we use: the tokenizer's size when it is known and smaller than the (padded) embedding."""
    width = model.get_output_embeddings().weight.shape[0]
    tok = tokenizer_of(model)
    if tok is not None:
        if len(tok) > width:
            raise ValueError(
                f"{type(model).__name__} has {width} output logits but its tokenizer has {len(tok)} tokens: "
                "the vocabulary cannot be aligned; check that the tokenizer belongs to this model")
        return len(tok)
    return width


class HFCausalLM:
    """Any Hugging Face causal LM; the KV cache is transformers' own ``DynamicCache``, rolled back with ``crop``."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        self.model = model
        self.vocab_size = vocab_size or usable_vocab_size(model)
        self.max_length = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
        self.cache: DynamicCache | None = None
        # transformers 5.24 renamed the forward's ``past_key_values`` to ``cache``; take whichever this one has
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.length = 0
        self.batch_size = 0

    @property
    def device(self) -> torch.device:
        return self.model.device

    def reset(self, batch_size: int) -> None:
        self.cache = DynamicCache(config=self.model.config)
        for layer in self.cache.layers:
            if type(layer) is not DynamicLayer:
                raise NotImplementedError(
                    f"{type(self.model).__name__} uses {type(layer).__name__} cache layers (sliding window or "
                    "linear attention), which cannot be rolled back exactly; use a full-attention model")
        self.length = 0
        self.batch_size = batch_size

    supports_hidden = True

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor, num_logits: int | None = None, return_hidden: bool = False):
        out = self.model(input_ids=tokens, use_cache=True, logits_to_keep=num_logits or 0,
                         output_hidden_states=return_hidden, **{self._cache_kwarg: self.cache})
        self.length += tokens.shape[1]
        logits = out.logits[..., : self.vocab_size]
        # the last entry of hidden_states is after the final norm: the output layer's input
        return (logits, out.hidden_states[-1]) if return_hidden else logits

    def crop(self, lengths: torch.Tensor) -> None:
        target = int(lengths.max())
        if target == self.length and int(lengths.min()) == target:
            return
        if int(lengths.min()) != target:
            raise NotImplementedError(
                "Hugging Face caches roll back all rows to one length; run real models with batch size 1 "
                "(ragged batches are supported by the toy models only)")
        if target > self.length:
            raise ValueError(f"cannot roll a cache of {self.length} tokens forward to {target}")
        self.cache.crop(target - self.length)  # transformers 5.x: a negative count removes that many tokens
        self.length = target

    def cache_lengths(self) -> torch.Tensor:
        return torch.full((self.batch_size,), self.length, dtype=torch.long)

    def cache_seq_length(self) -> int:
        """What the transformers cache itself reports (for the cache-truth tests)."""
        return self.cache.get_seq_length() if self.cache is not None else 0


def gather_tail(seq: torch.Tensor, lengths: torch.Tensor, n: int) -> torch.Tensor:
    """The last n valid tokens of each row of the token buffer seq (B, T): (B, n)."""
    idx = lengths[:, None] - n + torch.arange(n, device=seq.device)[None, :]
    return seq.gather(1, idx)


def feed_unseen(lm, seq: torch.Tensor, lengths: torch.Tensor, extra: torch.Tensor | None = None,
                num_logits: int | None = None, return_hidden: bool = False):
    """Feed the tokens of ``seq`` the cache has not seen yet (the whole prompt on the first call, then 1 or 2
    tokens), followed by ``extra`` (B, k); rows are cropped to a common count so that one forward serves all.
    Returns the logits of the last ``num_logits`` fed positions; with ``return_hidden``, (logits, hidden states
    of every fed position, position of the first fed token)."""
    missing = int((lengths - lm.cache_lengths().to(lengths.device)).max())
    lm.crop(lengths - missing)
    tokens = gather_tail(seq, lengths, missing)
    if extra is not None:
        tokens = torch.cat([tokens, extra], dim=1)
    if not return_hidden:
        return lm.feed(tokens, num_logits=num_logits)
    logits, hidden = lm.feed(tokens, num_logits=num_logits, return_hidden=True)
    return logits, hidden, int(lengths.max()) - missing


def is_language_model(obj) -> bool:
    return all(hasattr(obj, name) for name in ("reset", "feed", "crop", "cache_lengths", "vocab_size"))


def as_language_model(model) -> "HFCausalLM":
    """Wrap a Hugging Face causal LM; pass protocol objects (toy models, wrappers) through unchanged."""
    if is_language_model(model):
        return model
    if isinstance(model, torch.nn.Module) and hasattr(model, "get_output_embeddings"):
        return HFCausalLM(model)
    raise TypeError(
        f"expected a Hugging Face causal LM or an object with reset/feed/crop/cache_lengths/vocab_size, "
        f"got {type(model).__name__}")
