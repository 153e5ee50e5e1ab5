"""The server against bad, odd and hostile input, under load and at shutdown: every field of a chat completion
honoured or refused naming it, prompts the loop would refuse refused before a stream starts, bodies read with a
limit and a deadline over real sockets, API keys, stop strings, clients that go away counted in /metrics, SIGTERM
draining, a fuzzing run after which a good request still gets its right answer; and the greedy-load measurement on
a tiny model."""
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pandas as pd
import pytest

import specdec_lite as sd
from specdec_lite.tokenizers import chat_ids
from specdec_lite.repro import greedy_load
from specdec_lite.repro.endpoints import free_port
from specdec_lite.serve import (PLAIN, SHUTDOWN_MARGIN_S, BodyLimits, Engine, Refused, build_app, first_stop,
                                held_back, room_left, startup_message)

CHAT = [{"role": "user", "content": "Count to ten."}]
GOOD = {"model": "tiny", "messages": CHAT, "max_tokens": 3, "temperature": 0}
CONTEXT = 1024  # the tiny models' max_position_embeddings (conftest.local_pairs)
LIMITS = BodyLimits(max_bytes=64 * 1024, timeout_s=1.0)  # the real server's: small, to be reached quickly


@pytest.fixture(scope="module")
def engine(local_pairs):
    served = Engine(str(local_pairs / "tiny-2l"), PLAIN, "cpu", "float32", gamma=4, name="tiny")
    yield served
    served.close()


@pytest.fixture(scope="module")
def app(engine):
    return build_app(engine)


@pytest.fixture(scope="module")
def drafted(local_pairs):
    """A speculative server's engine whose draft is a copy of the target: every draft is accepted, 4 tokens a
    round."""
    served = Engine(str(local_pairs / "tiny-2l"), str(local_pairs / "tiny-2l"), "cpu", "float32", gamma=3, name="tiny")
    yield served
    served.close()


def send(app, *bodies, headers=None, method="POST", path="/v1/chat/completions") -> list:
    """The app's responses (in process) to ``bodies`` sent all at once: dicts as ASCII JSON (a lone surrogate
    travels as its escape, as a client's JSON would carry it), bytes as they are."""
    async def one(client, body):
        content = None if method == "GET" else body if isinstance(body, bytes) else json.dumps(body).encode()
        return await client.request(method, path, content=content,
                                    headers={"content-type": "application/json", **(headers or {})})

    async def all_at_once():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await asyncio.gather(*(one(client, body) for body in bodies))

    return asyncio.run(all_at_once())


def events(text: str) -> list:
    """A stream's events: JSON objects, or "[DONE]"."""
    found = [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]
    return [e if e == "[DONE]" else json.loads(e) for e in found]


def refusal(response) -> dict:
    """The error of a refused request, checked to be OpenAI's error object."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["code"] == response.status_code, error
    return error


def alone(engine, chat, max_tokens: int) -> list[int]:
    """Plain greedy decoding of one chat by itself: its tokens."""
    return sd.autoregressive_generate(engine.model, chat_ids(engine.tokenizer, chat), max_new_tokens=max_tokens,
                                      sampling=sd.SamplingParams(temperature=0)).tokens.tolist()


# ---------------------------------------------------------------- every field honoured or refused, naming it
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
REFUSED = [  # (what changes in a good request, status, param, words of the message)
    ({"stop": ""}, 400, "stop", "non-empty string"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "up to 4"),
    ({"stop": ["\n", 3]}, 400, "stop", "non-empty strings"),
    ({"logprobs": True}, 400, "logprobs", "accepts only false"),
    ({"top_logprobs": 2}, 400, "top_logprobs", "omit top_logprobs"),
    ({"tools": TOOLS}, 400, "tools", "no tool calls"),
    ({"tool_choice": "auto"}, 400, "tool_choice", "no tool calls"),
    ({"functions": TOOLS}, 400, "functions", "no function calls"),
    ({"function_call": "auto"}, 400, "function_call", "no function calls"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, 400, "audio", "no audio output"),
    ({"modalities": ["text", "audio"]}, 400, "modalities", "omit modalities"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format", '{"type": "text"}'),
    ({"frequency_penalty": 0.5}, 400, "frequency_penalty", "accepts only 0"),
    ({"presence_penalty": False}, 400, "presence_penalty", "accepts only 0"),
    ({"logit_bias": {"50": 10}}, 400, "logit_bias", "accepts only {}"),
    ({"store": True}, 400, "store", "accepts only false"),
    ({"stream": "false"}, 400, "stream", "JSON boolean"),
    ({"seed": 2 ** 70}, 400, "seed", "from 0 to 9223372036854775807"),
    ({"seed": -1}, 400, "seed", "integer from 0"),
    ({"seed": True}, 400, "seed", "(a boolean)"),
    ({"temperature": True}, 400, "temperature", "must be a number"),
    ({"temperature": 2.5}, 400, "temperature", "from 0 to 2"),
    ({"top_p": 0}, 400, "top_p", "above 0 to 1"),
    ({"top_p": "1"}, 400, "top_p", "(a string)"),
    ({"max_tokens": 0}, 400, "max_tokens", "integer >= 1"),
    ({"max_tokens": "5"}, 400, "max_tokens", "integer >= 1"),
    ({"max_tokens": 3.0}, 400, "max_tokens", "(a number)"),
    ({"max_completion_tokens": 4}, 400, "max_tokens", "send one of them"),
    ({"n": 2}, 400, "n", "n = 1"),
    ({"n": True}, 400, "n", "n = 1"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options", '"stream": true only'),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage", "true or false"),
    ({"stream": True, "stream_options": {"continuous": True}}, 400, "stream_options.continuous", "include_usage only"),
    ({"user": 42}, 400, "user", "must be a string"),
    ({"wizardry": 1, "zeal": 2}, 400, "wizardry", "unknown fields 'wizardry', 'zeal'"),
    ({"model": "gpt-4o"}, 404, "model", "this server serves 'tiny'"),
    ({"model": None}, 400, "model", '"model": "tiny"'),
    ({"messages": "hi"}, 400, "messages", "non-empty array"),
    ({"messages": []}, 400, "messages", "non-empty array"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", "system, developer, user, assistant"),
    ({"messages": [*CHAT, {"role": "tool", "content": "42", "tool_call_id": "c1"}]}, 400, "messages[1].role",
     "one of system"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, 400, "messages[0].role", "(an array)"),
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, 400, "messages[0].content", "lone surrogate"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, 400,
     "messages[0].content[0].text", "not valid UTF-8"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     400, "messages[0].content[0].type", "text only"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache": 1}]}]}, 400,
     "messages[0].content[0].cache", "a text part is"),
    ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, 400, "messages[0].name", "remove it"),
    ({"messages": [{"role": "user", "content": None}]}, 400, "messages[0].content", "a string or"),
    ({"messages": [{"role": "user", "content": []}]}, 400, "messages[0].content", "non-empty array"),
    ({"stop": "\ud800"}, 400, "stop", "lone surrogate"),
]


@pytest.mark.parametrize("change, status, param, words", REFUSED, ids=[str(c)[:60] for c, *_ in REFUSED])
def test_a_field_that_cannot_be_honoured_is_refused_naming_it(app, change, status, param, words):
    [response] = send(app, {**GOOD, **change})
    error = refusal(response)
    assert (response.status_code, error["param"]) == (status, param), error
    assert words in error["message"], error["message"]


def test_neutral_values_and_nulls_are_accepted_and_change_nothing(app):
    neutral = {"frequency_penalty": 0, "presence_penalty": 0.0, "logprobs": False, "logit_bias": {},
               "response_format": {"type": "text"}, "parallel_tool_calls": True, "store": False, "metadata": {},
               "n": 1, "user": "user-7", "safety_identifier": "s-7", "tools": None, "stop": None,
               "seed": 2 ** 63 - 1, "max_completion_tokens": 3}
    plain, given = send(app, GOOD, {**GOOD, **neutral})
    assert plain.status_code == given.status_code == 200, given.text
    assert given.json()["choices"] == plain.json()["choices"] and given.json()["usage"]["completion_tokens"] == 3


def test_developer_is_read_as_system_and_text_parts_are_joined(app):
    as_strings = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count\nto ten."}]
    as_parts = [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "Count"}, {"type": "text", "text": "to ten."}]}]
    strings, parts = send(app, {**GOOD, "messages": as_strings}, {**GOOD, "messages": as_parts})
    assert strings.status_code == parts.status_code == 200, parts.text
    assert parts.json()["usage"] == strings.json()["usage"] and parts.json()["choices"] == strings.json()["choices"]


def test_an_unknown_route_or_method_answers_in_openais_shape(app):
    [missing] = send(app, GOOD, method="GET", path="/v1/completions")
    [wrong] = send(app, GOOD, method="GET", path="/v1/chat/completions")
    assert missing.status_code == 404 and "POST /v1/chat/completions" in refusal(missing)["message"]
    assert wrong.status_code == 405 and "GET /v1/chat/completions" in refusal(wrong)["message"]


def test_a_body_nested_too_deep_or_not_json_is_a_400(app):
    nested, broken = send(app, b"[" * 100_000 + b"]" * 100_000, b'{"model": "tiny", "messages": [}')
    assert nested.status_code == 400 and "too deeply" in refusal(nested)["message"]
    assert broken.status_code == 400 and "not JSON" in refusal(broken)["message"]


# ---------------------------------------------------------------- stop strings
def stop_string_in(text: str) -> str:
    """Two characters of ``text`` from its middle, found there first (and not at the very start)."""
    for start in range(len(text) // 3, len(text) - 2):
        candidate = text[start:start + 2]
        if text.find(candidate) == start and candidate.strip():
            return candidate
    raise AssertionError(f"no stop string found in {text!r}")


def test_text_that_may_begin_a_stop_string_waits_for_the_next_round():
    assert held_back("the end\n", ("\n\n",)) == 1 and held_back("abc", ("cd", "bcx")) == 2
    assert held_back("abc", ("x",)) == 0 and held_back("abc", ()) == 0
    assert first_stop("a--b++c", ("++", "--")) == 1 and first_stop("abc", ("x",)) is None


@pytest.mark.parametrize("kind", ["engine", "drafted"])
def test_a_stop_string_ends_the_text_before_it_streamed_or_not_and_stops_the_row(kind, request):
    """The reply ends before the first stop string, its usage counts the tokens up to the one that completed it
    (a speculative round may bring several), the stream never shows any of it, and the run stops there."""
    engine = request.getfixturevalue(kind)
    app = build_app(engine)
    tokens = alone(engine, CHAT, 24)
    text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
    stop = stop_string_in(text)
    needed = next(n for n in range(1, 25) if stop in engine.tokenizer.decode(tokens[:n], skip_special_tokens=True))
    body = {**GOOD, "max_tokens": 24, "stop": [stop, "never said"]}
    plain, streamed = send(app, body, {**body, "stream": True, "stream_options": {"include_usage": True}})
    answer = plain.json()
    assert answer["choices"][0]["message"]["content"] == text[:text.find(stop)]
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == needed
    chunks = events(streamed.text)
    shown = "".join(e["choices"][0]["delta"].get("content", "") for e in chunks[1:-3])
    assert shown == text[:text.find(stop)]  # nothing of the stop string, nor after it, was ever streamed
    assert chunks[-3]["choices"][0]["finish_reason"] == "stop" and chunks[-1] == "[DONE]"
    assert chunks[-2]["usage"]["completion_tokens"] == needed
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))  # a target forward a round
    try:
        job = engine.submit(CHAT, 24, 0.0, 1.0, 0, lambda _: None, threading.Event(), (stop,))
        assert job.result.result(timeout=60).completion_tokens == needed < 24
    finally:
        hook.remove()
    assert len(forwards) == job.rounds  # no round ran after the one that made the stop string
    assert job.rounds == (needed if kind == "engine" else -(-needed // 4))  # a token a round, or 4


# ---------------------------------------------------------------- what the loop would refuse, refused up front
def test_a_prompt_too_long_for_the_context_is_a_400_before_any_stream(app):
    long = [{"role": "user", "content": "x " * 50_000}]  # 100,000 characters
    for stream in (False, True):
        [response] = send(app, {**GOOD, "messages": long, "stream": stream})
        error = refusal(response)
        assert (response.status_code, error["param"]) == (400, "messages")
        assert "send shorter messages" in error["message"] and str(CONTEXT) in error["message"]


def long_chat(engine, tokens: int) -> tuple[list, int]:
    """A chat whose prompt is about ``tokens`` long, and its exact length."""
    chat = [{"role": "user", "content": "hello " * tokens}]
    length = chat_ids(engine.tokenizer, chat).shape[1]
    chat = [{"role": "user", "content": "hello " * (2 * tokens - length)}]
    return chat, chat_ids(engine.tokenizer, chat).shape[1]


def test_without_max_tokens_a_reply_gets_what_the_context_leaves(engine, app):
    chat, length = long_chat(engine, CONTEXT - 100)
    room = CONTEXT - length - 1  # plain decoding: gamma 1
    assert 0 < room < 256  # the default of 256 would not fit
    fitted, too_many = send(app, {"model": "tiny", "messages": chat, "temperature": 0},
                            {"model": "tiny", "messages": chat, "temperature": 0, "max_tokens": room + 1})
    assert fitted.status_code == 200 and fitted.json()["usage"]["completion_tokens"] == room
    error = refusal(too_many)
    assert (too_many.status_code, error["param"]) == (400, "max_tokens") and f"at most {room}" in error["message"]


def test_room_left_is_what_the_loops_own_check_admits(engine):
    chat, length = long_chat(engine, 500)
    ids, sampling = chat_ids(engine.tokenizer, chat)[0].tolist(), sd.SamplingParams(temperature=0)
    room = room_left(CONTEXT, length, 1)
    assert engine.fit(ids, room, sampling, 0) == room and engine.fit(ids, None, sampling, 0) == 256
    with pytest.raises(Refused, match=f"send at most {room}"):
        engine.fit(ids, room + 1, sampling, 0)


# ---------------------------------------------------------------- API keys
def test_with_an_api_key_every_v1_route_requires_it(engine):
    keyed = build_app(engine, api_key="k-123")
    right, wrong = {"Authorization": "Bearer k-123"}, {"Authorization": "Bearer k-124"}
    for path, method in (("/v1/models", "GET"), ("/v1/chat/completions", "POST")):
        [none] = send(keyed, GOOD, method=method, path=path)
        [bad] = send(keyed, GOOD, method=method, path=path, headers=wrong)
        [good] = send(keyed, GOOD, method=method, path=path, headers=right)
        assert none.status_code == bad.status_code == 401 and good.status_code == 200, (path, good.text)
        assert "Authorization: Bearer" in refusal(none)["message"] and none.headers["www-authenticate"] == "Bearer"
    for path in ("/metrics", "/health"):
        assert send(keyed, GOOD, method="GET", path=path)[0].status_code == 200
    assert send(build_app(engine), GOOD, method="GET", path="/v1/models")[0].status_code == 200  # no key: open


def test_the_start_up_message_says_whether_a_key_is_required():
    assert "an API key is required" in startup_message("127.0.0.1", 8000, "m", "k")
    assert "no API key is required" in startup_message("127.0.0.1", 8000, "m", "")


def test_on_a_cpu_the_server_runs_in_float32_unless_told_otherwise():
    """Batched greedy answers in float32 are the lone ones (the greedy-load test below); in bfloat16 they may not
    be, so the server's default dtype on a CPU is float32; --dtype still chooses."""
    from specdec_lite.serve import server_dtype

    assert server_dtype("cpu") == "float32"


# ---------------------------------------------------------------- a real uvicorn server
@contextmanager
def serving_in_thread(app):
    """``app`` under a real uvicorn server on a free localhost port, in a thread: yields the port."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def port(engine):
    with serving_in_thread(build_app(engine, limits=LIMITS)) as port:
        yield port


def head(length: int | None, extra: str = "") -> bytes:
    """A chat completion's request line and headers, with this Content-Length (None: none)."""
    size = "" if length is None else f"Content-Length: {length}\r\n"
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{size}{extra}"
            "\r\n").encode()


def raw(port: int, data: bytes, wait_s: float = 8.0) -> tuple[bytes, float | None]:
    """``data`` sent on a new connection: (all the server sent back, seconds until it closed the connection; None:
    still open after ``wait_s``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        start, received = time.monotonic(), b""
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before all of it went out
        while True:
            try:
                piece = sock.recv(65536)
            except socket.timeout:
                return received, None
            except ConnectionResetError:
                piece = b""
            if not piece:
                return received, time.monotonic() - start
            received += piece


def counters(port: int) -> dict:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


ENDED = 'vllm:request_success_total{{finished_reason="{}"}}'
GENERATED = "vllm:generation_tokens_total"


def test_a_content_length_over_the_limit_is_a_413_at_once_and_closes_the_connection(port):
    for length in (10 ** 12, LIMITS.max_bytes + 1):
        received, closed = raw(port, head(length) + b'{"model": "tin')  # 14 bytes of it
        assert received.startswith(b"HTTP/1.1 413") and b"--max-body-bytes" in received, received
        assert closed is not None and closed < LIMITS.timeout_s  # answered without waiting for the body


def test_a_body_that_does_not_arrive_is_a_408_and_frees_its_connection(port):
    received, closed = raw(port, head(1000) + b'{"model": "tin')  # 14 of the 1000 bytes promised
    assert received.startswith(b"HTTP/1.1 408") and b"--body-timeout" in received, received
    assert closed is not None and LIMITS.timeout_s <= closed < LIMITS.timeout_s + 3


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not streamed"])
def test_a_client_that_goes_away_stops_its_request_which_is_counted(engine, port, stream):
    """Its generation stops at the round after it left (forwards counted), and /metrics counts it as aborted,
    with the tokens it did make."""
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))
    before = counters(port)
    try:
        body = json.dumps({**GOOD, "max_tokens": 900, "stream": stream}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head(len(body)) + body)
            if stream:
                received = b""
                while received.count(b"data: ") < 2:  # the role, then the first text
                    received += sock.recv(65536)
            else:
                wait_for(lambda: forwards)
        wait_for(lambda: counters(port)[ENDED.format("abort")] == before[ENDED.format("abort")] + 1)
        made = counters(port)[GENERATED] - before[GENERATED]
        time.sleep(0.2)
        assert 1 <= made < 900 and len(forwards) == made  # a forward per token, none after the abort
    finally:
        hook.remove()


def test_every_request_that_ends_is_counted_with_its_reason_and_tokens(port):
    before = counters(port)
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=GOOD, timeout=60).json()
    after = counters(port)
    assert after[ENDED.format("length")] - before[ENDED.format("length")] == 1
    assert after[GENERATED] - before[GENERATED] == 3
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == answer["usage"]["prompt_tokens"]


# ---------------------------------------------------------------- fuzzing a real server
KEYS = ["model", "messages", "stop", "stream", "stream_options", "seed", "top_p", "temperature", "n", "logprobs",
        "tools", "user", "max_completion_tokens", "response_format", "frequency_penalty", "wizardry"]
VALUES = [None, True, False, 0, 1, -1, 3, 2 ** 70, 0.5, 2.5, float("nan"), float("inf"), "", "x", "tiny", "\ud800",
          [], [1], ["\n"], ["a", "b", "c", "d", "e"], {}, {"type": "text"}, {"include_usage": True},
          [{"role": "user", "content": "hi"}], [{"role": "wizard", "content": "hi"}],
          [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]]


def mutated(rng: random.Random) -> dict:
    body = dict(GOOD)
    for key in rng.sample(KEYS, rng.randint(1, 3)):
        body[key] = rng.choice(VALUES)
    return body


def post_json(port: int, body: dict) -> tuple[int, str]:
    response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"}, timeout=60)
    return response.status_code, response.text


def chunked(size: int) -> bytes:
    piece = b"x" * 16384
    return head(None, "Transfer-Encoding: chunked\r\n") + b"".join(
        b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(size // len(piece))) + b"0\r\n\r\n"


def leave_early(port: int, data: bytes) -> None:
    """Send ``data`` and close at once (half a request, or a whole one whose answer nobody reads)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)


def test_a_fuzzing_run_leaves_the_server_answering_right(engine, port):
    """Mutated requests (random fields set to random JSON values), malformed, oversized, slow and half-sent
    bodies, clients that go away, all at once: each gets a 2xx or 4xx in OpenAI's shape (never a 500, never no
    answer), and afterwards a good request still gets its exact greedy answer."""
    rng = random.Random(7)
    bodies = [mutated(rng) for _ in range(48)]
    good = json.dumps({**GOOD, "max_tokens": 50, "stream": True}).encode()
    raws = {  # bytes sent: the status line expected
        b"": b"400", b"{": b"400", b"\xff\xfe": b"400", b"null": b"400", b"[]": b"400", b'"text"': b"400",
        b"1e999": b"400", b"[" * 30000 + b"]" * 30000: b"400",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}': b"400",
    }
    before = counters(port)
    with ThreadPoolExecutor(8) as pool:
        mutated_answers = pool.map(lambda body: post_json(port, body), bodies)
        raw_answers = pool.map(lambda data: raw(port, head(len(data), "Connection: close\r\n") + data)[0], list(raws))
        oversized = pool.submit(raw, port, chunked(LIMITS.max_bytes + 16384))
        lying = pool.submit(raw, port, head(10 ** 12) + b"{}")
        slow = pool.submit(raw, port, head(1000) + b'{"model": "tin')
        for data in (head(len(good)) + good, head(len(good))[:40], b"GET /v1/mod"):
            pool.submit(leave_early, port, data)
        for body, (status, text) in zip(bodies, list(mutated_answers)):
            assert status in (200, 400, 404), (body, status, text)
            if status != 200:
                assert json.loads(text)["error"]["message"], text
            elif body.get("stream") is True:
                assert events(text)[-1] == "[DONE]", (body, text)
            else:
                assert json.loads(text)["usage"]["completion_tokens"] <= 3, (body, text)
        for (data, expected), received in zip(raws.items(), list(raw_answers)):
            assert received.startswith(b"HTTP/1.1 " + expected), (data[:40], received[:200])
        assert oversized.result()[0].startswith(b"HTTP/1.1 413") and lying.result()[0].startswith(b"HTTP/1.1 413")
        assert slow.result()[0].startswith(b"HTTP/1.1 408")
    status, text = post_json(port, {**GOOD, "max_tokens": 12})
    expected = engine.tokenizer.decode(alone(engine, CHAT, 12), skip_special_tokens=True)
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == expected
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    after = counters(port)
    assert after[ENDED.format("error")] == before[ENDED.format("error")]  # no request failed inside the loop


# ---------------------------------------------------------------- SIGTERM
def test_sigterm_drains_running_streams_refuses_new_requests_and_exits(local_pairs, tmp_path):
    """A real server process (its key from the environment, one request at a time, a 1 s drain): two long
    streams (the second waiting behind the first) both end with a finish_reason and [DONE], at least one of them
    "abort"; a request sent during the drain is not accepted; the process exits within the drain and a margin."""
    port, drain = free_port(), 1.0
    command = [sys.executable, "-m", "specdec_lite.serve", "--target", str(local_pairs / "tiny-2l"), "--draft", "none",
               "--dtype", "float32", "--threads", "1", "--max-batch", "1", "--drain-seconds", str(drain),
               "--served-model-name", "tiny", "--port", str(port)]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=dict(os.environ, SPECDEC_LITE_API_KEY="k-123"))
    url, key = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k-123"}
    try:
        def up() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, 120)
        assert "an API key is required" in log.read_text()
        assert httpx.get(f"{url}/v1/models").status_code == 401
        streams, streaming = [[], []], threading.Event()

        def read(i: int) -> None:
            body = {**GOOD, "max_tokens": 900, "stream": True}
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=key, timeout=60) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line:
                        streams[i].append(line.removeprefix("data: "))
                    if all(streams) and max(map(len, streams)) >= 2:  # both admitted, one of them decoding
                        streaming.set()

        readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for reader in readers:
            reader.start()
        assert streaming.wait(30), streams
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            late = httpx.post(f"{url}/v1/chat/completions", json=GOOD, headers=key, timeout=5)
            assert late.status_code == 503, late.text
        except httpx.TransportError:
            pass  # the listening socket is closed: not accepted
        for reader in readers:
            reader.join(30)
        assert process.wait(drain + SHUTDOWN_MARGIN_S + 5) in (0, -signal.SIGTERM)
        assert time.monotonic() - signalled < drain + SHUTDOWN_MARGIN_S
        finishes = []
        for lines in streams:
            assert lines[-1] == "[DONE]", lines[-3:]
            finishes.append(json.loads(lines[-2])["choices"][0]["finish_reason"])
        assert set(finishes) <= {"length", "abort"} and "abort" in finishes, finishes
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# ---------------------------------------------------------------- the greedy-load measurement
def test_the_greedy_load_measurement_runs_and_writes_its_table(local_pairs, tmp_path, capsys, monkeypatch):
    """A configuration whose server does not start (here: a dtype it refuses) gets a row saying why; the others
    run."""
    monkeypatch.setitem(greedy_load.CONFIGS, "broken", "fp8")
    out = tmp_path / "greedy_load.csv"
    greedy_load.main(["--target", str(local_pairs / "tiny-2l"), "--configs", "float32", "broken", "--concurrency",
                      "1", "3", "--prompts", "3", "--max-tokens", "4", "--out", str(out)])
    everything = pd.read_csv(out)
    assert "fp8" in everything["not_run"].iloc[-1] and everything["config"].iloc[-1] == "broken"
    table = everything.iloc[:-1]
    assert list(table["concurrency"]) == [1, 3] and list(table["config"]) == ["float32"] * 2
    assert (table["completion_tokens"] == 12).all() and (table["tokens_per_s"] > 0).all()  # no EOS: 4 tokens each
    assert (table["differ_from_alone"] == 0).all()  # float32 on the tiny model: batched answers are the lone ones
    assert "differ_from_alone" in capsys.readouterr().out
    auto = greedy_load.config_command("auto", 1, "m", 1)
    assert auto[auto.index("--dtype") + 1] == "auto"
    command = greedy_load.config_command("float32", 1, "m", 1)
    assert command[command.index("--dtype") + 1] == "float32" and "--draft" in command
    with pytest.raises(ValueError, match="choose from auto, float32"):
        greedy_load.config_command("fp8", 1, "m", 1)
