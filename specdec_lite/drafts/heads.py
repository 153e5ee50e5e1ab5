"""Feature-level drafts: small heads that read the target's own last hidden states.

- ``EagleHead`` (Li et al. 2024, EAGLE): one small decoder layer over (target feature f_t, embedding of token
  t+1) that predicts the feature f_{t+1}; the target's own output layer turns a predicted feature into draft
  logits. It drafts autoregressively on its own predicted features, with its own KV cache.
- ``MedusaHeads`` (Cai et al. 2024, Medusa): k residual blocks on the last feature, block i predicting the token
  i+1 places after the one the target itself predicts; they share the target's output layer. Used as a chain
  draft: token i is drawn from head i's distribution.

Both output layers may be restricted to a frequency-ranked sub-vocabulary (``vocab_ids``): the draft's q is then
zero outside it. That stays exact, because the verifier is given the q the tokens were really drawn from.

Time line inside the loop (positions are token indices of the sequence; f_i is the target's feature at
position i, which its head maps to the logits of token i+1): after a round the sequence is valid up to L and
the target has produced f_0..f_{L-2} (the newest token L-1 has not been fed yet). The EAGLE head's cache then
holds real-feature entries for positions 0..h-1; a proposal feeds (f_i, token i+1) for i = h..L-2, which
predicts f'_{L-1} and so draft 1; then (f'_{L-1}, draft 1) predicts f'_L and draft 2, and so on. Entries made
from predicted features are dropped at the rollback: the next round re-feeds those positions with real ones.
Until the target has run once there are no features, so the first round proposes nothing (it is the prefill).

Every run is a batch (left-padded prompts of different lengths, rows that accept different numbers of drafts;
one prompt is a batch of one row with no holes): the same time line per row, in buffer positions, with every
length a host int (``FeatureDraft``: per-row feature counts, the loop's per-row first fed positions;
``EagleDraft``: a ``MaskedHeadCache`` whose key mask hides the pads', already made and rolled-back entries,
positions counted from each row's first real token). A row's q is the one its prompt gets alone
(tests/test_batched.py); token trees (``trees.py``) run at batch 1.

Checkpoints are folders with ``head_config.json``, ``head.safetensors`` and a model card (``README.md``);
``load_head(path_or_name, target)`` refuses a head trained for another target (hidden size, vocabulary or the
recorded fingerprint of the target's weights).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..core.drafter import Drafter, draw
from ..core.lm import selected_hidden, static_state, usable_vocab_size
from ..core.sampling import SamplingParams, probs_from_logits, seen_mask
from ..core.slots import Slots, gathered
from ..tuning.compiled import CompiledForward, CompileLog
from ..tuning.int4 import has_int4_linears
from ..tuning.int8_head import Int8Linear, quantized_copy, supports
from ..tuning.packed_linear import can_pack, has_packed_linears, linear_on, pack_linears
from ..paths import HEAD_CONFIG, is_head_dir
from .fingerprint import same_weights, weights_fingerprint, weights_probe


@dataclass
class HeadConfig:
    kind: str  # "eagle" or "medusa"
    hidden_size: int  # the target's
    vocab_size: int  # the target's usable vocabulary (logit width)
    target: str = ""  # name the target was given when the head was trained
    target_fingerprint: str = ""  # features.weights_fingerprint(target), exact (same dtype)
    target_probe: list = field(default_factory=list)  # features.weights_probe(target), survives a dtype change
    sub_vocab_size: int = 0  # size of the restricted output vocabulary; 0: the full vocabulary
    # EAGLE-style head
    num_attention_heads: int = 8
    intermediate_size: int = 1536
    rope_theta: float = 10000.0
    num_layers: int = 1  # decoder layers: one in EAGLE; a deeper head's later ones start as the identity
    feature_layers: list = field(default_factory=list)  # EAGLE-3: the target's layers it fuses; []: the last only
    # Medusa heads
    num_heads: int = 4
    extra: dict = field(default_factory=dict)  # free-form notes (training data, steps), not used by the code

    def __post_init__(self):
        if self.kind not in ("eagle", "medusa"):
            raise ValueError(f"kind must be 'eagle' or 'medusa', got {self.kind!r}")
        if self.kind == "eagle" and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.kind == "eagle" and self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.kind == "medusa" and self.num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {self.num_heads}")


# --------------------------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class KVCache:
    """Keys and values (B, heads, T, d) of one attention layer; a forward replaces them with longer ones
    (``EagleHead.forward``), a rollback slices them."""

    def __init__(self):
        self.k = self.v = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def crop(self, length: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]


class HeadCache:
    """A head's caches, one ``KVCache`` per decoder layer, always of the same length; rolled back together."""

    def __init__(self, layers: int = 1):
        self.layers = [KVCache() for _ in range(layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def crop(self, length: int) -> None:
        for cache in self.layers:
            cache.crop(length)


class MaskedHeadCache(HeadCache):
    """The drafter's head caches, for a batch whose rows hold different numbers of entries (``EagleDraft``):
    every forward appends the same number of slots to every row, and ``index`` (B, S), on the host, says what each
    slot holds: the buffer position i of its row's entry (made from (f_i, token i+1)), or -1, a hole (a left pad's
    entry, one the row had already made, a rolled-back one). Which slots hold an entry, the trims and the
    compactions follow the one slot rule of ``core.slots`` (``slots``), as the target's cache does."""

    def __init__(self, layers: int, batch_size: int, device):
        super().__init__(layers)
        self.index = torch.empty(batch_size, 0, dtype=torch.long)
        self.slots = Slots(torch.empty(batch_size, 0, dtype=torch.bool), device)

    def admit(self, index: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Slots for the next forward: ``index`` (B, n) host longs, each new slot's buffer position (-1: a hole).
        Returns the forward's attention mask (B, 1, n, S + n): new slot j sees its row's valid slots, the valid new
        ones up to itself, and itself (a hole's query sees a key, so nothing is NaN; its output is never read);
        or ``allowed`` (n, S + n) where given (a token tree's level: each node sees its ancestors)."""
        n, before = index.shape[1], self.slots.device
        new = self.slots.append(index >= 0)
        self.index = torch.cat([self.index, index], dim=1)
        if allowed is not None:
            return allowed[None, None]
        causal = torch.ones(n, n, dtype=torch.bool, device=new.device).tril()
        own = torch.eye(n, dtype=torch.bool, device=new.device)
        allowed = torch.cat([before[:, None, :].expand(-1, n, -1), (causal & new[:, None, :]) | own], dim=2)
        return allowed[:, None]

    def keep(self, counts: list[int]) -> None:
        """Row b keeps its entries of buffer positions below ``counts[b]``; the others become holes. Then the trim
        and the compaction of ``core.slots``."""
        self.index = torch.where(self.index < torch.tensor(counts)[:, None], self.index, -1)
        self.slots.keep(self.index >= 0)
        width = self.length - self.slots.trim()
        if width < self.length:
            self.crop(width)
            self.index = self.index[:, :width]
        self.compact_if_worth()

    def compact_if_worth(self) -> None:
        """Pack each row's entries to the left, in order, where ``Slots.compaction`` says it pays."""
        order = self.slots.compaction()
        if order is None:
            return
        self.index = self.index.gather(1, order)
        moved = {}  # the order on each device the layers sit on, copied there once
        for cache in self.layers:
            cache.k, cache.v = gathered(cache.k, order, moved), gathered(cache.v, order, moved)


def rotary_tables(positions, d: int, theta: float, dtype) -> tuple:
    """(cos, sin), each (n, d), of the rotary position embedding (rotate-half layout) at integer positions (n,):
    computed once per head forward and shared by its layers' queries and keys. Positions (B, n), one row of
    positions per batch row (a batch whose rows hold different numbers of tokens), give tables (B, 1, n, d)."""
    inv_freq = theta ** (-torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    if positions.dim() == 2:
        angles = positions.float()[:, None, :, None] * inv_freq  # (B, 1, n, d/2): broadcast over the heads
        return angles.cos().repeat(1, 1, 1, 2).to(dtype), angles.sin().repeat(1, 1, 1, 2).to(dtype)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (n, d/2)
    return angles.cos().repeat(1, 2).to(dtype), angles.sin().repeat(1, 2).to(dtype)


def rotate(x, rotary: tuple):
    """x (B, heads, n, d) rotated by the tables ``rotary_tables`` made for its n positions (or each row's)."""
    cos, sin = rotary
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DecoderLayer(nn.Module):
    """A pre-norm Llama-style layer: causal self-attention with RoPE, then a SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, intermediate: int, theta: float):
        super().__init__()
        self.heads, self.theta = heads, theta
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def rotary(self, positions, dtype) -> tuple:
        """The rotary tables (``rotary_tables``) of this layer's heads at ``positions`` (n,)."""
        return rotary_tables(positions, self.qkv.in_features // self.heads, self.theta, dtype)

    def forward(self, x, rotary: tuple):
        """x (B, n, H) at the positions the tables ``rotary`` were made for, each token seeing those before it."""
        q, k, v = self.project(x, rotary)
        return self.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def attend(self, x, rotary: tuple, keys, values, allowed):
        """``forward`` after earlier entries: (output, keys, values), the entries' keys and values (B, heads, T, d)
        with x's appended; new token j sees the keys ``allowed`` (n, T + n; or (B, 1, n, T + n), one mask per
        row) says."""
        q, k, v = self.project(x, rotary)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        return self.finish(x, F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)), keys, values

    def project(self, x, rotary: tuple):
        """Queries, keys and values (B, heads, n, d) of x (B, n, H), rotated to their positions (``rotary``)."""
        B, n, H = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, n, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        return rotate(q, rotary), rotate(k, rotary), v

    def finish(self, x, attended):
        """The residual stream after the attention output ``attended`` (B, heads, n, d) and the MLP."""
        B, n, H = x.shape
        x = x + self.out(attended.transpose(1, 2).reshape(B, n, H))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

    def start_as_identity(self) -> "DecoderLayer":
        """Zero the projections that write into the residual stream (attention output, MLP down), so that the layer
        passes its input through unchanged until training moves them."""
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.down.weight)
        return self


class EagleHead(nn.Module):
    """(feature f_t, embedding of token t+1) -> predicted feature f_{t+1}: a fusion, then ``cfg.num_layers`` decoder
    layers (``layer``, then ``deeper``: each starts as the identity, so a head grown from a one-layer head begins
    by predicting what that head predicts)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        H = cfg.hidden_size
        self.compiled = None  # ``step`` compiled (``compile_step``), or None: it runs eagerly
        self.fuse = nn.Linear(2 * H, H)
        self.layer = DecoderLayer(H, cfg.num_attention_heads, cfg.intermediate_size, cfg.rope_theta)
        self.deeper = nn.ModuleList(
            DecoderLayer(H, cfg.num_attention_heads, cfg.intermediate_size, cfg.rope_theta).start_as_identity()
            for _ in range(cfg.num_layers - 1))

    @property
    def layers(self) -> list[DecoderLayer]:
        return [self.layer, *self.deeper]

    def new_cache(self) -> HeadCache:
        return HeadCache(len(self.layers))

    def forward(self, features, token_embeddings, positions, cache: HeadCache | None = None, allowed=None):
        """The predicted features (B, n, H) of (features, token embeddings) (B, n, H) at ``positions`` (n,) or
        (B, n). Without a cache each token sees those before it; with one, the new entries join it and new token
        j sees its entries and the new tokens up to itself, or what ``allowed`` says (``DecoderLayer.attend``)."""
        if cache is None:
            x = self.inputs(features, token_embeddings)
            rotary = self.layer.rotary(positions, x.dtype)  # every layer has the same heads
            for layer in self.layers:
                x = layer(x, rotary)
            return self.prediction(x)
        B, n, H = features.shape
        if allowed is None:
            T = cache.length + n
            allowed = torch.arange(T, device=features.device) <= torch.arange(T - n, T, device=features.device)[:, None]
        empty = features.new_empty(B, self.layer.heads, 0, H // self.layer.heads)
        past = [(empty, empty) if c.k is None else (c.k, c.v) for c in cache.layers]
        inputs = dict(features=features, token_embeddings=token_embeddings, positions=positions, past=past,
                      allowed=allowed)
        if self.compiled is None:
            prediction, entries = self.step(**inputs)
        else:  # sizes 0 and 1 and the positions' rank get graphs of their own: each is announced once
            kind = (B, min(n, 2), min(cache.length, 2), positions.dim())
            prediction, entries = self.compile_log.call(self.compiled, kind, f"{B} row(s), {kind[1:]}", **inputs)
        for layer_cache, (keys, values) in zip(cache.layers, entries):
            layer_cache.k, layer_cache.v = keys, values
        return prediction

    def step(self, features, token_embeddings, positions, past: list, allowed):
        """``forward`` with a cache, as a function of tensors: (prediction, [(keys, values)] per layer, the
        cache's ``past`` entries with the new ones appended). Compiled by ``compile_step``."""
        x = self.inputs(features, token_embeddings)
        rotary = self.layer.rotary(positions, x.dtype)
        entries = []
        for layer, (keys, values) in zip(self.layers, past):
            x, keys, values = layer.attend(x, rotary, keys, values, allowed)
            entries.append((keys, values))
        return self.prediction(x), entries

    def compile_step(self, device: torch.device) -> None:
        """Run ``step`` compiled as ``device``'s fast path (``tuning.compiled``), its sizes dynamic: the cache grows
        by a slot per drafted token and a catch-up or a tree level feeds a varying number, which a fixed-shape
        graph would compile again for each."""
        self.compiled = CompiledForward(self.step, device, dynamic=True)
        self.compile_log = CompileLog("the EAGLE head")

    def inputs(self, features, token_embeddings):
        return self.fuse(torch.cat([features, token_embeddings.to(features.dtype)], dim=-1))

    def real_features(self, hidden):
        """What the head reads of the target's hidden states (B, n, H): the last layer's, as they are."""
        return hidden

    def prediction(self, residual):
        """The predicted feature, from the layer's residual stream: as it is."""
        return residual

    def unrolled(self, features, token_embeddings, steps: int) -> list:
        """Training-time test: the predictions of ``steps`` drafting steps at every position at once, as drafting
        makes them. features (B, n, H) real features f_0..f_{n-1} (as ``real_features`` gives them),
        token_embeddings of tokens 1..n. Step 0 reads the real features; step k reads, at position i, step k-1's
        prediction at i-1, and attends to the real entries up to i-k and to its own chain (step s's entry at
        i-k+s), as the drafter's cache holds them when it drafts its (k+1)-th token. Returns [(B, n, H)] * steps;
        at step k, positions below k mean nothing."""
        n = features.shape[1]
        positions = torch.arange(n, device=features.device)
        rotary = self.layer.rotary(positions, features.dtype)
        keys, values = [[] for _ in self.layers], [[] for _ in self.layers]  # per layer, per step
        out, fed = [], features
        for k in range(steps):
            x = self.inputs(fed, token_embeddings)
            for layer, layer_keys, layer_values in zip(self.layers, keys, values):
                q, key, value = layer.project(x, rotary)
                layer_keys.append(key)
                layer_values.append(value)
                attended = F.scaled_dot_product_attention(q, torch.cat(layer_keys, 2), torch.cat(layer_values, 2),
                                                          attn_mask=unrolled_mask(n, k, features.device))
                x = layer.finish(x, attended)
            out.append(self.prediction(x))
            fed = torch.cat([out[-1][:, :1], out[-1][:, :-1]], dim=1)  # position i reads the prediction at i-1
        return out


class FusedEagleHead(EagleHead):
    """EAGLE-3 (Li et al. 2025): the target's hidden states of a low, a middle and a high layer, each normed, fused
    into one feature (``real_features``); the predicted feature is normed as the target's last hidden state is,
    and it is what the next step reads in place of a real feature. Trained by unrolling it on its own
    predictions (``unrolled``, "training-time test", ``train/eagle3.py``)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__(cfg)
        H, k = cfg.hidden_size, len(cfg.feature_layers)
        self.layer_norms = nn.ModuleList(RMSNorm(H) for _ in range(k))
        self.fuse_layers = nn.Linear(k * H, H, bias=False)
        self.out_norm = RMSNorm(H)

    def real_features(self, hidden):
        chunks = hidden.chunk(len(self.layer_norms), dim=-1)
        return self.fuse_layers(torch.cat([norm(c) for norm, c in zip(self.layer_norms, chunks)], dim=-1))

    def prediction(self, residual):
        return self.out_norm(residual)


def unrolled_mask(n: int, step: int, device) -> torch.Tensor:
    """(n, (step + 1) n) bool: query i of step ``step`` sees real keys j <= i - step and, of each later step s,
    the key at i - step + s."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    blocks = [j <= i - step] + [j == i - step + s for s in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


class MedusaHeads(nn.Module):
    """Head i (0-based): f + SiLU(W_i f + b_i), read by the target's output layer as the token i+1 places after
    the one the target predicts from f. Zero-initialised W_i: every head starts as the target's own head."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(cfg.num_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    def forward(self, features):  # (..., H) -> (..., num_heads, H)
        return torch.stack([features + F.silu(block(features)) for block in self.blocks], dim=-2)

    def real_features(self, hidden):
        return hidden


def build_head(cfg: HeadConfig) -> nn.Module:
    if cfg.kind == "medusa":
        return MedusaHeads(cfg)
    return FusedEagleHead(cfg) if cfg.feature_layers else EagleHead(cfg)


# ------------------------------------------------------------------------------------------- output layer


def compiles_head(target: nn.Module) -> bool:
    """Whether an EAGLE head beside ``target`` runs its forwards compiled (``EagleHead.compile_step``): beside a
    target whose forwards run compiled on a CPU. On CUDA the target's compiled forwards replay CUDA graphs of fixed
    shapes, and the head's shapes change at every step: it runs eagerly there."""
    return runs_compiled(target) and target.get_output_embeddings().weight.device.type == "cpu"


def runs_compiled(target: nn.Module) -> bool:
    """Whether ``target``'s forwards run compiled (``load_model(..., cache="static", compile=True)``)."""
    state = static_state(target)
    return state is not None and state.compile


def quantizes_head(target: nn.Module) -> bool:
    """Whether a drafting head beside ``target`` runs its linear layers and output layer on 8-bit weights
    (``tuning.int8_head``): beside a target whose linear layers run tuned for this CPU (packed for oneDNN, or on
    4-bit blocks) where the head's forwards are not compiled (``compiles_head``). Its step reads its weights and
    little else, so a quarter of float32's bytes (half of bfloat16's) makes each drafting depth cheaper, which paid
    for the few accepted tokens the rounding costs where measured (docs/SPEED.md); the output law is untouched, a
    head being a draft.
    Beside a target as transformers loads it the head runs as transformers would run it, on its own weights."""
    tuned = has_packed_linears(target) or has_int4_linears(target)
    return tuned and target.get_output_embeddings().weight.device.type == "cpu" and not compiles_head(target)


def packs_head(target: nn.Module) -> bool:
    """Whether a head beside ``target`` runs its output layer, and its linear layers where it is not compiled
    (``compiles_head``), on oneDNN-packed weights (``tuning.packed_linear``): where the target's run packed, and
    beside a target whose forwards run compiled (the compiler packs the target's weights itself, while the output
    layer runs eagerly), on a device and dtype that ``can_pack``. A target loaded as transformers loads it
    (``packed_linears=False``) or made batch-invariant keeps its head as transformers would run it too."""
    weight = target.get_output_embeddings().weight
    return has_packed_linears(target) or (runs_compiled(target) and can_pack(weight.device, weight.dtype))


class OutputLayer:
    """The target's output layer, optionally restricted to ``vocab_ids``; logits come back full width with -inf
    outside the sub-vocabulary, so q (and its zeros) is what the verifier sees. ``quantized``: its product runs on
    8-bit weights (``tuning.int8_head``), as a drafting head's does on a CPU (``quantizes_head``); ``full_weight``
    stays the target's."""

    def __init__(self, target: nn.Module, vocab_size: int, vocab_ids: torch.Tensor | None, quantized: bool = False):
        weight = target.get_output_embeddings().weight.detach()
        self.vocab_size = vocab_size
        self.full_weight = weight[:vocab_size]  # (V, H): the whole vocabulary, for measuring against the target
        self.vocab_ids = None if vocab_ids is None else vocab_ids.to(weight.device)
        self.weight = weight[:vocab_size] if vocab_ids is None else weight[self.vocab_ids]  # (S, H)
        bias = getattr(target.get_output_embeddings(), "bias", None)
        self.bias = None if bias is None else (bias[:vocab_size] if vocab_ids is None else bias[self.vocab_ids])
        self.product = (Int8Linear(self.weight, self.bias) if quantized and supports(self.weight.shape[1])
                        else linear_on(self.weight, self.bias, packed=packs_head(target)))

    def sub_logits(self, hidden):  # (..., H) -> (..., S)
        return self.product(hidden.to(self.weight.dtype))

    def sub_to_full(self, index):
        """Token ids of sub-vocabulary indices."""
        return index if self.vocab_ids is None else self.vocab_ids[index]

    def logits(self, hidden):  # (..., H) -> (..., V)
        sub = self.sub_logits(hidden)
        if self.vocab_ids is None:
            return sub
        full = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.vocab_ids, sub)


# ------------------------------------------------------------------------------------------------- drafters


class FeatureDraft(Drafter):
    """Shared plumbing: the target's features of every kept position, and the first-round rule.

    ``features`` (B, P, H) holds the target's features by position of the loop's token buffer (row b's prompt
    starts after its ``padding[b]`` left pads). Rows may hold different numbers of positions:
    ``known[b]`` (Python ints) says row b's features are those of positions 0..known[b]-1. The loop's ``observe``
    gives each row's first fed position (a list: row b was fed from ``lengths[b] - missing`` on, see
    ``lm.feed_unseen``) and the fresh features are written there, row by row (P is the longest row's count; a
    shorter row's later columns are stale and never read); ``rollback`` lowers each row's count to what it kept.
    Row b's context is then known[b] + 1 tokens long: no length is read from the device. The pads' features
    (positions below padding[b]) are kept but never read: the EAGLE head masks their entries out, Medusa reads
    each row's last feature.
    """

    uses_target_features = True

    def __init__(self, head: nn.Module, cfg: HeadConfig, target: nn.Module, vocab_ids: torch.Tensor | None):
        check_head_target(cfg, target)
        self.cfg = cfg
        self.head = head.to(device=target.device, dtype=target.dtype).eval()
        self.quantized = quantized = quantizes_head(target)  # its linear layers on 8-bit weights
        if compiles_head(target) and isinstance(self.head, EagleHead):
            self.head.compile_step(target.device)
        elif quantized:
            self.head = quantized_copy(self.head)
        elif packs_head(target):
            pack_linears(self.head)
        self.vocab_size = cfg.vocab_size
        self.output = OutputLayer(target, cfg.vocab_size, vocab_ids, quantized=quantized)
        self.features = None  # (B, P, H): the target's features of positions 0..P-1 (fused, as the head reads them)
        self.target = target
        self.feature_layers = tuple(cfg.feature_layers) or (-1,)
        self.padding, self.known = [0], [0]  # until ``begin``: one prompt

    def begin(self, input_ids, padding=None, tokens=None):
        self.features = None
        rows = input_ids.shape[0]
        self.padding = list(padding) if padding is not None else [0] * rows
        self.known = [0] * rows  # each row's count of positions whose features are kept

    @torch.inference_mode()  # no autograd graph through the head's fusion in the loop
    def observe(self, hidden, first_position: int | list[int]) -> None:
        """The target's hidden states (B, n, layers x H) of the positions it was just fed, from ``first_position``
        on: an int (every row) or a list of ints (row b's first position); row b's go to positions first[b]..
        (host ints throughout)."""
        fresh = self.head.real_features(hidden.to(self.head_dtype))
        B, n, H = fresh.shape
        firsts = [first_position] * B if isinstance(first_position, int) else list(first_position)
        for b, (first, known) in enumerate(zip(firsts, self.known)):
            if first > known:
                raise RuntimeError(f"features of row {b}'s positions {known}..{first - 1} are missing")
        ends = [first + n for first in firsts]
        have = 0 if self.features is None else self.features.shape[1]
        if self.features is None or max(ends) > have:  # a new tensor, owned here, wide enough for every row
            kept = fresh[:, :0] if self.features is None else self.features
            self.features = torch.cat([kept, fresh.new_zeros(B, max(ends) - have, H)], dim=1)
        if min(firsts) == max(firsts):
            self.features[:, firsts[0]: ends[0]] = fresh
        else:
            at = (torch.tensor(firsts)[:, None] + torch.arange(n)[None, :]).to(fresh.device, non_blocking=True)
            self.features.scatter_(1, at[..., None].expand(-1, -1, H), fresh)
        self.known = ends

    def rollback(self, kept: list[int]) -> None:
        if self.features is None:
            return
        self.known = [min(known, k) for known, k in zip(self.known, kept)]
        self.features = self.features[:, : max(self.known)]

    def last_features(self) -> torch.Tensor:
        """(B, H): each row's feature of the last position the target has run over (its context's length minus
        two), a slice when the rows hold as many positions (always at batch 1), else a gather."""
        if min(self.known) == max(self.known):
            return self.features[:, self.known[0] - 1]
        at = torch.tensor([known - 1 for known in self.known]).to(self.features.device, non_blocking=True)
        return self.features.gather(1, at[:, None, None].expand(-1, 1, self.features.shape[-1]))[:, 0]

    def proposal_length(self, gamma: int) -> int:
        """Drafts per round once features exist."""
        return gamma

    @property
    def head_dtype(self):
        return next(self.head.parameters()).dtype

    @torch.inference_mode()
    def reference_distributions(self, context: torch.Tensor, proposals: torch.Tensor,
                                sampling: SamplingParams) -> torch.Tensor:
        """q (N, g, V) that a round starting from ``context`` (1-D, at least 2 tokens) gives to each row of
        ``proposals`` (N, g), computed from scratch: one target forward, no caches. The tests hold the live
        drafter (caches, rollbacks) to it, and exact enumeration uses it."""
        N, g = proposals.shape
        device = self.output.weight.device
        context, proposals = context.to(device), proposals.to(device)
        seen = None
        if sampling.repetition_penalty != 1.0:
            seq = context[None].expand(N, -1)
            seen = seen_mask(seq, torch.full((N,), len(context), device=device), proposals, self.vocab_size)
        logits = self.reference_logits(context, proposals)  # (N, g, V)
        return probs_from_logits(logits, sampling, None if seen is None else seen[:, :g])

    def context_features(self, context: torch.Tensor, n: int) -> torch.Tensor:
        """The target's features f_0..f_{L-2} of ``context`` (1-D, L tokens), one target forward, repeated for
        ``n`` rows: (n, L-1, H)."""
        out = self.target(input_ids=context[None, :-1], output_hidden_states=True, logits_to_keep=1)
        hidden = selected_hidden(out.hidden_states, self.feature_layers).to(self.head_dtype)
        return self.head.real_features(hidden).expand(n, -1, -1)


class EagleDraft(FeatureDraft):
    """Drafts gamma tokens autoregressively on predicted features; its KV cache keeps real-feature entries only.

    Rows hold different numbers of entries (one prompt: one row, no holes). The cache is a ``MaskedHeadCache``
    (per-row slots and a key mask) and ``real_rows[b]`` counts the positions whose entries row b has made. Each
    entry takes as position i - padding[b], counted from the row's first real token as the target counts it, so a
    row's entries are those it would make alone. A proposal catches up first: every row gets m slots, m the most
    entries any row lacks, row b those of positions L_b - 1 - m .. L_b - 2 (L_b its context's length, known[b] +
    1); the slots of entries it has made already, of its left pads (i < padding[b]) and of positions before the
    buffer are holes, so each row gains exactly the entries it lacks, and the last slot, i = L_b - 2, gives its
    first draft. Each drafting step then appends one slot to every row, at position L_b - 1 + i - padding[b]. A
    query sees its row's valid slots and itself (``MaskedHeadCache.admit``). The rollback keeps row b's entries of
    positions below min(real_rows[b], kept[b]) (those made from predicted features go). Every length is a host
    int.
    """

    def __init__(self, head: EagleHead, cfg: HeadConfig, target: nn.Module, vocab_ids=None):
        super().__init__(head, cfg, target, vocab_ids)
        self.embed = target.get_input_embeddings()
        self.begin(torch.zeros(1, 1, dtype=torch.long))

    def begin(self, input_ids, padding=None, tokens=None):
        super().begin(input_ids, padding)
        device = next(self.head.parameters()).device
        self.cache = MaskedHeadCache(len(self.head.layers), input_ids.shape[0], device)
        self.real_rows = [0] * input_ids.shape[0]  # each row's count of entries made from real (target) features

    @torch.inference_mode()
    def propose(self, seq, lengths, gamma, sampling, generator):
        self.forwards = 0 if self.features is None else gamma  # the catch-up and gamma - 1 steps
        if self.features is None:  # the target has not run yet: this round is the prefill
            return seq.new_zeros(seq.shape[0], 0), None
        predicted = self.catch_up(seq)
        tokens, qs = [], []
        for i in range(gamma):
            x_i, q_i = draw(self.output.logits(predicted[:, -1]), seq, lengths, tokens, sampling, generator)
            tokens.append(x_i)
            qs.append(q_i)
            if i < gamma - 1:  # (predicted feature, draft i) -> the next predicted feature, in every row
                predicted = self.draft_step(predicted, x_i, i)
        return torch.stack(tokens, 1), torch.stack(qs, 1)

    def draft_step(self, predicted: torch.Tensor, tokens: torch.Tensor, step: int) -> torch.Tensor:
        """Each row's next predicted feature (B, 1, H) from its predicted feature (B, 1, H) and the token (B,)
        drafted from it: the entry of buffer position L_b - 1 + ``step``, made from a predicted feature (the
        rollback drops it)."""
        drafted = torch.tensor(self.known) + step  # known[b] = L_b - 1
        positions = (drafted - torch.tensor(self.padding))[:, None].to(tokens.device, non_blocking=True)
        allowed = self.cache.admit(drafted[:, None])
        return self.head(predicted, self.embed(tokens[:, None]), positions, self.cache, allowed)

    def catch_up(self, seq) -> torch.Tensor:
        """Feed the head the real features it lacks: row b's entries of positions real_rows[b]..L_b - 2, in one
        head forward (the class's text); returns each row's predicted feature f'_{L_b - 1} (B, 1, H), from which
        its first draft comes. L_b, the context's length, is one more than the positions whose features the
        drafter was given (``observe`` refuses a gap): nothing is read from the device."""
        contexts = [known + 1 for known in self.known]
        lacking = max(L - 1 - made for L, made in zip(contexts, self.real_rows))
        m = max(lacking, 1)  # rows that stopped lack none: they re-feed their last entry, as a hole
        index = torch.tensor(contexts)[:, None] - 1 - m + torch.arange(m)[None, :]  # (B, m) buffer positions
        slots = self.entry_slots(index)
        positions = (index - torch.tensor(self.padding)[:, None]).clamp(min=0)
        moved = torch.stack([index.clamp(min=0), positions]).to(seq.device, non_blocking=True)
        at, positions = moved[0], moved[1]
        features = self.features.gather(1, at[..., None].expand(-1, -1, self.features.shape[-1]))
        allowed = self.cache.admit(slots)
        predicted = self.head(features, self.embed(seq.gather(1, at + 1)), positions, self.cache, allowed)[:, -1:]
        self.real_rows = [L - 1 for L in contexts]
        return predicted

    def entry_slots(self, index: torch.Tensor) -> torch.Tensor:
        """What the cache records of a catch-up's slots, at buffer positions ``index`` (B, m): the position, where
        the row has not made that entry yet and it lies in the row's prompt or after it, else -1 (a hole: the
        entry is there already, or it pairs a left pad's feature)."""
        new = (index >= torch.tensor(self.real_rows)[:, None]) & (index >= torch.tensor(self.padding)[:, None])
        return torch.where(new, index, -1)

    def reference_logits(self, context, proposals):
        """The head's logits (N, g, V) before each token of ``proposals`` (N, g) in a round from ``context``
        (1-D), computed from scratch: no cache, every step recomputes the whole sequence."""
        features, logits = self.context_features(context, len(proposals)), []
        tokens = context[None, 1:].expand(len(proposals), -1)
        for i in range(proposals.shape[1]):
            positions = torch.arange(features.shape[1], device=context.device)
            predicted = self.head(features, self.embed(tokens), positions)
            logits.append(self.output.logits(predicted[:, -1]))
            features = torch.cat([features, predicted[:, -1:]], dim=1)
            tokens = torch.cat([tokens, proposals[:, i: i + 1]], dim=1)
        return torch.stack(logits, 1)

    def rollback(self, kept: list[int]) -> None:
        super().rollback(kept)
        # entries made from predicted features go, even for accepted drafts: next round re-feeds real ones
        self.real_rows = [min(made, k) for made, k in zip(self.real_rows, kept)]
        self.cache.keep(self.real_rows)


class MedusaDraft(FeatureDraft):
    """Proposes min(gamma, num_heads) tokens per round, all from the feature of the last fed position: in a batch,
    each row's own (``FeatureDraft.last_features``); the heads keep no cache, so nothing else is per row."""

    @torch.inference_mode()
    def propose(self, seq, lengths, gamma, sampling, generator):
        if self.features is None:
            return seq.new_zeros(seq.shape[0], 0), None
        predicted = self.head(self.last_features())  # (B, num_heads, H)
        logits = self.output.logits(predicted)
        tokens, qs = [], []
        for i in range(self.proposal_length(gamma)):
            x_i, q_i = draw(logits[:, i], seq, lengths, tokens, sampling, generator)
            tokens.append(x_i)
            qs.append(q_i)
        return torch.stack(tokens, 1), torch.stack(qs, 1)

    def proposal_length(self, gamma: int) -> int:
        return min(gamma, self.cfg.num_heads)

    def reference_logits(self, context, proposals):
        """The heads' logits (N, g, V) for the g proposals of a round from ``context`` (1-D), from scratch."""
        feature = self.context_features(context, len(proposals))[:, -1]
        return self.output.logits(self.head(feature))[:, : proposals.shape[1]]


def make_drafter(head: nn.Module, cfg: HeadConfig, target: nn.Module, vocab_ids=None) -> FeatureDraft:
    return (EagleDraft if cfg.kind == "eagle" else MedusaDraft)(head, cfg, target, vocab_ids)


# ------------------------------------------------------------------------------------- checks, saving, loading


def check_head_target(cfg: HeadConfig, target: nn.Module) -> None:
    """Refuse a head trained for another target: the features it reads would mean something else."""
    hidden = target.config.get_text_config(decoder=True).hidden_size
    if hidden != cfg.hidden_size:
        raise ValueError(f"this {cfg.kind} head was trained on features of width {cfg.hidden_size} "
                         f"(target {cfg.target or 'unknown'}), but this target's hidden size is {hidden}; "
                         "train a head for this target (notebooks/00_train_heads.ipynb)")
    vocab = usable_vocab_size(target)
    if vocab != cfg.vocab_size:
        raise ValueError(f"this {cfg.kind} head has a vocabulary of {cfg.vocab_size} tokens but the target has "
                         f"{vocab}; train a head for this target (notebooks/00_train_heads.ipynb)")
    if cfg.target_probe:
        same = same_weights(cfg.target_probe, target)  # float32, float16 or bfloat16 copies of the same target
    else:
        same = not cfg.target_fingerprint or weights_fingerprint(target) == cfg.target_fingerprint
    if not same:
        raise ValueError(f"this {cfg.kind} head was trained for target {cfg.target or 'unknown'} (weights "
                         f"fingerprint {cfg.target_fingerprint}); this target's weights differ "
                         f"({weights_fingerprint(target)}). Its hidden states mean something else: train a head "
                         "for this target (notebooks/00_train_heads.ipynb)")


def save_head(head: nn.Module, cfg: HeadConfig, vocab_ids: torch.Tensor | None, out_dir: Path) -> None:
    """float16 weights + config; the sub-vocabulary ids are stored with the weights."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).cpu().contiguous() for k, v in head.state_dict().items()}
    if vocab_ids is not None:
        tensors["vocab_ids"] = vocab_ids.to(torch.int64).cpu().contiguous()
    save_file(tensors, str(out_dir / "head.safetensors"))
    (out_dir / HEAD_CONFIG).write_text(json.dumps(asdict(cfg), indent=1) + "\n")


def read_head_config(path) -> HeadConfig:
    """The config of a head checkpoint folder (no weights read)."""
    path = Path(path)
    if not is_head_dir(path):
        raise FileNotFoundError(f"no head checkpoint (head_config.json) in {path}")
    return HeadConfig(**json.loads((path / HEAD_CONFIG).read_text()))


def read_head(path) -> tuple[nn.Module, HeadConfig, torch.Tensor | None]:
    """(head module in float32, config, vocab_ids or None) from a checkpoint folder."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg = read_head_config(path)
    tensors = load_file(str(path / "head.safetensors"))
    vocab_ids = tensors.pop("vocab_ids", None)
    head = build_head(cfg)
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    return head, cfg, vocab_ids


def load_head(path, target: nn.Module) -> FeatureDraft:
    """A ready drafter for ``target`` from a checkpoint folder (refused if it was trained for another target)."""
    head, cfg, vocab_ids = read_head(path)
    return make_drafter(head, cfg, target, vocab_ids)


def parameter_count(head: nn.Module) -> int:
    return sum(p.numel() for p in head.parameters())


def rope_theta_of(target) -> float:
    """The target's RoPE base (transformers 5 keeps it in ``rope_parameters``), else the common 10,000."""
    config = target.config.get_text_config(decoder=True)
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta or getattr(config, "rope_theta", None) or 10000.0)


def fused_layers(target) -> list[int]:
    """EAGLE-3's choice of the target's hidden states to fuse: a low, a middle and a high layer's output (indices
    into transformers' ``hidden_states``, where 0 is the embeddings)."""
    n = target.config.get_text_config(decoder=True).num_hidden_layers
    return [2, n // 2, n - 3]


def head_config_for(target, kind: str, target_name: str = "", sub_vocab_size: int = 8192, **kw) -> HeadConfig:
    """A config sized from the target: the EAGLE layer has the target's width, head count and MLP width."""
    text = target.config.get_text_config(decoder=True)
    base = dict(kind=kind, hidden_size=text.hidden_size, vocab_size=usable_vocab_size(target), target=target_name,
                target_fingerprint=weights_fingerprint(target), target_probe=weights_probe(target),
                sub_vocab_size=sub_vocab_size,
                num_attention_heads=text.num_attention_heads, intermediate_size=text.intermediate_size,
                rope_theta=rope_theta_of(target))
    base.update(kw)
    return HeadConfig(**base)
