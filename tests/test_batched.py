"""Batches of Hugging Face models: left-padded prompts of different lengths, rows that accept different numbers of
drafts and end at different times, in one dynamic cache with masked slots (``core/lm.py``). Each row's greedy
output equals its prompt decoded alone; after every rollback each row's cache holds the keys and values a fresh
forward over its tokens gives (float32, within 1e-4; a broken rollback fails that check); bad batches are refused
before any forward, saying what to pass; batch 1 never makes a mask. The EAGLE and Medusa heads batch too: each
row's greedy output is its own, and its q every round is the one the head gives the prompt alone (within 1e-5; a
head that sees pads, keeps predicted entries or reads another row's feature fails that check); token trees stay
batch 1. At T = 1 each row's law of the first round at batch 3 is its lone prompt's, by enumeration and by a
chi-square test of the loop's samples, which rejects the broken verifiers of ``repro/mutants.py``."""
import numpy as np
import pytest
import torch
from transformers import DynamicCache

import specdec_lite as sd
from specdec_lite.core.decode import EXACT, Verifier
from specdec_lite.tokenizers import padded
from specdec_lite.core.lm import HFCausalLM
from specdec_lite.core.sampling import probs_from_logits
from specdec_lite.drafts.heads import FeatureDraft
from specdec_lite.repro.exact import exact_target_distribution, max_abs_difference
from specdec_lite.repro.mutants import MUTANTS, NO_EXACT_LAW
from specdec_lite.repro.stats import chi_square_power, chi_square_pvalue
from specdec_lite.repro.toy import MarkovLM, random_pair

from conftest import DEVICE, ProposeRecorder, tiny_llama

GREEDY = sd.SamplingParams(temperature=0)
LENGTHS = (3, 7, 5)  # the prompts' lengths: rows 0 and 2 are left-padded
PAD = 0


def prompts(lengths=LENGTHS, seed=0):
    return [torch.randint(1, 64, (n,), generator=torch.Generator().manual_seed(seed + i)) for i, n in enumerate(lengths)]


def left_padded(rows):
    """(input_ids, attention_mask) of 1-D prompts, padded on the left as a tokenizer with padding_side='left' does."""
    ids, mask = padded(rows, PAD, left=True)
    return ids.to(DEVICE), mask.to(DEVICE)


def alone(target, rows, max_new_tokens=24):
    """Each prompt's own greedy decoding, at batch 1."""
    return [sd.autoregressive_generate(target, row.to(DEVICE), max_new_tokens=max_new_tokens, sampling=GREEDY).tokens
            for row in rows]


def near_copy(model, seed=5, scale=0.005):
    """The weights of ``tiny_target`` (``model``'s), perturbed: a draft whose drafts are often, not always, kept."""
    copy = tiny_llama(layers=model.config.num_hidden_layers, seed=0)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(scale * torch.randn_like(p))
    return copy


KINDS = ["plain", "draft model", "perturbed copy", "n-gram", "layer-skip"]


def decode(kind, target, draft, ids, mask, max_new_tokens=24, **kw):
    if kind == "plain":
        return sd.autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                          sampling=GREEDY, **kw)
    drafter = {"draft model": lambda: draft, "perturbed copy": lambda: near_copy(target), "n-gram": sd.NGramDraft,
               "layer-skip": lambda: sd.LayerSkipDraft(target, layers=[0, 3])}[kind]()
    return sd.speculative_generate(target, drafter, ids, attention_mask=mask, gamma=3, max_new_tokens=max_new_tokens,
                                   sampling=GREEDY, **kw)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ending", ["max_new_tokens", "an EOS ends a row early"])
def test_each_row_decodes_as_its_prompt_alone(tiny_target, tiny_draft, kind, ending, monkeypatch):
    rows = prompts()
    if ending != "max_new_tokens":  # the target's own EOS: a token row 1 writes early (restored after the test)
        eos = int(alone(tiny_target, rows)[1][3])
        monkeypatch.setattr(tiny_target.generation_config, "eos_token_id", eos)
    reference = alone(tiny_target, rows)
    if ending != "max_new_tokens":
        assert len(reference[1]) <= 4 and any(len(r) == 24 for r in reference)  # rows end at different times
    out = decode(kind, tiny_target, tiny_draft, *left_padded(rows))
    for row, ref in zip(out.sequences, reference):
        assert row.tolist() == ref.tolist()


@pytest.mark.parametrize("kind", ["draft model", "layer-skip"])
def test_an_unpadded_batch_decodes_each_row_as_alone(tiny_target, tiny_draft, kind):
    """Prompts of one length, no attention_mask: the rows part when they accept different counts (the mask is made
    then)."""
    rows = prompts(lengths=(6, 6, 6), seed=10)
    ids = torch.stack(rows).to(DEVICE)
    out = decode(kind, tiny_target, tiny_draft, ids, None)
    assert [row.tolist() for row in out.sequences] == [ref.tolist() for ref in alone(tiny_target, rows)]


def test_columns_of_padding_in_every_row_change_nothing(tiny_target):
    rows = prompts()
    ids, mask = left_padded(rows)
    wider_ids = torch.cat([torch.full((3, 2), PAD, device=DEVICE), ids], dim=1)
    wider_mask = torch.cat([torch.zeros(3, 2, dtype=torch.long, device=DEVICE), mask], dim=1)
    one = sd.speculative_generate(tiny_target, sd.NGramDraft(), ids[:1], attention_mask=mask[:1], max_new_tokens=12,
                                  sampling=GREEDY)  # a lone padded prompt runs unpadded
    assert one.tokens.tolist() == alone(tiny_target, rows[:1], 12)[0].tolist()
    out = sd.speculative_generate(tiny_target, sd.NGramDraft(), wider_ids, attention_mask=wider_mask,
                                  max_new_tokens=12, sampling=GREEDY)
    assert [r.tolist() for r in out.sequences] == [r.tolist() for r in alone(tiny_target, rows, 12)]


# ---------------------------------------------------------------- the cache, after every rollback
class TruthLM(HFCausalLM):
    """Keeps each row's tokens (pads included) as the loop feeds and rolls back, and after every rollback holds the
    cache to a fresh forward: row b's slots that the mask marks hold, in order, the keys and values of a forward
    over its tokens without its pads. ``max_error`` is the largest difference seen (inf when a row's slot count is
    not its token count); ``mirrored`` whether the host mask always equalled the device's."""

    def __init__(self, model, compact_min=HFCausalLM.compact_min, **kw):
        super().__init__(model, **kw)
        self.compact_min = compact_min
        self.tokens, self.max_error, self.checks, self.compactions, self.mirrored = [], 0.0, 0, 0, True

    def reset(self, batch_size, padding=None, tokens=None):
        super().reset(batch_size, padding, tokens)
        self.tokens = [[] for _ in range(batch_size)]

    def feed(self, tokens, num_logits=None, hidden_layers=None):
        out = super().feed(tokens, num_logits, hidden_layers)
        for row, fed in zip(self.tokens, tokens.tolist()):
            row.extend(fed)
        return out

    def crop(self, lengths):
        super().crop(lengths)
        self.tokens = [row[:n] for row, n in zip(self.tokens, lengths)]
        self.check()

    def _compact(self):
        width = self.length
        super()._compact()
        self.compactions += self.length < width

    def check(self):
        assert self.cache_lengths() == [len(row) for row in self.tokens]
        if self.slots is not None:
            self.mirrored &= torch.equal(self.slots.host, self.slots.device.cpu())
        for b, row in enumerate(self.tokens):
            real = row[self.padding[b]:]
            slots = torch.arange(self.length) if self.slots is None else self.slots.host[b].nonzero()[:, 0]
            if len(slots) != len(real):
                self.max_error = float("inf")
                continue
            if not real:
                continue
            fresh = DynamicCache(config=self.model.config)
            with torch.inference_mode():
                self.model(input_ids=torch.tensor([real], device=self.device), use_cache=True,
                           **{self._cache_kwarg: fresh})
            slots = slots.to(self.device)
            for ours, theirs in zip(self.cache.layers, fresh.layers):
                for mine, right in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
                    self.max_error = max(self.max_error, (mine[b][:, slots] - right[0]).abs().max().item())
        self.checks += 1


def truth_run(kind, target, draft, lm_class=TruthLM, compact_min=2, max_new_tokens=24):
    """A batch of three left-padded prompts through TruthLM wrappers of the target (and of the draft model);
    checks after every round that each row's cache holds its prompt and emitted tokens (all but the newest)."""
    rows = prompts()
    ids, mask = left_padded(rows)
    target_lm = lm_class(target, compact_min=compact_min)
    drafter = {"draft model": lambda: sd.ModelDraft(lm_class(draft, compact_min=compact_min, role="draft")),
               "layer-skip": lambda: sd.LayerSkipDraft(target, layers=[0, 3])}.get(kind, lambda: None)()
    if kind == "layer-skip":
        drafter.lm = lm_class(drafter.lm.model, compact_min=compact_min, vocab_size=drafter.lm.vocab_size)

    def seen(emitted):
        for b, new in enumerate(emitted):
            have = target_lm.tokens[b][target_lm.padding[b]:]
            text = rows[b].tolist() + new.tolist()
            assert len(have) >= len(text) - 1 and have[: len(text)] == text[: len(have)]

    if kind == "plain":
        sd.autoregressive_generate(target_lm, ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                   sampling=GREEDY, on_round=seen)
    else:
        sd.speculative_generate(target_lm, drafter, ids, attention_mask=mask, gamma=3, max_new_tokens=max_new_tokens,
                                sampling=GREEDY, on_round=seen)
    return [target_lm] + ([drafter.lm] if drafter is not None else [])


@pytest.mark.parametrize("kind", ["plain", "draft model", "layer-skip"])
def test_cache_truth_after_every_rollback(tiny_target, tiny_draft, kind):
    lms = truth_run(kind, tiny_target, tiny_draft, max_new_tokens=40)
    for lm in lms:
        assert lm.checks > 10 and lm.max_error < 1e-4 and lm.mirrored
    if kind == "layer-skip":  # rows accepted different counts: holes, and compactions that removed them
        assert sum(lm.compactions for lm in lms) > 0


def test_compaction_by_hand(tiny_target):
    """Rows rolled back by different counts, then compacted (valid slots first) and fed again: the cache stays true
    and as wide as the longest row."""
    lm = TruthLM(tiny_target, compact_min=1)
    lm.reset(3, padding=[4, 0, 2])
    seq = torch.randint(1, 64, (3, 30), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    lm.feed(seq[:, :10])
    lm.crop([9, 7, 10])  # three holes in row 1, one in row 0; the last slot is kept by row 2
    assert lm.length == 10 and lm.compactions == 0
    lm.feed(seq[:, 10:14])  # every row: 4 more slots (14)
    lm.crop([13, 9, 12])  # tokens kept: 9, 9, 10; packed to the left, 10 slots do
    assert lm.compactions == 1 and lm.length == 10 and lm.cache_lengths() == [13, 9, 12]
    logits = lm.feed(seq[:, 20:22])
    with torch.inference_mode():
        fresh = tiny_target(input_ids=torch.tensor([lm.tokens[0][4:]], device=DEVICE)).logits[0, -2:]
    assert (logits[0] - fresh).abs().max() < 1e-4  # row 0: after its 4 pads, holes and the compaction
    lm.crop([15, 10, 13])
    assert lm.checks == 3 and lm.max_error < 1e-4 and lm.mirrored


class ForgetsHoles(TruthLM):
    """A broken rollback: the dropped tokens stay in the cache, as if they had been kept."""

    def _mark_holes(self, keep):
        pass


class HostOnlyHoles(TruthLM):
    """A broken rollback: the host mask is right, the device mask still shows the dropped tokens to the model."""

    def _mark_holes(self, keep):
        from specdec_lite.core.slots import keep_first
        self.slots.host = keep_first(self.slots.host, torch.tensor(keep))


@pytest.mark.parametrize("broken", [ForgetsHoles, HostOnlyHoles])
def test_a_broken_rollback_fails_the_cache_truth_check(tiny_target, tiny_draft, broken):
    target_lm = truth_run("layer-skip", tiny_target, tiny_draft, lm_class=broken, compact_min=10**6)[0]
    assert target_lm.max_error > 1e-3


def test_no_nan_from_rows_of_padding():
    """The pads' queries see no key (fully masked rows of the attention): nothing NaN reaches any slot, with
    transformers' sdpa and eager attention."""
    for attention in ("sdpa", "eager"):
        model = tiny_llama(layers=2, seed=4)
        model.set_attn_implementation(attention)
        lm = HFCausalLM(model)
        lm.reset(2, padding=[6, 0])
        ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)
        logits = lm.feed(ids)
        assert not logits.isnan().any()
        assert not any(layer.keys.isnan().any() or layer.values.isnan().any() for layer in lm.cache.layers)
        alone_logits = model(input_ids=ids[:1, 6:]).logits
        assert (logits[0, 6:] - alone_logits[0]).abs().max() < 1e-4


class MaskWatch(HFCausalLM):
    """Counts the masks it starts."""

    started = 0

    def _start_mask(self, rows):
        MaskWatch.started += 1
        super()._start_mask(rows)


def test_batch_one_makes_no_mask(tiny_target):
    """Batch 1 takes the plain path: no mask, rollbacks drop the last slots (rejections happen: a layer-skip
    draft)."""
    MaskWatch.started = 0
    draft = sd.LayerSkipDraft(tiny_target, layers=[0, 3])
    draft.lm = MaskWatch(draft.lm.model, vocab_size=draft.lm.vocab_size, role="draft")
    out = sd.speculative_generate(MaskWatch(tiny_target), draft, prompts()[1].to(DEVICE), gamma=3,
                                  max_new_tokens=24, sampling=GREEDY)
    assert any(n < 4 for n in out.stats.accepted_lengths) and MaskWatch.started == 0


# ---------------------------------------------------------------- refusals, before any forward
class Forwards:
    """Counts the forwards of the models given."""

    def __init__(self, *models):
        self.count = 0
        for model in models:
            model.register_forward_pre_hook(lambda *_: setattr(self, "count", self.count + 1))


@pytest.fixture
def fresh_pair():
    return tiny_llama(layers=1, seed=6), tiny_llama(layers=1, seed=7)


def refused(target, draft, ids, mask, match, error=ValueError, sampling=sd.SamplingParams()):
    forwards = Forwards(*[m for m in (target, draft) if isinstance(m, torch.nn.Module)])
    with pytest.raises(error, match=match):
        sd.speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=4, sampling=sampling)
    with pytest.raises(error, match=match):
        sd.autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=4, sampling=sampling)
    assert forwards.count == 0


def test_a_mask_of_another_shape(fresh_pair):
    ids, mask = left_padded(prompts())
    refused(*fresh_pair, ids, mask[:, 1:], r"attention_mask has shape \(3, 6\) but input_ids \(3, 7\): pass the "
                                           "attention_mask the tokenizer returned")
    refused(*fresh_pair, ids, mask[:2], "attention_mask has shape")


def test_a_mask_of_other_values(fresh_pair):
    ids, mask = left_padded(prompts())
    refused(*fresh_pair, ids, mask * 2, r"0 \(padding\) and 1 \(token\) only, row 0 holds \[2\]")
    refused(*fresh_pair, ids, mask * 0.5, r"0 \(padding\) and 1 \(token\) only")


def test_right_padding(fresh_pair):
    ids, mask = left_padded(prompts())
    refused(*fresh_pair, ids, mask.flip(1), r"row 0 .* padding after its tokens: pad on the left.*padding_side='left'")


def test_a_row_without_tokens(fresh_pair):
    ids, mask = left_padded(prompts())
    mask[2] = 0
    refused(*fresh_pair, ids, mask, "row 2 of attention_mask is all zeros")


def test_padding_with_a_repetition_penalty(fresh_pair):
    """The pads would count as tokens a row has seen: refused; rows of one length keep the penalty."""
    ids, mask = left_padded(prompts())
    penalty = sd.SamplingParams(repetition_penalty=1.2)
    refused(*fresh_pair, ids, mask, "repetition_penalty with left-padded rows", NotImplementedError, penalty)
    target, _ = fresh_pair
    same_length = torch.tensor([[5, 6, 7], [8, 9, 10]], device=DEVICE)
    out = sd.autoregressive_generate(target, same_length, attention_mask=torch.ones_like(same_length),
                                     max_new_tokens=3, sampling=penalty)
    assert [len(row) for row in out.sequences] == [3, 3]


def test_padding_without_its_mask(fresh_pair):
    target, draft = fresh_pair
    ids, _ = left_padded(prompts())
    target.generation_config.pad_token_id = PAD
    refused(target, draft, ids, None, r"rows start with \[4, 0, 2\] copies of the pad token 0 .*pass the mask")
    tokenized = torch.tensor([[PAD, 5, 6], [PAD, 7, 8]])  # every row starts with it: no sign of padding
    assert len(sd.autoregressive_generate(target, tokenized, max_new_tokens=2).sequences) == 2


class CountingMarkov(MarkovLM):
    """A toy model that counts its forwards."""

    forwards = 0

    def feed(self, tokens, num_logits=None):
        CountingMarkov.forwards += 1
        return super().feed(tokens, num_logits)


def test_padding_for_a_model_that_takes_none():
    target, draft = (CountingMarkov(lm.transition) for lm in random_pair(6, 0.5, 0))
    ids, mask = left_padded([torch.tensor([1, 2]), torch.tensor([3])])
    CountingMarkov.forwards = 0
    refused(target, draft, ids.cpu(), mask.cpu(), "CountingMarkov takes no left padding", NotImplementedError)
    assert CountingMarkov.forwards == 0
    one_length = sd.speculative_generate(target, draft, torch.tensor([[1, 2], [3, 4]]),
                                         attention_mask=torch.ones(2, 2), max_new_tokens=4)
    assert len(one_length.sequences) == 2  # a mask without pads is no padding


def test_static_batches_are_refused_before_any_work(fresh_pair):
    from specdec_lite.core.lm import use_static_cache

    target, draft = fresh_pair
    use_static_cache(target, max_length=64)
    ids, mask = left_padded(prompts())
    refused(target, draft, ids, mask, r"needs the dynamic cache .*cache='dynamic'.*use_dynamic_cache\(model\)",
            NotImplementedError)


# ---------------------------------------------------------------- feature-level drafts (heads.py) in a batch
HEAD_KINDS = ["eagle", "medusa", "eagle3", "eagle-deep"]  # as in test_heads.py: EAGLE, Medusa, EAGLE-3, two layers


def small_vocab_target():
    """A tiny Llama of 8 tokens: random heads guess right now and then, so rows accept different counts."""
    return tiny_llama(vocab=8, seed=0)


def small_vocab_prompts():
    return [torch.randint(1, 8, (n,), generator=torch.Generator().manual_seed(i)) for i, n in enumerate(LENGTHS)]


def head_draft(target, kind, cls=None):
    """A random head for ``target``, built as test_heads.py builds one (``random_head_draft``); ``cls``: a
    test-local subclass of its drafter to run instead."""
    from test_heads import random_head_draft

    draft = random_head_draft(target, kind, torch.tensor([0, 1, 2, 3, 5, 6]), num_heads=3)
    if cls is not None:
        draft.__class__ = cls
    return draft


@pytest.mark.parametrize("kind", HEAD_KINDS)
@pytest.mark.parametrize("ending", ["max_new_tokens", "an EOS ends rows early"])
def test_heads_decode_each_row_as_its_prompt_alone(kind, ending):
    """Greedy, float32: at batch 3, left-padded prompts of different lengths, each row's output with the head is
    that prompt's own batch-1 greedy output; with an EOS, rows end at different rounds (one after a single
    token)."""
    target, rows = small_vocab_target(), small_vocab_prompts()
    if ending != "max_new_tokens":
        target.generation_config.eos_token_id = int(alone(target, rows, 30)[0][3])
    reference = alone(target, rows, 30)
    if ending != "max_new_tokens":
        assert sorted(len(r) for r in reference)[:2] == [1, 4] and max(len(r) for r in reference) == 30
    ids, mask = left_padded(rows)
    out = sd.speculative_generate(target, head_draft(target, kind), ids, attention_mask=mask, gamma=3,
                                  max_new_tokens=30, sampling=GREEDY)
    assert [row.tolist() for row in out.sequences] == [ref.tolist() for ref in reference]
    assert 0 < out.stats.accepted < out.stats.drafted


def test_heads_batch_prompts_of_one_length_without_a_mask():
    target, rows = small_vocab_target(), [torch.randint(1, 8, (6,), generator=torch.Generator().manual_seed(20 + i))
                                          for i in range(3)]
    for kind in ("eagle", "medusa"):
        out = sd.speculative_generate(target, head_draft(target, kind), torch.stack(rows).to(DEVICE), gamma=3,
                                      max_new_tokens=30, sampling=GREEDY)
        assert [row.tolist() for row in out.sequences] == [ref.tolist() for ref in alone(target, rows, 30)]


def batched_q_error(kind, cls=None, temperature=1.0, seed=3):
    """The largest |q - batch-1 q| over the rounds and running rows of a batch-3 run (left-padded prompts of
    different lengths), the batch-1 q being the head's cache-free ``reference_distributions`` for that row's
    context alone (its pads dropped): what the head gives the prompt when it runs alone (test_heads.py holds the
    live batch-1 drafter to it). Returns (error, rows checked, the run's stats)."""
    target, rows = small_vocab_target(), small_vocab_prompts()
    rec = ProposeRecorder(head_draft(target, kind, cls))
    ids, mask = left_padded(rows)
    sampling = sd.SamplingParams(temperature=temperature)
    out = sd.speculative_generate(target, rec.drafter, ids, attention_mask=mask, gamma=4, max_new_tokens=40,
                                  sampling=sampling, seed=seed)
    T, error, checked = ids.shape[1], 0.0, 0
    for seq, lengths, drafts, q in rec.rounds[1:]:  # the first round is the prefill: nothing drafted
        for b, row in enumerate(rows):
            if lengths[b] - T >= len(out.sequences[b]):
                continue  # the row has stopped: what it drafts is never used
            context = seq[b, T - len(row): lengths[b]]
            ref = rec.drafter.reference_distributions(context, drafts[b: b + 1], sampling)
            error = max(error, (q[b: b + 1] - ref).abs().max().item())
            checked += 1
    return error, checked, out.stats


@pytest.mark.parametrize("kind", HEAD_KINDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_heads_q_at_batch_three_is_each_rows_batch_one_q(kind, temperature, monkeypatch):
    """Every round, each running row's q (the head's distributions) equals the q the head gives that prompt alone,
    within 1e-5: the features, the head's cache, its key mask (pads, stale and rolled-back entries), its positions
    and its rollback are right per row. In the runs at 0.7, EAGLE's cache is compacted whenever a slot can go."""
    from specdec_lite.core.slots import Slots
    from specdec_lite.drafts.heads import MaskedHeadCache

    compactions = []
    original = MaskedHeadCache.compact_if_worth

    def counted(cache):
        before = cache.length
        original(cache)
        compactions.append(cache.length < before)
    monkeypatch.setattr(MaskedHeadCache, "compact_if_worth", counted)
    if temperature != 1.0:
        monkeypatch.setattr(Slots, "compact_min", 1)
        monkeypatch.setattr(Slots, "compact_share", 0.0)
    error, checked, stats = batched_q_error(kind, temperature=temperature)
    assert error < 1e-5 and checked >= 30
    assert 0 < stats.accepted < stats.drafted and len(set(stats.accepted_lengths)) > 1
    if kind != "medusa" and temperature != 1.0:
        assert any(compactions)


class PadsSeen(sd.EagleDraft):
    """Broken: the left pads' entries are valid keys (only the entries a row made already are holes)."""

    def entry_slots(self, index):
        return torch.where(index >= torch.tensor(self.real_rows)[:, None], index, -1)


class KeepsPredictedEntries(sd.EagleDraft):
    """Broken: the rollback keeps the entries made from predicted features of the accepted drafts."""

    def rollback(self, kept):
        FeatureDraft.rollback(self, kept)
        self.real_rows = list(kept)
        self.cache.keep(self.real_rows)


class LastColumn(sd.MedusaDraft):
    """Broken: every row reads the feature of the longest row's last position."""

    def last_features(self):
        return self.features[:, -1]


@pytest.mark.parametrize("kind, broken", [("eagle", PadsSeen), ("eagle", KeepsPredictedEntries),
                                          ("medusa", LastColumn)])
def test_a_broken_batched_head_fails_the_q_check(kind, broken):
    error, checked, _ = batched_q_error(kind, cls=broken)
    assert error > 1e-3 and checked >= 30


def test_trees_stay_batch_one(fresh_pair):
    """Token trees are refused at batch > 1 before any forward; feature-level chain drafts are not."""
    from specdec_lite.drafts import heads

    target, _ = fresh_pair
    cfg = heads.head_config_for(target, "eagle", "tiny", sub_vocab_size=0)
    eagle = heads.make_drafter(heads.build_head(cfg), cfg, target)
    forwards = Forwards(target)
    ids, mask = left_padded(prompts())
    with pytest.raises(NotImplementedError, match="EagleTreeDraft proposes token trees .*batch size 1"):
        sd.speculative_generate(target, sd.EagleTreeDraft(eagle), ids, attention_mask=mask, max_new_tokens=4)
    assert forwards.count == 0
    assert len(sd.speculative_generate(target, eagle, ids, attention_mask=mask, max_new_tokens=4).sequences) == 3


# ---------------------------------------------------------------- T = 1: each row's law, at batch 3
LEVEL = 1e-3
PLAIN = sd.SamplingParams()  # T = 1
# the target's own greedy cycles (prompts() continued by it): n-gram drafts that it often accepts; 18, 10, 14 tokens
NGRAM_PROMPTS = [torch.tensor(row) for row in ([54, 46, 57, 7, 28, 15, 39, 8, 25, 9, 41, 25, 27, 8, 25, 27, 8, 25],
                                               [50, 60, 19, 60, 53, 56, 57, 3, 3, 3],
                                               [10, 25, 54, 10, 54, 4, 4, 4, 47, 40, 11, 3, 3, 3])]
LAW_CASES = {"draft model": (prompts, 1, 400, ["residual from p", "inverted ratio q/p"]),
             "n-gram": (lambda: NGRAM_PROMPTS, 2, 200, ["residual from p", "inverted ratio q/p"])}
# per case: the prompts, gamma, N, and the mutants the statistical part has the power to see


class FirstRoundOver(Exception):
    pass


class Recording:
    """A verifier that keeps what the loop hands it, (drafts, q, p) of each round, and samples with ``base``."""

    def __init__(self, base: Verifier = EXACT):
        self.calls = []

        def chain(drafts, q, p, generator=None):
            self.calls.append((drafts.clone(), None if q is None else q.clone(), p.clone()))
            return base.chain(drafts, q, p, generator)
        self.verifier = Verifier(chain=chain, chain_law=base.chain_law)


class Forced(sd.ModelDraft):
    """The draft model, but every row's draft is ``token``; q is the model's own, as the batched loop computes it."""

    def __init__(self, model, token):
        super().__init__(model)
        self.token = token

    def propose(self, seq, lengths, gamma, sampling, generator):
        drafts, q = super().propose(seq, lengths, gamma, sampling, generator)
        return torch.full_like(drafts, self.token), q


def first_round(target, drafter, rows, gamma, seed=0, verifier=EXACT) -> list:
    """Each row's tokens emitted by the first round of a batch-3 run at T = 1 over the left-padded ``rows``, as the
    loop emits them (``on_round``, which then stops the run)."""
    ids, mask = left_padded(rows)
    emitted = []

    def on_round(tokens):
        emitted.extend(row.tolist() for row in tokens)
        raise FirstRoundOver
    try:
        sd.speculative_generate(target, drafter, ids, attention_mask=mask, gamma=gamma, max_new_tokens=gamma + 1,
                                sampling=PLAIN, seed=seed, verifier=verifier, timed=False, on_round=on_round)
    except FirstRoundOver:
        return emitted
    raise AssertionError("the run ended without a round")


def round_law(verifier, drafts, q, p, weights) -> dict:
    """{emitted tokens: probability} of one row's round: ``verifier.chain_law`` over the proposals ``drafts``
    (N, k) drawn with probabilities ``weights`` (N,)."""
    law = verifier.chain_law(drafts, q, p) * weights.double()[:, None, None]
    out = {}
    for i, n, v in law.nonzero().tolist():
        key = tuple(drafts[i, :n].tolist()) + (v,)
        out[key] = out.get(key, 0.0) + float(law[i, n, v])
    return out


def lone_inputs(kind, target, draft, row, batched_drafts):
    """(drafts, q, p, weights) of a lone prompt's first round, from fresh forwards (no cache, no batch). n-gram:
    the drafts are the batched round's for that row, which begin with the row's own proposal (a row whose
    continuation is shorter than another row's repeats its last token, ``NGramDraft``: another point mass)."""
    V = target.config.vocab_size
    with torch.inference_mode():
        if kind == "draft model":
            drafts = torch.arange(V, device=DEVICE)[:, None]
            q = probs_from_logits(draft(input_ids=row[None]).logits[:, -1:], PLAIN).expand(V, -1, -1)
            weights = q[:, 0].gather(1, drafts)[:, 0]
        else:
            own, q = sd.NGramDraft().propose(row[None], torch.tensor([len(row)], device=DEVICE), 2, PLAIN, None)
            drafts, weights = batched_drafts, torch.ones(1, device=DEVICE)
            assert own.shape[1] > 0 and torch.equal(drafts[:, : own.shape[1]], own)
            assert (drafts[:, own.shape[1]:] == row[-1]).all()
        contexts = torch.cat([row[None].expand(len(drafts), -1), drafts], dim=1)
        p = probs_from_logits(target(input_ids=contexts).logits[:, -drafts.shape[1] - 1:], PLAIN)
    return drafts, q, p, weights


def batched_inputs(kind, target, draft, rows, gamma):
    """Per row, (drafts, q, p, weights) of the batched first round, as the loop hands them to the verifier."""
    if kind == "n-gram":
        rec = Recording()
        first_round(target, sd.NGramDraft(), rows, gamma, verifier=rec.verifier)
        drafts, _, p = rec.calls[0]
        return [(drafts[b: b + 1], None, p[b: b + 1], torch.ones(1, device=DEVICE)) for b in range(len(rows))]
    V = target.config.vocab_size
    qs, ps = [], []
    for v in range(V):  # every possible draft, in every row at once
        rec = Recording()
        first_round(target, Forced(draft, v), rows, gamma, verifier=rec.verifier)
        drafts, q, p = rec.calls[0]
        assert (drafts == v).all()
        qs.append(q)
        ps.append(p)
    out = []
    for b in range(len(rows)):
        q = torch.stack([q[b] for q in qs])  # (V, 1, V): the same q, whatever was then drafted
        assert (q - q[:1]).abs().max() == 0
        out.append((torch.arange(V, device=DEVICE)[:, None], q, torch.stack([p[b] for p in ps]), q[0, 0]))
    return out


@pytest.fixture(scope="module")
def first_round_laws(tiny_target, tiny_draft):
    """Per case: (each row's exact law of the first round at batch 3 for EXACT and each enumerable mutant, from the
    batched p and q; the same law from the lone prompts' p and q; the largest |batched - lone| of p and q)."""
    verifiers = {"exact": EXACT, **{name: v for name, v in MUTANTS.items() if name not in NO_EXACT_LAW}}
    out = {}
    for kind, (rows, gamma, *_) in LAW_CASES.items():
        rows = [row.to(DEVICE) for row in rows()]
        batched = batched_inputs(kind, tiny_target, tiny_draft, rows, gamma)
        lone = [lone_inputs(kind, tiny_target, tiny_draft, row, inputs[0]) for row, inputs in zip(rows, batched)]
        error = 0.0
        for (d, q, p, _), (d1, q1, p1, _) in zip(batched, lone):
            assert torch.equal(d, d1)
            error = max(error, (p - p1).abs().max().item(), 0.0 if q is None else (q - q1).abs().max().item())
        laws = {name: [round_law(v, *inputs) for inputs in batched] for name, v in verifiers.items()}
        out[kind] = laws, [round_law(EXACT, *inputs) for inputs in lone], error
    return out


@pytest.mark.parametrize("kind", LAW_CASES)
def test_exact_law_of_each_rows_first_round_at_batch_three(kind, tiny_target, first_round_laws):
    """Exactness at batch 3, T = 1, through the tiny Llama target with the draft model (``tiny_draft``, gamma 1) and
    with n-gram lookup (gamma 2), on left-padded prompts of different lengths.

    Exact part (enumeration, no sampling): each row's law of what the first round emits, {tokens: probability}, is
    the verifier's ``chain_law`` applied to the p and q the batched loop hands the verifier. For the draft model every
    possible draft is enumerated by forcing every row's draft to each token v in turn (``Forced``; q is the draft
    model's own, as the loop computes it): 64 batched rounds give each row's p after every draft. The loop's p and q
    equal, within 1e-5, the ones a lone prompt gets (a fresh forward over the row's tokens, pads dropped); the law made
    from them equals the one made from the lone prompt's p and q within 1e-6, and its first token's law is the
    target's own next-token law (``exact_target_distribution``) within 1e-6. Each mutant whose law can be enumerated
    (``MUTANTS`` less ``NO_EXACT_LAW``) moves some row's law by more than 1e-4, a hundred times that agreement."""
    laws, lone, error = first_round_laws[kind]
    rows = [row.to(DEVICE) for row in LAW_CASES[kind][0]()]
    assert error < 1e-5  # the loop hands the verifier each row's own p and q
    for b, row in enumerate(rows):
        law = laws["exact"][b]
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-6)  # float32 p and q
        assert max_abs_difference(law, lone[b]) < 1e-6
        first = {}
        for tokens, pr in law.items():
            first[tokens[:1]] = first.get(tokens[:1], 0.0) + pr
        assert max_abs_difference(first, exact_target_distribution(tiny_target, row.cpu(), 1)) < 1e-6
    assert all(any(len(tokens) > 1 for tokens in law) for law in laws["exact"])  # drafts can be accepted
    for name in MUTANTS:
        if name not in NO_EXACT_LAW:
            assert max(max_abs_difference(broken, right) for broken, right in zip(laws[name], laws["exact"])) > 1e-4


def joint_law(row_laws: list, width: int) -> dict:
    """One law over the cells (row, emitted tokens padded with -1 to ``width``), each row weighing 1/3: a sample
    of N runs is then 3N outcomes, N per row."""
    return {(b,) + tokens + (-1,) * (width - len(tokens)): pr / len(row_laws)
            for b, law in enumerate(row_laws) for tokens, pr in law.items()}


def power(right_rows: list, broken_rows: list, gamma: int, n_runs: int) -> float:
    """Power of the chi-square test of n_runs runs against a mutant whose rows' laws are ``broken_rows``: the
    noncentral chi-square power at level LEVEL, or the probability that some row shows an outcome its exact law
    (``right_rows``) forbids, whichever is larger."""
    noncentral = chi_square_power(joint_law(right_rows, gamma + 1), joint_law(broken_rows, gamma + 1),
                                  len(right_rows) * n_runs, LEVEL)
    unseen = 1.0
    for right, broken in zip(right_rows, broken_rows):
        unseen *= (1 - sum(pr for tokens, pr in broken.items() if right.get(tokens, 0.0) <= 0)) ** n_runs
    return max(noncentral, 1 - unseen)


def sampled(kind, target, draft, rows, gamma, n_runs, verifier) -> np.ndarray:
    """(3 n_runs, 1 + gamma + 1): (row, its first round's tokens padded with -1) of n_runs seeds."""
    out = []
    for seed in range(n_runs):
        drafter = sd.NGramDraft() if kind == "n-gram" else sd.ModelDraft(draft)
        for b, tokens in enumerate(first_round(target, drafter, rows, gamma, seed, verifier)):
            out.append([b] + tokens + [-1] * (gamma + 1 - len(tokens)))
    return np.array(out)


@pytest.mark.parametrize("kind", LAW_CASES)
def test_first_rounds_sampled_at_batch_three_follow_each_rows_law(kind, tiny_target, tiny_draft, first_round_laws):
    """N runs (seeds 0..N-1) of the batched loop, stopped after their first round (``on_round``); each
    row's emitted tokens, as the loop emits them, are tested against that row's exact law by one Pearson chi-square
    over the cells (row, tokens) (cells expected below 5 merged), at level 1e-3 (fixed seeds: deterministic); an
    outcome the law forbids rejects at once (p = 0). N = 400 for the draft model, 200 for n-gram. Power against each
    mutant's enumerated law, computed in the test and required above 0.99: the noncentral chi-square power at that N
    and level, or, where larger, the probability that N runs show an outcome the exact law forbids (``power``).
    Draft model: "residual from p" 1.0 (forbidden outcomes: 11.0 to 14.7% of a row's first rounds; noncentral 0.9999),
    "inverted ratio q/p" 1.0; n-gram: "residual from p" 1.0 (forbidden: 7.6 to 9.3%; noncentral 0.004), "inverted
    ratio q/p" 1.0. Those mutants and "bonus after last-position rejection" (no enumerated law, as in
    test_exactness.py) must be rejected at p < 1e-6. The first round rarely reaches its bonus with these drafts, so
    "bonus from wrong position" moves the law by too little for this N (power about 0.001): the exact part rejects
    it."""
    rows, gamma, n_runs, powered = LAW_CASES[kind]
    rows = [row.to(DEVICE) for row in rows()]
    laws = first_round_laws[kind][0]
    right = joint_law(laws["exact"], gamma + 1)
    assert chi_square_pvalue(sampled(kind, tiny_target, tiny_draft, rows, gamma, n_runs, EXACT), right) > LEVEL
    for name in powered + sorted(NO_EXACT_LAW):
        if name not in NO_EXACT_LAW:
            assert power(laws["exact"], laws[name], gamma, n_runs) > 0.99
        broken = sampled(kind, tiny_target, tiny_draft, rows, gamma, n_runs, MUTANTS[name])
        assert chi_square_pvalue(broken, right) < 1e-6
