"""llama.cpp beside ours (``repro.llama_cpp``): its plain decoding, the bench's llama.cpp row, decodes the embedded
target's GGUF from the very token ids ours gets, and its v(n) is timed on a cache rolled back after each forward."""
import math

import numpy as np
import pytest

from specdec_lite.core.sampling import SamplingParams
from specdec_lite.names import embedded_gguf_path
from specdec_lite.repro import llama_cpp
from specdec_lite.repro.tasks import chat_ids, load_prompts

pytestmark = pytest.mark.slow


def test_llama_cpp_greedy_decodes_the_embedded_target_from_our_token_ids(embedded):
    """The GGUF holds the weights our float32 target computes with (Q4_1 blocks, exact in float32), so greedy
    decoding agrees token for token until the two engines' roundings part at a near tie: on the first prompt of
    two tasks the first 8 tokens agree (24 of 24 did when this was written). A chat template, a start token or a
    sampler that differed would part them at the first token."""
    model, tokenizer = embedded
    generate = llama_cpp.llama_cpp_plain(embedded_gguf_path(), 8, SamplingParams(temperature=0.0), seed=0)
    for prompt in [p for p in load_prompts(per_task=1) if p["task"] in ("code", "summarization")]:
        x = chat_ids(tokenizer, prompt["prompt"])
        ours = model.generate(x, do_sample=False, max_new_tokens=8)[0, x.shape[1]:]
        run = generate(x)
        assert run.tokens.tolist() == ours.tolist(), prompt["id"]
        assert run.stats.new_tokens == 8 and run.stats.total_seconds > 0


def test_llama_cpp_sampling_is_seeded_and_refuses_batches(embedded):
    tokenizer = embedded[1]
    x = chat_ids(tokenizer, load_prompts(per_task=1)[1]["prompt"])
    runs = [llama_cpp.llama_cpp_plain(embedded_gguf_path(), 16, SamplingParams(temperature=1.0), seed)(x).tokens
            for seed in (0, 0, 1)]
    assert runs[0].tolist() == runs[1].tolist() and runs[0].tolist() != runs[2].tolist()
    generate = llama_cpp.llama_cpp_plain(embedded_gguf_path(), 4, SamplingParams(temperature=0.0), seed=0)
    with pytest.raises(ValueError, match="one prompt"):
        generate(x.repeat(2, 1))


def test_an_eval_after_rolling_back_sees_the_same_cache():
    """``llama_cpp_costs`` rolls the cache back by setting ``n_tokens`` (llama-cpp-python's ``eval`` drops the
    cache's entries from there): the same tokens evaluated again give the same logits, and other tokens evaluated
    in between leave no trace."""
    llm = llama_cpp.load_gguf(embedded_gguf_path(), logits_all=True)
    llm.eval(list(range(100, 140)))
    batch = [200, 300, 400, 500]
    llm.eval(batch)
    first = np.array(llm.scores[40:44])
    llm.n_tokens = 40
    llm.eval([600, 700, 800])
    llm.n_tokens = 40
    llm.eval(batch)
    np.testing.assert_array_equal(np.array(llm.scores[40:44]), first)


def test_llama_cpp_costs_are_relative_to_one_decode_step_and_refuse_bad_settings():
    costs = llama_cpp.llama_cpp_costs(embedded_gguf_path(), tokens=(4,), context_len=16, repeats=3)
    assert sorted(costs) == [1, 4] and costs[1] == 1.0
    assert math.isfinite(costs[4]) and costs[4] > 1.0  # four tokens' logits cost more than one token's
    with pytest.raises(ValueError, match="repeats"):
        llama_cpp.llama_cpp_costs(embedded_gguf_path(), repeats=0)
    with pytest.raises(ValueError, match="context"):
        llama_cpp.llama_cpp_costs(embedded_gguf_path(), tokens=(2000,))
