"""The server's pieces: the loop's per-round hook (what streaming sends), request checks, and its engine on a tiny
model (where a reply ends, a generation stopped between rounds)."""
import threading

import pytest
import torch

import specdec_lite as sd
from specdec_lite.repro.tasks import chat_ids
from specdec_lite.repro.toy import random_pair
from specdec_lite.serve import PLAIN, Engine, Stopped, check_body

CHAT = [{"role": "user", "content": "Count to a thousand."}]


def test_on_round_sees_growing_prefixes_that_end_in_the_returned_tokens():
    target, draft = random_pair(vocab=6, seed=3)
    seen = []
    out = sd.speculative_generate(target, draft, torch.tensor([0, 1]), gamma=3, max_new_tokens=20,
                                  sampling=sd.SamplingParams(temperature=1.0), seed=5,
                                  on_round=lambda rows: seen.append(rows[0].clone()))
    assert len(seen) == out.stats.rounds
    assert torch.equal(seen[-1], out.tokens)
    for before, after in zip(seen, seen[1:]):
        assert len(after) > len(before) and torch.equal(after[:len(before)], before)
    plain_seen = []
    plain = sd.autoregressive_generate(target, torch.tensor([0, 1]), max_new_tokens=7,
                                       on_round=lambda rows: plain_seen.append(len(rows[0])))
    assert plain_seen == list(range(1, 8)) and len(plain.tokens) == 7


def test_requests_the_server_cannot_run_are_refused_saying_what_to_do():
    good = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert check_body(good, "m") is None
    assert check_body(dict(good, model="x"), "m")[0] == 404 and "serves 'm'" in check_body(dict(good, model="x"), "m")[1]
    assert check_body(dict(good, messages=[]), "m")[0] == 400
    assert check_body(dict(good, messages=[{"role": "user"}]), "m")[0] == 400
    assert "max_tokens" in check_body(dict(good, max_tokens=-3), "m")[1]
    assert "max_tokens" in check_body(dict(good, max_tokens=0), "m")[1]
    assert "n = 1" in check_body(dict(good, n=2), "m")[1]
    assert check_body(["not", "a", "dict"], "m")[0] == 400


def test_the_harness_runs_its_requests_inside_a_running_event_loop_too():
    import asyncio

    from specdec_lite.repro.endpoints import run_coroutine

    async def answer():
        return 42

    async def from_a_notebook():  # a Jupyter kernel's cell runs while an event loop runs
        return run_coroutine(answer())

    assert run_coroutine(answer()) == 42 and asyncio.run(from_a_notebook()) == 42


@pytest.fixture(scope="module")
def engine(local_pairs):
    """The server's engine over a tiny random model (plain decoding), as ``python -m specdec_lite.serve`` makes it."""
    return Engine(str(local_pairs / "tiny-2l"), PLAIN, "cpu", "float32", gamma=4, name="tiny")


def test_a_reply_ends_at_the_models_own_eos_and_says_why(engine):
    greedy = sd.autoregressive_generate(engine.model, chat_ids(engine.tokenizer, CHAT), max_new_tokens=12,
                                        sampling=sd.SamplingParams(temperature=0), ignore_eos=True).tokens.tolist()
    own = engine.model.generation_config.eos_token_id
    try:
        engine.model.generation_config.eos_token_id = greedy[4]
        stop = engine.generate(CHAT, 12, 0.0, 1.0, 0, lambda _: None, threading.Event())
        engine.model.generation_config.eos_token_id = min(set(range(100)) - set(greedy))
        length = engine.generate(CHAT, 12, 0.0, 1.0, 0, lambda _: None, threading.Event())
    finally:
        engine.model.generation_config.eos_token_id = own
    assert (stop.finish_reason, stop.completion_tokens) == ("stop", greedy.index(greedy[4]) + 1)
    assert (length.finish_reason, length.completion_tokens) == ("length", 12)


@pytest.mark.parametrize("why", ["shutting down", "client gone"])
def test_a_generation_stops_after_the_round_that_sees_the_server_stop_or_the_client_go(engine, why):
    """SIGINT or SIGTERM (the app's lifespan sets ``shutting_down``) or a client that went away (``cancelled``)
    during a generation of up to 200 tokens: it stops after the round in which that happened, counted in rounds."""
    cancelled, pieces = threading.Event(), []

    def on_text(piece):
        pieces.append(piece)
        (engine.shutting_down if why == "shutting down" else cancelled).set()

    try:
        with pytest.raises(Stopped):
            engine.generate(CHAT, 200, 0.0, 1.0, 0, on_text, cancelled)
    finally:
        engine.shutting_down.clear()
    assert len(pieces) == 1
