"""The refilling sampler (``train/refill.py``): each row takes the next prompt as soon as its reply ends, in a
right-aligned cache with per-row positions. Greedy replies equal ``generate``'s one prompt at a time, and the
law of the first two sampled tokens is the model's, while rows of other prompts and temperatures come and go."""
import numpy as np
import pytest
import torch

from specdec_lite.repro.stats import chi_square_power, chi_square_pvalue
from specdec_lite.repro.tasks import chat_ids
from specdec_lite.train.refill import RefillingSampler

from conftest import tiny_llama

PROMPTS = ["Hi", "Summarize the plot of a film about a lighthouse keeper in two sentences, please.",
           "Translate 'good morning' into French.", "def add(a, b):", "Tell me a story about a cat and a dog.",
           "Why is the sky blue?", "x"]


class StopAt:
    """The embedded tokenizer with another end-of-sequence token: one the tiny random model writes often, so
    that its replies end at different lengths."""

    def __init__(self, tokenizer, eos: int):
        self.tokenizer, self.eos_token_id, self.pad_token_id = tokenizer, eos, tokenizer.pad_token_id
        self.chat_template = tokenizer.chat_template

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        return self.tokenizer.apply_chat_template(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny(embedded):
    """A tiny random Llama with the embedded tokenizer, its queries, keys and output sharpened so that its next
    token depends on positions and on what each token attends to (a shift of one position changes the law of the
    second token enough for the chi-square below to see it)."""
    _, tokenizer = embedded
    model = tiny_llama(vocab=len(tokenizer), layers=2, hidden=32, seed=7, max_positions=2048)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return model, tokenizer


def greedy_reference(model, tokenizer, prompt: str, max_new_tokens: int, eos: int) -> list[int]:
    ids = chat_ids(tokenizer, prompt)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos)[0, ids.shape[1]:].tolist()
    return out[: out.index(eos) + 1] if eos in out else out


def ending_token(model, tokenizer) -> int:
    """The token that, taken as end-of-sequence, ends the model's greedy replies to PROMPTS at the most
    different lengths."""
    replies = [greedy_reference(model, tokenizer, p, 16, tokenizer.eos_token_id) for p in PROMPTS]
    ends = lambda t: {r.index(t) + 1 if t in r else 16 for r in replies}
    return max({t for r in replies for t in r}, key=lambda t: len(ends(t)))


def test_greedy_replies_equal_generate_one_prompt_at_a_time_while_rows_refill(tiny):
    model, tokenizer = tiny
    eos = ending_token(model, tokenizer)
    stop_at = StopAt(tokenizer, eos)
    requests = [({"prompt": p, "n": i}, 0.0 if i % 3 else 1.0) for i, p in enumerate(PROMPTS * 3)]
    sampler = RefillingSampler(model, stop_at, batch_size=4, max_new_tokens=16, refill_at=1, seed=0)
    replies = list(sampler.run(requests))
    assert sorted(r["n"] for r, *_ in replies) == list(range(len(requests)))  # each request once
    lengths = {len(reply) for _, _, _, reply in replies}
    assert min(lengths) < 16 in lengths  # some replies ended early: their rows were refilled while others ran
    for request, temperature, prompt_ids, reply in replies:
        assert prompt_ids == chat_ids(tokenizer, request["prompt"])[0].tolist()
        assert len(reply) <= 16 and (reply[-1] == eos or len(reply) == 16) and eos not in reply[:-1]
        if temperature == 0:  # beside sampled rows
            assert reply == greedy_reference(model, tokenizer, request["prompt"], 16, eos), request


def test_stop_finishes_the_rows_under_way_and_starts_no_new_request(tiny):
    model, tokenizer = tiny
    sampler = RefillingSampler(model, tokenizer, batch_size=3, max_new_tokens=5, seed=0)
    requests = [({"prompt": p}, 0.0) for p in PROMPTS]
    done = []
    for request, _, _, reply in sampler.run(requests, stop=lambda: len(done) >= 1):
        done.append(reply)
    assert len(done) == 3 and all(len(r) == 5 for r in done)  # the first batch of three, whole


def two_token_law(model, tokenizer, prompt: str, positions_shift: int = 0, floor: float = 1e-5) -> dict:
    """The exact law of the first two reply tokens at T = 1 (first tokens below ``floor`` left out: their mass
    goes to the chi-square's merged cell); ``positions_shift`` moves the second token's position (a broken
    sampler's law, for the power)."""
    ids = chat_ids(tokenizer, prompt)
    with torch.no_grad():
        p1 = model(ids).logits[0, -1].double().softmax(-1)
        law = {}
        for t1 in (p1 > floor).nonzero().flatten().tolist():
            seq = torch.cat([ids, torch.tensor([[t1]])], dim=1)
            positions = torch.arange(seq.shape[1])[None].clone()
            positions[0, -1] += positions_shift
            p2 = model(seq, position_ids=positions).logits[0, -1].double().softmax(-1)
            for t2 in (p2 * p1[t1] > floor).nonzero().flatten().tolist():
                law[(t1, t2)] = float(p1[t1] * p2[t2])
    return law


def law_pvalue(draws: list, law: dict) -> float:
    """The chi-square p-value of two-token draws against ``law``, pairs the law leaves out counted in one cell
    (-1, -1) holding the mass it leaves out."""
    rest = (-1, -1)
    pairs = np.array([tuple(d) if tuple(d) in law else rest for d in draws])
    return chi_square_pvalue(pairs, {**law, rest: max(0.0, 1.0 - sum(law.values()))})


def test_sampled_rows_follow_the_models_two_token_law(tiny):
    """1,500 replies of two tokens at T = 1 to each of two prompts of different lengths, interleaved with greedy
    rows of a third, in rows that refill 8 at a time. At level 1e-3 the chi-square has power > 0.99 against the
    law of a sampler that places the second token one position off (computed below), and it rejects such a
    sampler (the next test)."""
    model, tokenizer = tiny
    prompts = [PROMPTS[1], PROMPTS[2]]
    n = 1500
    requests = []
    for i in range(n):
        requests += [({"prompt": prompts[0]}, 1.0), ({"prompt": prompts[1]}, 1.0)]
        requests += [({"prompt": PROMPTS[4]}, 0.0)] if i % 4 == 0 else []
    sampler = RefillingSampler(model, tokenizer, batch_size=64, max_new_tokens=2, seed=0)
    draws = {p: [] for p in prompts}
    for request, temperature, _, reply in sampler.run(requests):
        if temperature > 0 and len(reply) == 2:  # a first token that ended the reply has no second
            draws[request["prompt"]].append(reply)
    for prompt in prompts:
        law = two_token_law(model, tokenizer, prompt)
        assert len(draws[prompt]) > 0.95 * n
        assert law_pvalue(draws[prompt], law) > 1e-3
        assert chi_square_power(law, two_token_law(model, tokenizer, prompt, positions_shift=1), n) > 0.99


class ShiftedPositions(torch.nn.Module):
    """A model whose decode steps (one token a row) see positions one too far: a deliberately broken sampler."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config, self.device = model, model.config, model.device

    def forward(self, input_ids, position_ids, **kwargs):
        shift = 1 if input_ids.shape[1] == 1 else 0
        return self.inner(input_ids=input_ids, position_ids=position_ids + shift, **kwargs)


def test_the_law_test_rejects_a_sampler_with_shifted_positions(tiny):
    model, tokenizer = tiny
    prompt = PROMPTS[1]
    sampler = RefillingSampler(ShiftedPositions(model), tokenizer, batch_size=64, max_new_tokens=2, seed=0)
    draws = [reply for _, _, _, reply in sampler.run([({"prompt": prompt}, 1.0)] * 1500) if len(reply) == 2]
    assert law_pvalue(draws, two_token_law(model, tokenizer, prompt)) < 1e-3


def test_bad_settings_are_refused_before_any_work(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="batch_size and max_new_tokens must be >= 1"):
        RefillingSampler(model, tokenizer, batch_size=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        RefillingSampler(model, tokenizer, top_p=0.0)


def test_a_model_with_sliding_window_layers_is_refused_before_any_work(embedded):
    from transformers import MistralConfig, MistralForCausalLM

    _, tokenizer = embedded
    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    with pytest.raises(NotImplementedError, match="cannot be refilled row by row"):
        RefillingSampler(MistralForCausalLM(config).eval(), tokenizer)
