"""Batched sampling that keeps every row busy: when a reply ends, the next prompt takes its row.

``model.generate`` over a batch runs until the batch's longest reply ends, so a row whose reply ended early waits,
computing nothing useful: on the harvested prompts (``corpus.py --sources``) about half the replies reach the
192-token cap while the mean is 134 tokens, so about 30% of the row-steps were idle. Here a batch of rows decodes
one token per row per forward; a row whose reply ends (an end-of-sequence token, or ``max_new_tokens``) is handed
back at once, and when ``refill_at`` rows are free the next prompts are prefilled together and their keys and
values written into the free rows.

The cache is transformers' ``DynamicCache``, right-aligned: every row's newest token sits in the last column, a
row's tokens are the last ``length`` columns, and the columns before them are masked out. Each row has its own
positions (its prompt starts at 0, as ``generate`` places a left-padded prompt). Columns no live row needs are
dropped at each refill, so the cache is as wide as the longest live row, as ``generate``'s is.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..core.lm import cache_keyword, check_full_attention
from ..core.sampling import SamplingParams, probs_from_logits, sample
from ..repro.tasks import chat_ids
from ..tokenizers import padded


class RefillingSampler:
    """Replies to a stream of (request, temperature), ``batch_size`` rows at a time (see the module's text)."""

    def __init__(self, model, tokenizer, batch_size: int = 64, max_new_tokens: int = 192, top_p: float = 1.0,
                 refill_at: int | None = None, seed: int = 0):
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}")
        SamplingParams(top_p=top_p)  # refuses a top_p outside (0, 1] before any work
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_new_tokens, self.top_p = batch_size, max_new_tokens, top_p
        check_full_attention(DynamicCache(config=model.config), DynamicLayer, model, "cannot be refilled row by row")
        self.refill_at = refill_at or max(1, batch_size // 8)  # free rows that trigger a refill (a refill copies)
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self.cache: DynamicCache | None = None
        self.cache_keyword = cache_keyword(model)
        self.rows: list[dict | None] = []  # per row: request, temperature, prompt ids, reply ids (None: free)
        self.lengths = torch.zeros(0, dtype=torch.long)  # tokens in the cache per row (0: free)
        self.next_tokens = torch.zeros(0, dtype=torch.long)  # the token each row feeds next

    @torch.inference_mode()
    def run(self, requests: Iterable[tuple[dict, float]], stop=lambda: False) -> Iterator[tuple[dict, float, list, list]]:
        """Yield (request, temperature, prompt ids, reply ids) as replies end (not in request order); a reply
        ends after its first end-of-sequence token or at ``max_new_tokens``. Each request's ``prompt`` is read
        with the chat template. Once ``stop()`` is true no new request is started and the rows under way finish."""
        pending = iter(requests)
        exhausted = False
        while True:
            free = [i for i, row in enumerate(self.rows) if row is None] if self.rows else list(range(self.batch_size))
            live = len(self.rows) - len(free) if self.rows else 0
            if not exhausted and (len(free) >= self.refill_at or live == 0):
                batch = [] if stop() else [r for _, r in zip(free, pending)]
                exhausted = len(batch) < len(free)
                if batch:
                    yield from self._refill(free, batch)
                    continue
            if live == 0:
                return
            yield from self._step()

    def _refill(self, free: list[int], batch: list[tuple[dict, float]]):
        """Prefill ``batch``'s prompts in one forward and move them into rows ``free``; yields replies that end
        at their first token."""
        prompts = [chat_ids(self.tokenizer, request["prompt"])[0].tolist() for request, _ in batch]
        ids, mask = padded(prompts, self.pad, left=True)
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.cache_keyword: cache})
        rows = free[: len(batch)]
        if self.cache is None:  # the first batch makes the cache
            self.cache, self.rows = cache, [None] * len(batch)
            self.lengths = torch.zeros(len(batch), dtype=torch.long, device=ids.device)
            self.next_tokens = torch.full((len(batch),), self.pad, dtype=torch.long, device=ids.device)
        else:
            self._place(cache, rows)
        self.lengths[rows] = mask.sum(-1)
        for row, (request, temperature), prompt in zip(rows, batch, prompts):
            self.rows[row] = dict(request=request, temperature=temperature, prompt=prompt, reply=[])
        self._trim()
        yield from self._take(out.logits[:, -1], rows)

    def _place(self, cache: DynamicCache, rows: list[int]) -> None:
        """Write a prefill's keys and values (right-aligned) into ``rows`` of the batch's cache, widening it on
        the left when the prompts are longer than it."""
        width, new = self.cache.get_seq_length(), cache.get_seq_length()
        index = torch.tensor(rows, device=self.lengths.device)
        for layer, fresh in zip(self.cache.layers, cache.layers):
            if new > width:
                grow = lambda t: torch.cat([t.new_zeros(*t.shape[:2], new - width, t.shape[3]), t], dim=2)
                layer.keys, layer.values = grow(layer.keys), grow(layer.values)
            end = layer.keys.shape[2]
            layer.keys[index, :, end - new:] = fresh.keys
            layer.values[index, :, end - new:] = fresh.values

    def _trim(self) -> None:
        """Drop the leading columns no row needs (every row's tokens are the last ``length`` columns)."""
        width, needed = self.cache.get_seq_length(), int(self.lengths.max())
        if needed < width:
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, width - needed:].contiguous()
                layer.values = layer.values[:, :, width - needed:].contiguous()

    def _step(self):
        """One forward of every row's next token; yields the replies that end."""
        width = self.cache.get_seq_length()
        columns = torch.arange(width + 1, device=self.lengths.device)
        mask = (columns[None, :] >= width - self.lengths[:, None]).long()  # a row's tokens, then the new one
        out = self.model(input_ids=self.next_tokens[:, None], attention_mask=mask,
                         position_ids=self.lengths[:, None], use_cache=True, **{self.cache_keyword: self.cache})
        live = [i for i, row in enumerate(self.rows) if row is not None]
        self.lengths[live] += 1  # a free row's column stays masked: its length stays 0
        yield from self._take(out.logits[live, -1], live)

    def _take(self, logits: torch.Tensor, rows: list[int]):
        """Choose each of ``rows``' next token (``logits[k]``: row ``rows[k]``'s) and yield the replies that end."""
        tokens = {}
        for temperature in {self.rows[r]["temperature"] for r in rows}:
            picked = [k for k, r in enumerate(rows) if self.rows[r]["temperature"] == temperature]
            if temperature == 0:
                drawn = logits[picked].argmax(-1)
            else:
                params = SamplingParams(temperature=temperature, top_p=self.top_p)
                drawn = sample(probs_from_logits(logits[picked], params), self.generator)
            tokens.update(zip((rows[k] for k in picked), drawn.tolist()))
        for r in rows:
            row = self.rows[r]
            row["reply"].append(tokens[r])
            self.next_tokens[r] = tokens[r]
            if tokens[r] == self.eos or len(row["reply"]) >= self.max_new_tokens:
                self.rows[r] = None
                self.lengths[r] = 0
                yield row["request"], row["temperature"], row["prompt"], row["reply"]

