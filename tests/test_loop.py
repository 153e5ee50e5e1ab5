"""The loop on tiny random Hugging Face Llama models: greedy identity, cache truth, EOS, round bounds (C4)."""
import pytest
import torch

import specdec_lite as sd
from specdec_lite.core.lm import HFCausalLM
from specdec_lite.repro.toy import MarkovLM, random_pair

from conftest import DEVICE, tiny_llama

GREEDY = sd.SamplingParams(temperature=0)


def prompt(n=7, seed=0, vocab=64):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def draft_kinds(target, draft):
    return {
        "draft model": draft,
        "n-gram": sd.NGramDraft(),
        "layer-skip (early exit)": sd.LayerSkipDraft(target, exit_layer=2),
        "layer-skip (skip middle)": sd.LayerSkipDraft(target),
        "target as its own draft": target,
    }


@pytest.mark.parametrize("kind", ["draft model", "n-gram", "layer-skip (early exit)", "layer-skip (skip middle)",
                                  "target as its own draft"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_identity_tiny(tiny_target, tiny_draft, kind, gamma):
    x = prompt(seed=gamma)
    reference = tiny_target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=48, do_sample=False,
                                     pad_token_id=0)[0, x.shape[1]:].cpu()
    ours = sd.autoregressive_generate(tiny_target, x, max_new_tokens=48, sampling=GREEDY)
    assert torch.equal(ours.tokens, reference)
    draft = draft_kinds(tiny_target, tiny_draft)[kind]
    spec = sd.speculative_generate(tiny_target, draft, x, gamma=gamma, max_new_tokens=48, sampling=GREEDY)
    assert torch.equal(spec.tokens, reference)


def test_self_draft_accepts_everything(tiny_target):
    spec = sd.speculative_generate(tiny_target, tiny_target, prompt(), gamma=4, max_new_tokens=40, sampling=GREEDY)
    assert spec.stats.acceptance_rate == 1.0
    assert all(n == 5 for n in spec.stats.accepted_lengths[:-1])


class CheckedLM(HFCausalLM):
    """Records the tokens it has seen and, on every feed, compares its logits (computed with the rolled-back
    cache) with a fresh recompute over the whole history without any cache."""

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.history = None
        self.checks = 0
        self.max_error = 0.0

    def reset(self, batch_size, padding=None, tokens=None):
        super().reset(batch_size, padding, tokens)
        self.history = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)

    def feed(self, tokens, num_logits=None):
        logits = super().feed(tokens, num_logits)
        self.history = torch.cat([self.history, tokens], dim=1)
        with torch.inference_mode():
            fresh = self.model(input_ids=self.history, use_cache=False).logits[:, -logits.shape[1]:, : self.vocab_size]
        self.max_error = max(self.max_error, (fresh - logits).abs().max().item())
        self.checks += 1
        assert self.cache_seq_length() == self.length == self.history.shape[1]
        return logits

    def crop(self, lengths):
        super().crop(lengths)
        self.history = self.history[:, : max(lengths)]
        assert self.cache_seq_length() == self.length == self.history.shape[1]


@pytest.mark.parametrize("sampling", [GREEDY, sd.SamplingParams(temperature=1.0)])
@pytest.mark.parametrize("seed", [0, 22])  # on a CPU, seed 22's last round at T = 1 emits 4 tokens past the end
def test_cache_truth_after_every_rollback(tiny_target, tiny_draft, sampling, seed):
    target = CheckedLM(tiny_target)
    draft_lm = CheckedLM(tiny_draft)
    x = prompt(n=9, seed=seed)
    spec = sd.speculative_generate(target, sd.ModelDraft(draft_lm), x, gamma=4, max_new_tokens=60, sampling=sampling,
                                   seed=seed)
    # the cache holds the tokens seen, everything but the newest token; the last round may emit past
    # max_new_tokens (cut from the output, not from the cache: up to gamma more), which a GPU's random stream hit
    total = x.shape[1] + len(spec.tokens)
    assert total - 1 <= target.length <= total - 1 + 4 and target.history.shape[1] == target.length
    assert torch.equal(target.history[0, : total - 1], torch.cat([x[0], spec.tokens.to(x.device)])[:-1])
    assert target.checks == spec.stats.rounds and draft_lm.checks > spec.stats.rounds
    assert any(n < 5 for n in spec.stats.accepted_lengths)  # rollbacks really happened
    assert target.max_error < 1e-4 and draft_lm.max_error < 1e-4


def test_cache_truth_layer_skip(tiny_target):
    draft = sd.LayerSkipDraft(tiny_target, layers=[0, 3])
    draft.lm = CheckedLM(draft.lm.model, vocab_size=draft.lm.vocab_size)
    spec = sd.speculative_generate(tiny_target, draft, prompt(), gamma=3, max_new_tokens=40, sampling=GREEDY)
    assert draft.lm.checks > spec.stats.rounds and draft.lm.max_error < 1e-4
    # the layer-skip draft has its own cache: the target's layers are untouched and it still decodes alone
    assert torch.equal(spec.tokens, sd.autoregressive_generate(tiny_target, prompt(), max_new_tokens=40,
                                                               sampling=GREEDY).tokens)


def test_round_bounds_c4():
    """C4: each round emits between 1 and gamma+1 tokens."""
    target, draft = random_pair(6, 0.5, 1)
    for gamma in (1, 2, 5):
        gen = sd.speculative_generate(target, draft, torch.zeros(2000, 1, dtype=torch.long), gamma=gamma,
                                      max_new_tokens=20, seed=gamma)
        lengths = torch.tensor(gen.stats.accepted_lengths)
        assert lengths.min() >= 1 and lengths.max() <= gamma + 1
        assert lengths.max() == gamma + 1 and lengths.min() == 1  # both extremes occur


def deterministic_chain(vocab=8):
    """0 -> 1 -> 2 -> ... -> vocab-1 -> 0, with probability 1."""
    t = torch.zeros(vocab, vocab, dtype=torch.float64)
    t[torch.arange(vocab), (torch.arange(vocab) + 1) % vocab] = 1.0
    return MarkovLM(t)


def test_eos_accepted_mid_block_stops_generation():
    chain = deterministic_chain()
    gen = sd.speculative_generate(chain, deterministic_chain(), torch.tensor([[0]]), gamma=6, max_new_tokens=20,
                                  eos_token_id=3)
    assert gen.tokens.tolist() == [1, 2, 3]  # EOS was accepted as the 3rd of 6 drafts; nothing after it
    assert gen.stats.rounds == 1 and gen.stats.new_tokens == 3
    base = sd.autoregressive_generate(chain, torch.tensor([[0]]), max_new_tokens=20, eos_token_id=[5, 3])
    assert base.tokens.tolist() == [1, 2, 3]


def test_eos_on_real_model(tiny_target, tiny_draft):
    x = prompt()
    full = sd.autoregressive_generate(tiny_target, x, max_new_tokens=30, sampling=GREEDY).tokens
    eos = int(full[10])
    first = int((full == eos).nonzero()[0])
    for draft in (tiny_draft, sd.NGramDraft(), tiny_target):
        spec = sd.speculative_generate(tiny_target, draft, x, gamma=5, max_new_tokens=30, sampling=GREEDY,
                                       eos_token_id=eos)
        assert spec.tokens.tolist() == full[: first + 1].tolist()


def test_generation_stops_at_the_targets_own_eos_unless_told_otherwise():
    """As transformers' generate: by default a run ends just after the target's ``generation_config.eos_token_id``
    (an id or a list of ids); ``ignore_eos=True`` runs to max_new_tokens; an explicit ``eos_token_id`` replaces the
    model's."""
    target, draft = tiny_llama(layers=2, seed=11), tiny_llama(layers=1, seed=12)
    x = prompt()
    target.generation_config.eos_token_id = None
    full = sd.autoregressive_generate(target, x, max_new_tokens=30, sampling=GREEDY).tokens
    emitted = list(dict.fromkeys(full.tolist()))  # each token once, in the order of first emission
    eos, other = emitted[-1], emitted[1]  # the model's EOS below, and an explicit id emitted before it
    first, first_other = full.tolist().index(eos), full.tolist().index(other)
    assert len(full) == 30 and 0 < first_other < first < 29
    absent = min(set(range(64)) - set(full.tolist()))
    for model_eos in (eos, [absent, eos]):  # an id, or a list of ids
        target.generation_config.eos_token_id = model_eos
        reference = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30, do_sample=False,
                                    pad_token_id=0)[0, x.shape[1]:].cpu()
        assert reference.tolist() == full[: first + 1].tolist()  # transformers stops there too
        assert torch.equal(sd.autoregressive_generate(target, x, max_new_tokens=30, sampling=GREEDY).tokens, reference)
        for d in (draft, sd.NGramDraft(), target):
            spec = sd.speculative_generate(target, d, x, gamma=4, max_new_tokens=30, sampling=GREEDY)
            assert torch.equal(spec.tokens, reference) and spec.stats.new_tokens == first + 1
        wrapped = sd.speculative_generate(HFCausalLM(target), draft, x, gamma=4, max_new_tokens=30, sampling=GREEDY)
        assert torch.equal(wrapped.tokens, reference)  # a wrapper reads its model's generation config
    for run in (lambda **kw: sd.autoregressive_generate(target, x, max_new_tokens=30, sampling=GREEDY, **kw),
                lambda **kw: sd.speculative_generate(target, draft, x, gamma=4, max_new_tokens=30, sampling=GREEDY,
                                                     **kw)):
        assert torch.equal(run(ignore_eos=True).tokens, full)
        assert run(eos_token_id=other).tokens.tolist() == full[: first_other + 1].tolist()
        with pytest.raises(ValueError, match="eos_token_id=.* and ignore_eos=True contradict each other"):
            run(eos_token_id=other, ignore_eos=True)


def test_max_new_tokens_is_exact():
    """A toy model has no end-of-sequence token of its own: its runs end at max_new_tokens."""
    target, draft = random_pair(5, 0.5, 2)
    gen = sd.speculative_generate(target, target, torch.zeros(1, 1, dtype=torch.long), gamma=7, max_new_tokens=10)
    assert len(gen.tokens) == 10
    chain = deterministic_chain()  # emits every token of its vocabulary, in turn
    assert sd.autoregressive_generate(chain, torch.tensor([[0]]), max_new_tokens=20).tokens.tolist() == [
        (i + 1) % 8 for i in range(20)]


def test_stats_are_consistent(tiny_target, tiny_draft):
    spec = sd.speculative_generate(tiny_target, tiny_draft, prompt(), gamma=4, max_new_tokens=50,
                                   sampling=sd.SamplingParams(temperature=1.0), ignore_eos=True)
    s = spec.stats
    assert s.rounds == len(s.accepted_lengths) == len(s.proposed_lengths) and s.drafted == 4 * s.rounds == sum(s.proposed_lengths)
    assert s.accepted == sum(s.accepted_lengths) - s.rounds
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert s.mean_accepted_length == pytest.approx(sum(s.accepted_lengths) / s.rounds)
    assert sum(s.accepted_lengths) >= 50 == len(spec.tokens)


class StillClock:
    """Stands in for the time module the loop's clock reads (``stats.time``): its time stands still except when
    ``sleep`` moves it, so a run's recorded seconds are exactly the sleeps charged to each phase."""

    def __init__(self):
        self.seconds = 0.0

    def perf_counter(self) -> float:
        return self.seconds

    def sleep(self, seconds: float) -> None:
        self.seconds += seconds


class SleepyNGramDraft(sd.NGramDraft):
    """Prompt lookup whose every proposal takes ``seconds`` on ``clock``."""

    def __init__(self, seconds, clock):
        super().__init__()
        self.seconds, self.clock = seconds, clock

    def propose(self, *args):
        self.clock.sleep(self.seconds)
        return super().propose(*args)


def test_stats_charge_each_phase_its_own_time(monkeypatch):
    """A proposal takes 20 ms and a target forward 60 ms (one forward a round) on a clock that moves only then:
    the draft phase is charged exactly 20 ms a round, the target's exactly 60, and the total is their sum; time
    charged to the wrong phase, or missed, breaks an equality."""
    from specdec_lite.core import stats

    clock = StillClock()
    monkeypatch.setattr(stats, "time", clock)
    target = tiny_llama(layers=1, seed=2)
    forwards = []

    def slow_forward(*_):
        forwards.append(1)
        clock.sleep(0.06)

    target.register_forward_pre_hook(slow_forward)
    s = sd.speculative_generate(target, SleepyNGramDraft(0.02, clock), prompt(), gamma=4, max_new_tokens=8,
                                sampling=GREEDY, ignore_eos=True).stats
    assert s.rounds == len(forwards) > 1
    assert s.draft_seconds == pytest.approx(0.02 * s.rounds)
    assert s.target_seconds == pytest.approx(0.06 * s.rounds)
    assert s.total_seconds == pytest.approx(s.draft_seconds + s.target_seconds)


def test_sampling_is_seeded(tiny_target, tiny_draft):
    run = lambda seed: sd.speculative_generate(tiny_target, tiny_draft, prompt(), gamma=3, max_new_tokens=30,
                                               sampling=sd.SamplingParams(temperature=1.0), seed=seed).tokens
    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))


def test_padded_draft_vocabulary_is_aligned():
    """A draft whose embedding is padded beyond the tokenizer is aligned to the tokenizer's size."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(64)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    target = tiny_llama(vocab=64, layers=2, seed=0)
    padded = tiny_llama(vocab=80, layers=1, seed=3)
    sd.register_tokenizer(padded, tok)
    sd.register_tokenizer(target, tok)
    spec = sd.speculative_generate(target, padded, prompt(), gamma=3, max_new_tokens=30, sampling=GREEDY)
    assert torch.equal(spec.tokens, sd.autoregressive_generate(target, prompt(), max_new_tokens=30,
                                                               sampling=GREEDY).tokens)


def test_the_clock_synchronizes_cuda_only_when_asked(monkeypatch):
    """Per-phase timing synchronizes the GPU at every reading; timed=False leaves only the final one."""
    from specdec_lite.core.stats import Clock

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(1))
    timed, untimed = Clock(torch.device("cuda"), synchronize=True), Clock(torch.device("cuda"), synchronize=False)
    start = timed.now(), untimed.now()
    assert len(calls) == 1
    timed.total(start[0]), untimed.total(start[1])
    assert len(calls) == 3  # the total always waits for queued work
    Clock(torch.device("cpu")).now()
    assert len(calls) == 3


def test_an_untimed_run_gives_the_same_output(tiny_target, tiny_draft):
    x = torch.tensor([[3, 1, 4, 1, 5]])
    timed = sd.speculative_generate(tiny_target, tiny_draft, x, gamma=3, max_new_tokens=20, seed=4)
    untimed = sd.speculative_generate(tiny_target, tiny_draft, x, gamma=3, max_new_tokens=20, seed=4, timed=False)
    assert torch.equal(timed.tokens, untimed.tokens) and timed.stats.accepted_lengths == untimed.stats.accepted_lengths
