"""The server's pieces: the loop's per-round hook (what streaming sends), request checks, and its engine on a tiny
model (where a reply ends, a generation stopped between rounds); batching: concurrent requests decoded in one batch,
each as it would be alone, streamed to its own client, ending at its own length; drafting that cannot batch served
one at a time; the server's imports."""
import asyncio
import json
import subprocess
import sys
import threading

import pytest
import torch

import specdec_lite as sd
from specdec_lite.tokenizers import chat_ids
from specdec_lite.drafts.trees import LookupTreeDraft
from specdec_lite.repro.toy import random_pair
from specdec_lite.serve import PLAIN, Engine, Refused, build_app, check_body

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


def test_on_round_returning_true_ends_the_run_with_what_it_made():
    """What a server whose clients have all gone does: the run stops after that round, its statistics counted, its
    tokens a prefix of the full run's."""
    target, draft = random_pair(vocab=6, seed=3)
    full = sd.speculative_generate(target, draft, torch.tensor([0, 1]), gamma=3, max_new_tokens=40, seed=5)
    rounds = []
    cut = sd.speculative_generate(target, draft, torch.tensor([0, 1]), gamma=3, max_new_tokens=40, seed=5,
                                  on_round=lambda rows: rounds.append(1) or len(rounds) == 2)
    assert cut.stats.rounds == 2 and 2 <= len(cut.tokens) < len(full.tokens)
    assert torch.equal(cut.tokens, full.tokens[:len(cut.tokens)]) and cut.stats.new_tokens == len(cut.tokens)
    plain = sd.autoregressive_generate(target, torch.tensor([0, 1]), max_new_tokens=40, on_round=lambda rows: True)
    assert len(plain.tokens) == 1 and plain.stats.rounds == 1


def test_each_row_of_a_batch_may_have_its_own_max_new_tokens():
    """The loop's per-row limits (what a server's batch of requests needs): each row ends at its own, as it would
    alone; a list that does not give one per row is refused."""
    target, draft = random_pair(vocab=6, seed=3)
    prompts, limits = torch.tensor([[0, 1], [2, 3], [4, 5]]), [3, 11, 6]
    for run in (lambda **kw: sd.speculative_generate(target, draft, gamma=3, **kw),
                lambda **kw: sd.autoregressive_generate(target, **kw)):
        out = run(input_ids=prompts, max_new_tokens=limits, sampling=sd.SamplingParams(temperature=0))
        assert [len(row) for row in out.sequences] == limits and out.stats.new_tokens == sum(limits)
        for row, prompt, n in zip(out.sequences, prompts, limits):
            assert torch.equal(row, run(input_ids=prompt, max_new_tokens=n,
                                        sampling=sd.SamplingParams(temperature=0)).tokens)
        with pytest.raises(ValueError, match="2 limits for 3 rows"):
            run(input_ids=prompts, max_new_tokens=[3, 4])
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            run(input_ids=prompts, max_new_tokens=[3, 0, 4])


def test_requests_the_server_cannot_run_are_refused_saying_what_to_do():
    good = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert check_body(good, "m").messages == good["messages"]

    def refusal(body) -> Refused:
        with pytest.raises(Refused) as caught:
            check_body(body, "m")
        return caught.value

    assert refusal(dict(good, model="x")).status == 404 and "serves 'm'" in refusal(dict(good, model="x")).message
    assert (refusal(dict(good, messages=[])).status, refusal(dict(good, messages=[])).param) == (400, "messages")
    assert refusal(dict(good, messages=[{"role": "user"}])).param == "messages[0].content"
    assert refusal(dict(good, max_tokens=-3)).param == "max_tokens" and "max_tokens" in refusal(dict(good, max_tokens=0)).message
    assert refusal(dict(good, n=2)).param == "n" and "n = 1" in refusal(dict(good, n=2)).message
    assert refusal(["not", "a", "dict"]).status == 400
    assert "temperature must be a number" in refusal(dict(good, temperature="hot")).message
    assert "seed must be an integer" in refusal(dict(good, seed=1.5)).message


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
    """The server stopping (``shutting_down``) or a client that went away (``cancelled``) during a generation of up
    to 200 tokens: it ends after the round in which that happened, with finish_reason "abort"."""
    cancelled, pieces = threading.Event(), []

    def on_text(piece):
        pieces.append(piece)
        (engine.shutting_down if why == "shutting down" else cancelled).set()

    try:
        done = engine.generate(CHAT, 200, 0.0, 1.0, 0, on_text, cancelled)
    finally:
        engine.shutting_down.clear()
    assert len(pieces) == 1 and done.finish_reason == "abort" and done.text == pieces[0]
    assert done.completion_tokens == 2  # the round it was stopped in made its second token


# ---------------------------------------------------------------- batching
CHATS = [[{"role": "user", "content": "Count to a thousand, slowly and in words."}],
         [{"role": "user", "content": "Name three colours."}],
         [{"role": "user", "content": "hi"}]]  # three prompt lengths: the batch is left-padded


@pytest.fixture(scope="module")
def drafted(local_pairs):
    """The engine of a speculative server drafting with a draft model (a chain: it batches)."""
    return Engine(str(local_pairs / "tiny-2l"), str(local_pairs / "tiny-1l"), "cpu", "float32", gamma=3, name="tiny")


def alone(engine, chat, max_tokens: int) -> tuple[str, int, str]:
    """(text, tokens, finish reason) of plain greedy decoding of one chat by itself, to the model's own EOS."""
    out = sd.autoregressive_generate(engine.model, chat_ids(engine.tokenizer, chat), max_new_tokens=max_tokens,
                                     sampling=sd.SamplingParams(temperature=0)).tokens.tolist()
    eos = engine.model.generation_config.eos_token_id
    finish = "stop" if out and out[-1] in (eos if isinstance(eos, list) else [eos]) else "length"
    return engine.tokenizer.decode(out, skip_special_tokens=True), len(out), finish


def ask(engine, bodies: list[dict]) -> list:
    """Send ``bodies`` to the engine's app all at once (in-process); each answer as JSON, or a stream's events
    (JSON, or "[DONE]")."""
    import httpx

    async def one(client, body):
        response = await client.post("/v1/chat/completions", json=dict(body, model=engine.name))
        assert response.status_code == 200, response.text
        if not body.get("stream"):
            return response.json()
        events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
        return [e if e == "[DONE]" else json.loads(e) for e in events]

    async def all_at_once():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(engine)), base_url="http://t") as c:
            return await asyncio.gather(*(one(c, body) for body in bodies))

    return asyncio.run(all_at_once())


def models_entry(engine) -> dict:
    import httpx

    async def get():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(engine)), base_url="http://t") as c:
            return (await c.get("/v1/models")).json()["data"]

    [entry] = asyncio.run(get())
    return entry


@pytest.mark.parametrize("kind", ["engine", "drafted"])
def test_concurrent_requests_are_decoded_in_one_batch_each_as_it_would_be_alone(kind, request, monkeypatch):
    """Three requests sent at once (greedy, three prompt lengths, three max_tokens): one batch of three, and each
    reply is what its request gets alone, ending at its own max_tokens."""
    engine = request.getfixturevalue(kind)
    monkeypatch.setattr(engine, "gather_s", 1.0)  # all three arrive within the gathering window
    before, limits = len(engine.batch_sizes), [9, 3, 6]
    answers = ask(engine, [{"messages": chat, "max_tokens": n, "temperature": 0} for chat, n in zip(CHATS, limits)])
    assert engine.batch_sizes[before:] == [3]
    for chat, n, answer in zip(CHATS, limits, answers):
        text, tokens, finish = alone(engine, chat, n)
        assert (answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]) == (text, tokens)
        assert tokens == n and answer["choices"][0]["finish_reason"] == finish == "length"


def test_each_stream_gets_its_own_rows_text_and_ends_with_its_row(drafted, monkeypatch):
    monkeypatch.setattr(drafted, "gather_s", 1.0)
    before, limits = len(drafted.batch_sizes), [12, 2, 7]
    streams = ask(drafted, [{"messages": chat, "max_tokens": n, "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}} for chat, n in zip(CHATS, limits)])
    assert drafted.batch_sizes[before:] == [3]
    for chat, n, events in zip(CHATS, limits, streams):
        text, tokens, finish = alone(drafted, chat, n)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} and events[-1] == "[DONE]"
        content = [e["choices"][0]["delta"].get("content") for e in events[1:-3]]
        assert "".join(content) == text and all(content)
        assert events[-3]["choices"][0]["finish_reason"] == finish and events[-2]["usage"]["completion_tokens"] == n
        assert len(content) <= n  # one piece at most per round of its own, each with at least one token


def test_a_row_leaves_its_batch_when_it_ends_and_streams_no_more(engine, monkeypatch):
    """A 3-token request and a 15-token one in one batch: the short one's reply is complete (its Future done)
    while the long one still streams, and nothing reaches it after its third token."""
    monkeypatch.setattr(engine, "gather_s", 1.0)
    events, before = [], len(engine.batch_sizes)
    short = engine.submit(CHATS[0], 3, 0.0, 1.0, 0, lambda piece: events.append("short"), threading.Event())
    long = engine.submit(CHATS[1], 15, 0.0, 1.0, 0, lambda piece: events.append(("long", short.done)),
                         threading.Event())
    assert long.result.result(timeout=120).completion_tokens == 15
    assert short.result.result().completion_tokens == 3 and engine.batch_sizes[before:] == [2]
    last_short = max(i for i, e in enumerate(events) if e == "short")
    assert 1 <= events.count("short") <= 3 and all(e[1] for e in events[last_short + 1:])
    assert ("long", True) in events  # the long row went on after the short one's reply was complete


def test_rows_end_at_their_own_end_of_sequence_token(engine, monkeypatch):
    """The model's EOS set to a token one row makes early: that row ends there ("stop"), the others go on, each
    as it would alone."""
    monkeypatch.setattr(engine, "gather_s", 1.0)
    greedy = sd.autoregressive_generate(engine.model, chat_ids(engine.tokenizer, CHATS[0]), max_new_tokens=10,
                                        sampling=sd.SamplingParams(temperature=0), ignore_eos=True).tokens.tolist()
    monkeypatch.setattr(engine.model.generation_config, "eos_token_id", greedy[3])
    expected = [alone(engine, chat, 10) for chat in CHATS]
    answers = ask(engine, [{"messages": chat, "max_tokens": 10, "temperature": 0} for chat in CHATS])
    assert expected[0][1:] == (greedy.index(greedy[3]) + 1, "stop")
    for (text, tokens, finish), answer in zip(expected, answers):
        assert answer["choices"][0]["message"]["content"] == text and answer["usage"]["completion_tokens"] == tokens
        assert answer["choices"][0]["finish_reason"] == finish


def test_a_request_that_arrives_during_a_batch_joins_the_next_one(engine, monkeypatch):
    monkeypatch.setattr(engine, "gather_s", 0.0)
    late, before = [], len(engine.batch_sizes)

    def on_text(piece):  # the first request's batch is running: a second one arrives
        if not late:
            late.append(engine.submit(CHATS[1], 5, 0.0, 1.0, 0, lambda _: None, threading.Event()))

    first = engine.generate(CHATS[0], 8, 0.0, 1.0, 0, on_text, threading.Event())
    second = late[0].result.result(timeout=120)
    assert engine.batch_sizes[before:] == [1, 1]
    assert (first.text, first.completion_tokens) == alone(engine, CHATS[0], 8)[:2]
    assert (second.text, second.completion_tokens) == alone(engine, CHATS[1], 5)[:2]


def test_a_client_that_goes_away_leaves_the_batch_and_the_others_go_on(engine, monkeypatch):
    monkeypatch.setattr(engine, "gather_s", 1.0)
    gone = threading.Event()
    leaving = engine.submit(CHATS[0], 12, 0.0, 1.0, 0, lambda piece: gone.set(), gone)  # leaves after one round
    staying = engine.submit(CHATS[1], 12, 0.0, 1.0, 0, lambda _: None, threading.Event())
    done = staying.result.result(timeout=120)
    assert leaving.result.result().finish_reason == "abort"
    assert (done.text, done.completion_tokens) == alone(engine, CHATS[1], 12)[:2]


def test_requests_that_sample_differently_run_in_separate_batches(engine, monkeypatch):
    monkeypatch.setattr(engine, "gather_s", 1.0)
    before = len(engine.batch_sizes)
    answers = ask(engine, [{"messages": CHATS[0], "max_tokens": 4, "temperature": 0},
                           {"messages": CHATS[1], "max_tokens": 4, "temperature": 0.7, "seed": 1},
                           {"messages": CHATS[2], "max_tokens": 4, "temperature": 0, "seed": 5},
                           {"messages": CHATS[2], "max_tokens": 4, "temperature": 0.7, "seed": 2}])
    assert sorted(engine.batch_sizes[before:]) == [1, 1, 2]  # the greedy pair shares one (seeds do not matter)
    assert all(a["usage"]["completion_tokens"] == 4 for a in answers)


def test_models_says_how_the_server_batches(engine, drafted):
    for served in (engine, drafted):
        entry = models_entry(served)
        assert entry["max_concurrent_requests"] == 16 and entry["queued"] is True
        assert entry["batching"]["max_batch"] == 16 and entry["batching"]["joins"] == "next batch"
        assert entry["batching"]["greedy"] is True and entry["batching"]["sampled"] is True
        assert entry["batching"]["one_at_a_time"] == {}


def test_max_batch_1_serves_one_request_at_a_time(local_pairs):
    one = Engine(str(local_pairs / "tiny-2l"), PLAIN, "cpu", "float32", gamma=4, name="tiny", max_batch=1)
    try:
        answers = ask(one, [{"messages": chat, "max_tokens": n, "temperature": 0} for chat, n in zip(CHATS, [5, 2, 4])])
        assert one.batch_sizes == [1, 1, 1]
        for chat, n, answer in zip(CHATS, [5, 2, 4], answers):
            assert answer["choices"][0]["message"]["content"] == alone(one, chat, n)[0]
        entry = models_entry(one)
        assert entry["max_concurrent_requests"] == 1 and entry["batching"]["max_batch"] == 1
        assert entry["batching"]["greedy"] is False and "--max-batch 1" in entry["batching"]["one_at_a_time"]["greedy"]
    finally:
        one.close()


def test_drafting_that_cannot_batch_is_served_one_request_at_a_time_and_says_so(local_pairs, monkeypatch):
    """Token trees draft for one prompt: /v1/models says greedy and sampled requests run one at a time, and
    concurrent requests are answered one after another, each right. A batch the loop refuses anyway (here: the
    engine wrongly told trees batch) is run again one request at a time: no request fails."""
    trees = Engine(str(local_pairs / "tiny-2l"), LookupTreeDraft(), "cpu", "float32", gamma=3, name="tiny")
    try:
        monkeypatch.setattr(trees, "gather_s", 1.0)
        entry = models_entry(trees)
        assert entry["batching"]["greedy"] is False and "token trees" in entry["batching"]["one_at_a_time"]["greedy"]
        assert entry["max_concurrent_requests"] == 1
        bodies = [{"messages": chat, "max_tokens": 6, "temperature": 0} for chat in CHATS]
        expected = [alone(trees, chat, 6)[0] for chat in CHATS]
        assert [a["choices"][0]["message"]["content"] for a in ask(trees, bodies)] == expected
        assert trees.batch_sizes == [1, 1, 1]
        monkeypatch.setattr(trees, "refusals", {"greedy": None, "sampled": None})
        assert [a["choices"][0]["message"]["content"] for a in ask(trees, bodies)] == expected
        assert trees.batch_sizes[3:] == [3, 1, 1, 1]  # refused before its first round, then one at a time
    finally:
        trees.close()


def test_the_server_imports_only_the_core_and_the_drafts(local_pairs):
    """serve.py names no module of repro, train or sweep, and serving a request loads none beyond what
    ``import specdec_lite`` loads (its toy models and theory; checked in a fresh interpreter)."""
    import ast

    import specdec_lite.serve as serve

    named = {node.module or "" for node in ast.walk(ast.parse(open(serve.__file__).read()))
             if isinstance(node, ast.ImportFrom)}
    assert named and not {m for m in named if m.lstrip(".").split(".")[0] in ("repro", "train", "sweep")}, named
    code = f"""
import sys, threading
import specdec_lite
outside = ("specdec_lite.repro", "specdec_lite.train", "specdec_lite.sweep")
before = {{m for m in sys.modules if m.startswith(outside)}}
from specdec_lite.serve import PLAIN, Engine, build_app, check_arguments, main
path = {str(local_pairs / "tiny-2l")!r}
check_arguments(path, PLAIN, "cpu", "float32")
engine = Engine(path, PLAIN, "cpu", "float32", gamma=4, name="tiny")
build_app(engine)
engine.generate([{{"role": "user", "content": "hi"}}], 3, 0.0, 1.0, 0, lambda _: None, threading.Event())
engine.close()
print(" ".join(sorted({{m for m in sys.modules if m.startswith(outside)}} - before)))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [], run.stdout
