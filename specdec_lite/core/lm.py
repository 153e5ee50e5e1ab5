"""One small protocol every model is wrapped in (``LanguageModel``), so toy models, tiny random models and real
models run the same loop:

- ``reset(batch_size, padding=None, tokens=None)``: empty cache; ``padding``: each row's left pads (a left-padded
  batch, as ``generate`` takes it); ``tokens``: the most a row will hold (a preallocated cache is sized to it);
- ``feed(tokens, num_logits=None)``: append tokens (B, n), return logits (B, n, V) of the fed positions (the last
  ``num_logits``); Hugging Face models also take ``hidden_layers=(...)`` and then return (logits, those layers'
  hidden states (B, n, layers x H), -1 being the last, after the final norm): what feature-level drafts read;
- ``crop(lengths)``: roll the cache back so row b keeps its first ``lengths[b]`` tokens;
- ``cache_lengths()``: the tokens each row's cache holds (left pads included).

Lengths count positions of the loop's token buffer, where row b's prompt starts after its left pads. They are
Python ints: the loop knows every length on the host, so a round's bookkeeping reads nothing from the device.
``vocab_size`` is the width of the logits (the aligned vocabulary), ``max_length`` the context (None: unbounded); a
wrapper declares what it can do beyond the four calls (left padding, ragged batches, hidden states, token trees).

Two caches for Hugging Face models (``use_static_cache`` or ``load_model(cache=...)``): transformers' growing
``DynamicCache`` (the default; a rollback drops tensor slices), or a preallocated ``StaticCache`` sized to each
request (``static_size``), where a rollback moves each layer's length and the attention mask hides the stale
entries until they are overwritten; its short forwards can run compiled (``tuning/compiled.py``). Both run the
same loop, verifier and rollback; the static cache runs batch 1.

Batches on the dynamic cache use masked slots: every feed appends the same number of slots to every row, and
``Slots`` (``slots.py``, shared with the EAGLE head's cache) says which hold a token of the row; left pads and
rolled-back tokens are holes, trimmed when a hole in every row and compacted away when many. A token's position
is the count of its row's tokens before it (a prompt starts at 0, as with ``generate``), and the occupancy is the
forward's 2-D ``attention_mask``; all bookkeeping reads the host copy. While no row has a hole (batch 1 always)
feeds and rollbacks are the plain ones.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer, StaticLayer

from ..tokenizers import tokenizer_of
from ..tuning.compiled import CompiledForward, CompileLog
from .slots import Slots, gathered, keep_first
from ..tuning.packed_linear import has_packed_linears


class LanguageModel:
    """The protocol of the module's text. A subclass implements ``reset``, ``feed``, ``crop`` and
    ``cache_lengths`` and declares what else it can do; the request checks read these declarations."""

    vocab_size: int
    max_length: int | None = None  # the longest context it takes (None: unbounded)
    context_name = "the model's context"  # how a refusal names that limit
    device = torch.device("cpu")
    takes_padding = False  # reset's ``padding`` (left pads per row) is honoured
    ragged_batches = False  # rows may hold different numbers of tokens: batches, cropped row by row
    supports_hidden = False  # feed(..., hidden_layers=(...)) also returns hidden states (feature-level drafts)
    supports_trees = False  # feed_tree and compact: token trees

    def reset(self, batch_size: int, padding: list[int] | None = None, tokens: int | None = None) -> None:
        raise NotImplementedError

    def feed(self, tokens: torch.Tensor, num_logits: int | None = None):
        raise NotImplementedError

    def crop(self, lengths: list[int]) -> None:
        raise NotImplementedError

    def cache_lengths(self) -> list[int]:
        raise NotImplementedError


# specdec_lite's static-cache settings for a Hugging Face model are kept on the model itself (its tokenizer too:
# ``tokenizers.register_tokenizer``).
STATIC_CACHE_ATTRIBUTE = "specdec_static_cache"


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


@dataclass
class StaticState:
    """A model's preallocated caches and its compiled forward, kept across calls: CUDA graphs record the caches'
    addresses, so the same tensors must serve every generation of a size."""

    max_length: int | None  # tokens preallocated per row; None: sized to each request (``static_size``)
    compile: bool  # compile the decode forwards
    caches: dict = field(default_factory=dict)  # (role, batch size, tokens) -> StaticCache; a model drafting for
    forward: object = None  # itself has a "target" and a "draft" cache; the compiled forward is made on first use
    log: CompileLog | None = None  # announces each shape's first compiled call


EAGER_ABOVE = 16  # feeds of more tokens (the prompt) run eagerly; shorter ones (decode, verify) use the compiled forward
TREE_ROWS = (16, 64)  # compiled tree forwards are padded to one of these row counts, so that their shapes stay few
SMALLEST_STATIC = 256  # a request-sized static cache holds 256, 512, 1024, ... tokens: few sizes, few graphs


def static_size(tokens: int, limit: int | None) -> int:
    """The cache a request of ``tokens`` tokens per row gets: the smallest power-of-two multiple of
    ``SMALLEST_STATIC`` that holds them, at most ``limit`` (the model's context) when that is smaller."""
    size = SMALLEST_STATIC
    while size < tokens:
        size *= 2
    return size if limit is None else min(size, max(limit, tokens))


def use_static_cache(model: torch.nn.Module, max_length: int | None = None, compile: bool = False) -> torch.nn.Module:
    """Run ``model`` with a preallocated ``StaticCache``: of ``max_length`` tokens per row (prompt + max_new_tokens
    + gamma must fit; longer requests are refused before any work), or, with None, sized to each request
    (``static_size``). ``compile``: its decode, verification and tree forwards run compiled (``compiled.py``; a
    model whose linear layers are packed for oneDNN is refused, torch cannot compile them). The settings are kept
    on the model (``model.specdec_static_cache``); wrappers made afterwards use them. Returns the model.
    ``use_dynamic_cache`` undoes it."""
    if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
        raise ValueError(f"max_length (tokens preallocated per row) must be an integer >= 2 or None (sized to each "
                         f"request), got {max_length!r}")
    if compile and has_packed_linears(model):
        raise ValueError("this model's linear layers are packed for oneDNN, which torch's compiler cannot compile: "
                         "load it with packed_linears=False (load_model(..., cache='static', compile=True) does), or "
                         "keep compile=False")
    check_static_placement(getattr(model, "hf_device_map", None))
    setattr(model, STATIC_CACHE_ATTRIBUTE, StaticState(max_length=max_length, compile=compile))
    return model


def check_static_placement(device_map: dict | None) -> None:
    """A static cache needs every layer on an accelerator or every layer on the CPU: refuse offloaded layers."""
    placements = set(map(str, (device_map or {}).values()))
    if len(placements) > 1 and placements & {"cpu", "disk"}:
        raise ValueError(f"this model is split over {sorted(placements)}: a static cache with layers offloaded to "
                         "the CPU or disk cannot work; load it on GPUs only (device_map without 'cpu'/'disk'), or "
                         "keep the dynamic cache")


def static_state(model: torch.nn.Module) -> StaticState | None:
    """The static-cache settings of a model given to ``use_static_cache`` (None: dynamic cache)."""
    return getattr(model, STATIC_CACHE_ATTRIBUTE, None)


def use_dynamic_cache(model: torch.nn.Module) -> torch.nn.Module:
    """Back to transformers' growing ``DynamicCache`` (the default)."""
    if static_state(model) is not None:
        delattr(model, STATIC_CACHE_ATTRIBUTE)
    return model


def selected_hidden(hidden_states: tuple, layers: tuple) -> torch.Tensor:
    """transformers' ``hidden_states`` (the embeddings, then each layer's output; the last entry is after the
    final norm, the output layer's input) at ``layers``, concatenated: (B, n, len(layers) * H)."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: transformers 5.24 renamed ``past_key_values`` to ``cache``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def check_full_attention(cache, layer_kind: type, model: torch.nn.Module, why: str) -> None:
    """Refuse a cache with layers other than ``layer_kind`` (sliding window or linear attention): they ``why``."""
    for layer in cache.layers:
        if type(layer) is not layer_kind:
            raise NotImplementedError(f"{type(model).__name__} uses {type(layer).__name__} cache layers (sliding "
                                      f"window or linear attention), which {why}; use a full-attention model")


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model takes its input: its input embeddings' device (models split over devices included)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return embeddings.weight.device if embeddings is not None else model.device


class HFCausalLM(LanguageModel):
    """Any Hugging Face causal LM; the KV cache is transformers' ``DynamicCache``, or a ``StaticCache`` for models
    given to ``use_static_cache``; both roll back with ``crop`` (a negative count). On the dynamic cache, rows may
    hold different numbers of tokens (masked slots, see the module's text)."""

    takes_padding = True
    supports_hidden = True
    supports_trees = True
    compact_min = Slots.compact_min  # compact when at least this many slots, and more than a quarter of them, can go

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None, role: str = "target"):
        self.model = model
        self.role = role  # which of a model's static caches this wrapper uses ("target" or "draft")
        self.vocab_size = vocab_size or usable_vocab_size(model)
        self.max_length = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
        self.static = static_state(model)
        self.ragged_batches = self.static is None  # the static cache runs one prompt at a time
        if self.static is not None and self.static.max_length is not None:
            self.max_length = min(self.max_length or self.static.max_length, self.static.max_length)
            self.context_name = f"the static cache's {self.static.max_length} preallocated tokens"
        self.cache: DynamicCache | StaticCache | None = None
        self.capacity = 0  # the static cache's tokens per row in this run
        self._cache_kwarg = cache_keyword(model)
        self.length = 0  # slots in the cache, the same for every row (a row's tokens, while there is no mask)
        self.batch_size = 0
        self.padding: list[int] = []  # left pads of each row (the first ``padding[b]`` tokens of its prompt)
        self.slots: Slots | None = None  # which slots hold a token of each row; None: every slot holds one
        self.rows: list[int] = []  # with a mask: each row's length (pads included), as Python ints

    @property
    def device(self) -> torch.device:
        return model_device(self.model)

    def reset(self, batch_size: int, padding: list[int] | None = None, tokens: int | None = None) -> None:
        """An empty cache for ``batch_size`` rows; ``padding``: each row's count of left pads (Python ints), which
        come with the first feed (the prompt) and are masked out; ``tokens``: the most a row will hold (a static
        cache sized to the request holds ``static_size(tokens)``)."""
        if padding is not None and (len(padding) != batch_size or min(padding) < 0):
            raise ValueError(f"padding must give {batch_size} counts >= 0 (left pads per row), got {padding}")
        self.cache = self._static_cache(batch_size, tokens or 0) if self.static else \
            DynamicCache(config=self.model.config)
        check_full_attention(self.cache, StaticLayer if self.static else DynamicLayer, self.model,
                             "cannot be rolled back exactly")
        self.length = 0
        self.batch_size = batch_size
        self.input_device = self.device  # where logits go back to, looked up once per generation
        self.padding = list(padding) if padding is not None else [0] * batch_size
        self.slots = None
        if any(self.padding):
            self._start_mask(rows=[0] * batch_size)  # an empty cache holds no pads yet

    def _static_cache(self, batch_size: int, tokens: int) -> StaticCache:
        """The static cache for this run: the same tensors as the last run of its size (CUDA graphs recorded
        their addresses), its lengths back at 0."""
        self.capacity = self.static.max_length or static_size(tokens, self.max_length)
        key = (self.role, batch_size, self.capacity)
        cache = self.static.caches.get(key)
        if cache is None:
            cache = self.static.caches[key] = StaticCache(config=self.model.config, max_cache_len=self.capacity)
        elif cache.get_seq_length():
            cache.crop(-int(cache.get_seq_length()))
        return cache

    def compiles(self) -> bool:
        """Whether the next forward may run compiled: on a static cache given ``compile=True``, after the first
        forward of a generation (the prompt's, whose length varies, runs eagerly)."""
        return self.static is not None and self.static.compile and self.length > 0

    def _forward(self, n_tokens: int, tree_budget: bool = False):
        """The compiled forward for short feeds (decode, verification) and trees padded to a ``TREE_ROWS``
        budget, where ``compiles``; else the model itself."""
        state = self.static
        if not self.compiles() or (n_tokens > EAGER_ABOVE and not tree_budget):
            return self.model
        if state.forward is None:
            state.forward = CompiledForward(self.model, self.device)
            state.log = CompileLog(type(self.model).__name__)
        return state.forward

    def _run(self, forward, what: str, **inputs):
        """``forward(**inputs)``; a compiled forward's first call of each shape is announced (``CompileLog``)."""
        if forward is self.model:
            return forward(**inputs)
        shape = (what, self.capacity, inputs["input_ids"].shape[1], inputs.get("logits_to_keep"),
                 inputs["output_hidden_states"])
        return self.static.log.call(forward, shape, f"{inputs['input_ids'].shape[1]} {what} on a "
                                    f"{self.capacity}-token cache", **inputs)

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor, num_logits: int | None = None, hidden_layers: tuple | None = None):
        forward = self._forward(tokens.shape[1])
        if forward is not self.model:  # a slice of the token buffer keeps its strides: a new graph for each width
            tokens = tokens.clone(memory_format=torch.contiguous_format)
        masked = {} if self.slots is None else self._masked_inputs(tokens.shape[1])
        # one compiled token forward returns hidden states: one graph for plain steps and resting drafters' steps
        hidden = hidden_layers is not None or (forward is not self.model and tokens.shape[1] == 1)
        out = self._run(forward, "tokens", input_ids=tokens, use_cache=True, logits_to_keep=num_logits or 0,
                        output_hidden_states=hidden, **masked, **{self._cache_kwarg: self.cache})
        self.length += tokens.shape[1]
        return self._returned(out, forward, hidden_layers)

    def _masked_inputs(self, n: int) -> dict:
        """The mask grown by the ``n`` slots about to be fed (holes where they are left pads), and the forward's
        ``attention_mask`` and ``position_ids`` (each token's position: its row's tokens before it)."""
        self.slots.append(self._fed_slots(n))
        self.rows = [row + n for row in self.rows]
        mask = self.slots.device
        positions = (mask.cumsum(1)[:, -n:] - 1).clamp(min=0)  # a pad's position is never read
        return {"attention_mask": mask, "position_ids": positions}

    def _fed_slots(self, n: int) -> torch.Tensor:
        """(B, n) host bools: which of the next ``n`` slots of each row hold a token, not a left pad."""
        if all(row >= pad for row, pad in zip(self.rows, self.padding)):
            return torch.ones(self.batch_size, n, dtype=torch.bool)
        positions = torch.tensor(self.rows)[:, None] + torch.arange(n)[None, :]  # in the token buffer
        return positions >= torch.tensor(self.padding)[:, None]

    def _returned(self, out, forward, hidden_layers: tuple | None, rows: int | None = None):
        """The logits (and the hidden states at ``hidden_layers``) of the first ``rows`` fed positions (None: all)
        where the input sits (a model split over devices returns them where its last layer sits), copied after a
        compiled forward (a CUDA-graph replay reuses its output memory)."""
        compiled = forward is not self.model
        logits = out.logits[:, :rows, : self.vocab_size].to(self.input_device, copy=compiled)
        if hidden_layers is None:
            return logits
        return logits, selected_hidden(out.hidden_states, hidden_layers)[:, :rows].to(self.input_device, copy=compiled)

    @torch.inference_mode()
    def feed_tree(self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                  hidden_layers: tuple | None = None):
        """Feed tokens (1, F) with a 4-D additive attention ``mask`` (1, 1, F, cached + F) and explicit
        ``position_ids`` (a token tree, ``tree.py``); logits (1, F, V) of every fed token (and their hidden states
        at ``hidden_layers``). On the static cache the mask is widened to the preallocated length and, when
        compiled, the rows are padded to a ``TREE_ROWS`` budget (``static_tree_inputs``); the padding's cache
        entries are dropped at once."""
        if self.slots is not None:
            raise NotImplementedError("token trees run one prompt at a time, without padding")
        F = tokens.shape[1]
        if self.static is not None:
            tokens, mask, position_ids = self.static_tree_inputs(tokens, mask, position_ids)
        forward = self._forward(tokens.shape[1], tree_budget=tokens.shape[1] in TREE_ROWS)
        out = self._run(forward, "tree rows", input_ids=tokens, attention_mask=mask, position_ids=position_ids,
                        use_cache=True, output_hidden_states=hidden_layers is not None,
                        **{self._cache_kwarg: self.cache})
        if tokens.shape[1] > F:
            self.cache.crop(F - tokens.shape[1])  # the padding rows' entries
        self.length += F
        return self._returned(out, forward, hidden_layers, rows=F)

    def tree_rows(self, F: int) -> int:
        """The rows a tree forward of ``F`` tokens runs with on the static cache: where it ``compiles``, the
        smallest ``TREE_ROWS`` budget that holds them and fits the cache (larger trees run as they are, eagerly);
        else F."""
        room = self.capacity - self.length
        if F > room:
            raise ValueError(f"a tree forward of {F} tokens after {self.length} does not fit {self.context_name}: "
                             "preallocate more (use_static_cache(model, max_length=...)) or draft smaller trees")
        budgets = [rows for rows in TREE_ROWS if F <= rows <= room] if self.compiles() else []
        return budgets[0] if budgets else F

    def static_tree_inputs(self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor):
        """(tokens, mask, positions) of a tree forward on the static cache: the mask spans the preallocated
        length (the slots past the tree are masked out), and rows padded up to ``tree_rows`` repeat the last token
        and position and see only their own slot."""
        F, rows = tokens.shape[1], self.tree_rows(tokens.shape[1])
        wide = mask.new_full((1, 1, rows, self.capacity), torch.finfo(mask.dtype).min)
        wide[..., :F, : mask.shape[-1]] = mask
        padding = torch.arange(F, rows, device=mask.device)
        wide[0, 0, padding, self.length + padding] = 0.0
        tokens = torch.cat([tokens, tokens[:, -1:].expand(1, rows - F)], dim=1)
        position_ids = torch.cat([position_ids, position_ids[:, -1:].expand(1, rows - F)], dim=1)
        return tokens, wide, position_ids

    @torch.inference_mode()
    def compact(self, keep: torch.Tensor) -> None:
        """Keep only the cache slots ``keep`` (sorted, 1-D) from ``keep[0]`` on: they move to keep[0], keep[0]+1, ...
        and everything after them is dropped (after a tree forward: the root and the accepted path)."""
        slots = keep.tolist()  # a host tensor (``tree.compact_indices``): no device read
        start, m = slots[0], len(slots)
        moved = {}  # the index on each device the cache's layers sit on, copied there once
        for layer in self.cache.layers:
            index = moved.setdefault(layer.keys.device, keep.to(layer.keys.device))
            layer.keys[:, :, start: start + m] = layer.keys[:, :, index]
            layer.values[:, :, start: start + m] = layer.values[:, :, index]
        self.crop([start + m] * self.batch_size)

    def crop(self, lengths: list[int]) -> None:
        """While there is no mask and every row keeps as many tokens, the slots past them are dropped; else the
        rows' dropped tokens become holes (``_crop_rows``)."""
        sizes = list(lengths)
        if self.slots is None:
            keep = sizes[0] - self.padding[0]
            if all(size - pad == keep for size, pad in zip(sizes, self.padding)):
                return self._crop_all(keep)
            self._start_mask(rows=self.cache_lengths())
        self._crop_rows(sizes)

    def _crop_all(self, target: int) -> None:
        """Every row keeps its first ``target`` slots."""
        if target == self.length:
            return
        if target > self.length:
            raise ValueError(f"cannot roll a cache of {self.length} tokens forward to {target}")
        self.cache.crop(target - self.length)  # a negative count removes that many tokens (static: moves the length)
        self.length = target

    def _start_mask(self, rows: list[int]) -> None:
        """Every slot holds a token of its row, which is ``rows[b]`` long: the mask from now on."""
        if self.static is not None:
            raise NotImplementedError("the static cache rolls back all rows together and takes no padding: run a "
                                      "batch on the dynamic cache (load_model(..., cache='dynamic') or "
                                      "use_dynamic_cache(model))")
        self.slots = Slots(torch.ones(self.batch_size, self.length, dtype=torch.bool), self.input_device)
        self.slots.compact_min = self.compact_min
        self.rows = list(rows)

    def _crop_rows(self, sizes: list[int]) -> None:
        """Row b keeps its first ``sizes[b]`` tokens: the others become holes; then the slots that are holes in
        every row go, the cache is compacted if that pays (``slots.py``), and the mask goes once every slot holds
        a token."""
        if sizes == self.rows:
            return
        if any(size > row for size, row in zip(sizes, self.rows)):
            raise ValueError(f"cannot roll rows of {self.rows} tokens forward to {sizes}")
        if any(size < pad for size, pad in zip(sizes, self.padding)):
            raise ValueError(f"cannot roll rows back to {sizes}, into their left padding {self.padding}")
        self._mark_holes([size - pad for size, pad in zip(sizes, self.padding)])
        self.rows = list(sizes)
        dropped = self.slots.trim()
        if dropped:
            self.cache.crop(-dropped)
            self.length -= dropped
        self._compact()
        if self.slots.full:  # every slot holds a token of its row: plain feeds again
            self.slots = None

    def _mark_holes(self, keep: list[int]) -> None:
        """Row b keeps its first ``keep[b]`` tokens; its later slots become holes."""
        self.slots.keep(keep_first(self.slots.host, torch.tensor(keep)))

    def _compact(self) -> None:
        """Pack every row's tokens to the left where that pays (``Slots.compaction``): each layer's keys and values
        gathered per row, its tokens first, in order."""
        order = self.slots.compaction()
        if order is None:
            return
        moved = {}  # the order on each device the cache's layers sit on, copied there once
        for layer in self.cache.layers:
            layer.keys, layer.values = gathered(layer.keys, order, moved), gathered(layer.values, order, moved)
        self.length = self.slots.width

    def cache_lengths(self) -> list[int]:
        """Each row's length (left pads and tokens), kept on the host: nothing is read from the device."""
        if self.slots is None:
            return [pad + self.length for pad in self.padding]
        return list(self.rows)

    def cache_seq_length(self) -> int:
        """What the transformers cache itself reports (for the cache-truth tests)."""
        return int(self.cache.get_seq_length()) if self.cache is not None else 0


def gather_tail(seq: torch.Tensor, lengths: torch.Tensor, n: int) -> torch.Tensor:
    """The last n valid tokens of each row of the token buffer seq (B, T): (B, n)."""
    idx = lengths[:, None] - n + torch.arange(n, device=seq.device)[None, :]
    return seq.gather(1, idx)


def tail(seq: torch.Tensor, lengths: list[int], n: int) -> torch.Tensor:
    """``gather_tail`` with the lengths as Python ints: a slice when the rows are equally long (always at batch 1),
    else a gather (the lengths copied to the device without waiting for it)."""
    if min(lengths) == max(lengths):
        return seq[:, lengths[0] - n: lengths[0]]
    return gather_tail(seq, torch.tensor(lengths).to(seq.device, non_blocking=True), n)


def feed_unseen(lm, seq: torch.Tensor, lengths: list[int], extra: torch.Tensor | None = None,
                num_logits: int | None = None, hidden_layers: tuple | None = None):
    """Feed the tokens of ``seq`` the cache has not seen yet (the whole prompt on the first call, then 1 or 2
    tokens), followed by ``extra`` (B, k); rows are cropped to a common count so that one forward serves all.
    ``lengths``: each row's valid length, Python ints (nothing is read from the device). Returns the logits of the
    last ``num_logits`` fed positions; with ``hidden_layers``, (logits, those hidden states of every fed position,
    each row's buffer position of its first fed token: a list of ints, ``lengths[b] - missing``)."""
    missing = max(length - have for length, have in zip(lengths, lm.cache_lengths()))
    lm.crop([length - missing for length in lengths])
    tokens = tail(seq, lengths, missing)
    if extra is not None:
        tokens = torch.cat([tokens, extra], dim=1)
    if hidden_layers is None:
        return lm.feed(tokens, num_logits=num_logits)
    logits, hidden = lm.feed(tokens, num_logits=num_logits, hidden_layers=hidden_layers)
    return logits, hidden, [length - missing for length in lengths]


def as_language_model(model, role: str = "target") -> LanguageModel:
    """Wrap a Hugging Face causal LM; pass protocol objects (toy models, wrappers) through unchanged."""
    if isinstance(model, LanguageModel):
        return model
    if isinstance(model, torch.nn.Module) and hasattr(model, "get_output_embeddings"):
        return HFCausalLM(model, role=role)
    raise TypeError(
        f"expected a Hugging Face causal LM or a specdec_lite.core.lm.LanguageModel (reset, feed, crop, "
        f"cache_lengths), got {type(model).__name__}")
