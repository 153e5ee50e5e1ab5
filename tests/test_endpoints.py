"""The endpoint harness (repro/endpoints.py) against real servers: this package's (plain and speculative) and
llama.cpp's; every bad input refused before a result file exists; concurrent requests kept apart; servers that
stop and leave no process behind; the local server's greedy output equal to the package's plain decoding."""
import contextlib
import functools
import http.server
import signal
import socket
import threading
import time

import httpx
import numpy as np
import pandas as pd
import psutil
import pytest
import torch

import specdec_lite as sd
from specdec_lite.names import embedded_gguf_path
from specdec_lite.repro import endpoints as ep
from specdec_lite.repro.tasks import chat_ids, load_prompts

pytestmark = pytest.mark.slow
MODEL = sd.EMBEDDED_TARGET
PROMPTS = load_prompts(per_task=1)[:2]  # one code and one dialogue prompt


@pytest.fixture(scope="module")
def local_servers():
    """{"plain": (Endpoint, process), "auto": (Endpoint, process)}: this package's server in float32."""
    out = {}
    with contextlib.ExitStack() as running:
        for name, draft in (("plain", "none"), ("auto", "auto")):
            port = ep.free_port()
            process = running.enter_context(ep.serving(ep.local_server_command(port, MODEL, draft, "float32"), port))
            out[name] = (ep.Endpoint(name, f"http://127.0.0.1:{port}/v1", MODEL, baseline="plain"), process)
        yield out
    assert all(not psutil.pid_exists(p.pid) for _, p in out.values())  # stopped and reaped


@pytest.fixture(scope="module")
def reference():
    """The package's own plain greedy decoding of a prompt, float32, to the model's own EOS as the server's:
    (text, tokens)."""
    model, tokenizer = sd.load_model(MODEL, dtype=torch.float32)

    @functools.lru_cache(maxsize=None)
    def decode(prompt: str, max_tokens: int):
        ids = chat_ids(tokenizer, prompt)
        out = sd.autoregressive_generate(model, ids, max_new_tokens=max_tokens,
                                         sampling=sd.SamplingParams(temperature=0))
        return tokenizer.decode(out.tokens, skip_special_tokens=True), len(out.tokens)

    return decode


def test_local_server_greedy_output_is_the_packages_plain_decoding(local_servers, reference):
    prompt = PROMPTS[0]["prompt"]
    expected_text, expected_tokens = reference(prompt, 40)
    for name, (endpoint, _) in local_servers.items():
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 40,
                "temperature": 0}
        answer = httpx.post(endpoint.base_url + "/chat/completions", json=body, timeout=120).json()
        assert answer["choices"][0]["message"]["content"] == expected_text, name
        assert answer["usage"]["completion_tokens"] == expected_tokens, name


def test_harness_against_the_local_server_in_both_modes(local_servers, reference, tmp_path):
    endpoints = [local_servers["plain"][0], local_servers["auto"][0]]
    records = ep.benchmark(endpoints, PROMPTS, ep.Settings(max_tokens=24, temperature=0), tmp_path / "runs.csv")
    assert (tmp_path / "runs.csv").exists() and len(records) == 2 * len(PROMPTS)
    assert set(records.tokens_from) == {"usage"}
    assert (records.latency_s > records.ttft_s).all() and (records.ttft_s > 0).all()
    for row in records.itertuples():  # streamed text and usage are the package's greedy output
        text, tokens = reference(next(p["prompt"] for p in PROMPTS if p["id"] == row.prompt_id), 24)
        assert (row.text, row.completion_tokens) == (text, tokens)
    plain, auto = records[records.endpoint == "plain"], records[records.endpoint == "auto"]
    assert plain.acceptance.isna().all() and auto.acceptance.between(0, 1).all()
    assert (auto.accepted_length >= 1).all()
    table = ep.per_task(records)
    assert np.allclose(table[table.endpoint == "plain"].speedup, 1.0)
    for row in table[table.endpoint == "auto"].itertuples():
        base = table[(table.endpoint == "plain") & (table.task == row.task)].latency_s.iloc[0]
        assert row.speedup == pytest.approx(base / row.latency_s)


def test_concurrent_requests_keep_their_own_tokens_and_timings(local_servers, reference):
    lengths = [2, 28, 3, 24]
    prompts = [dict(PROMPTS[i % 2], id=f"p{i}", max_tokens=n) for i, n in enumerate(lengths)]
    endpoints = [local_servers["plain"][0], local_servers["auto"][0]]
    records = ep.measure(endpoints, prompts, ep.Settings(temperature=0, concurrency=4), warmup=False)
    for row in records.itertuples():
        prompt = next(p for p in prompts if p["id"] == row.prompt_id)
        assert row.max_tokens == prompt["max_tokens"]
        assert (row.text, row.completion_tokens) == reference(prompt["prompt"], prompt["max_tokens"])
    plain = records[records.endpoint == "plain"].set_index("prompt_id")
    decode = plain.latency_s - plain.ttft_s  # streaming time after the first token, per request
    assert decode["p1"] > decode["p0"] and decode["p3"] > decode["p2"]


def test_the_server_names_its_model_and_how_it_batches_and_refuses_another_model(local_servers):
    """``auto`` drafts token trees greedy (one request at a time) and the head's chain at T > 0 (batched); plain
    decoding batches both; the harness reads it from /v1/models, and a server that says nothing counts as
    ``assume``."""
    plain, auto = local_servers["plain"][0], local_servers["auto"][0]
    [entry] = httpx.get(auto.base_url + "/models").json()["data"]
    assert entry["id"] == MODEL and entry["queued"] is True and entry["batching"]["max_batch"] == 16
    assert entry["batching"]["greedy"] is False and "token trees" in entry["batching"]["one_at_a_time"]["greedy"]
    assert ep.batching_of(plain)["greedy"] is True and ep.batching_of(plain)["sampled"] is True
    assert ep.batches_at([plain], 0.0) and ep.batches_at([plain], 0.7)
    assert not ep.batches_at([plain, auto], 0.0)
    silent = ep.Endpoint("silent", f"http://127.0.0.1:{ep.free_port()}/v1", MODEL)
    assert ep.batching_of(silent) is None and ep.batches_at([plain, silent], 0.0, assume=True)
    assert not ep.batches_at([plain, silent], 0.0)
    answer = httpx.post(auto.base_url + "/chat/completions", json={
        "model": "other", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 404 and MODEL in answer.json()["error"]["message"]


def test_the_concurrency_runs_compare_the_batching_servers():
    """With a batching speculative server among the local ones, the concurrency runs compare it with the plain
    server and the other runs leave it out; with given endpoints every one runs everywhere."""
    plain = ep.Endpoint(ep.LOCAL_PLAIN, "http://h:1/v1", MODEL, ep.LOCAL_PLAIN)
    auto = ep.Endpoint(f"{ep.LOCAL_SPECULATIVE} (auto)", "http://h:2/v1", MODEL, ep.LOCAL_PLAIN)
    batching = ep.Endpoint(f"{ep.LOCAL_BATCHING} (draft)", "http://h:3/v1", MODEL, ep.LOCAL_PLAIN)
    llama = ep.Endpoint(ep.LLAMA_PLAIN, "http://h:4/v1", MODEL, ep.LLAMA_PLAIN)
    assert ep.split_runs([plain, auto, batching, llama]) == ([plain, auto, llama], [plain, batching])
    assert ep.split_runs([plain, auto]) == ([plain, auto], [plain, auto])
    command = ep.local_server_command(8000, MODEL, "none", max_batch=4)
    assert command[command.index("--max-batch") + 1] == "4"


# ---------------------------------------------------------------- bad input: refused, nothing written
class Misbehaving(http.server.BaseHTTPRequestHandler):
    """A tiny server, started in the test: 'garbage' answers everything with text; 'chat-garbage' lists a model
    but answers chats with text; 'slow-chat' lists a model and never answers a chat in time."""

    mode = "garbage"

    def do_GET(self):
        body = b'{"object": "list", "data": [{"id": "m"}]}' if self.mode != "garbage" else b"hello, not JSON"
        self.reply(body)

    def do_POST(self):
        if self.mode == "slow-chat":
            time.sleep(4)
        self.reply(b"<html>certainly not an event stream</html>")

    def reply(self, body: bytes):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def misbehaving():
    servers = []

    def serve(mode: str) -> ep.Endpoint:
        handler = type("Handler", (Misbehaving,), {"mode": mode})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return ep.Endpoint(mode, f"http://127.0.0.1:{server.server_address[1]}/v1", "m")

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def refused(endpoints, tmp_path, match, timeout_s=30.0):
    path = tmp_path / "runs.csv"
    with pytest.raises(ep.EndpointError, match=match):
        ep.benchmark(endpoints, PROMPTS, ep.Settings(max_tokens=8, temperature=0, timeout_s=timeout_s), path)
    assert not any(tmp_path.iterdir()), "a refused run wrote something"


def test_an_unreachable_url_is_refused(local_servers, tmp_path):
    nowhere = ep.Endpoint("nowhere", f"http://127.0.0.1:{ep.free_port()}/v1", MODEL)
    refused([local_servers["plain"][0], nowhere], tmp_path, "cannot reach .* start the server")


def test_a_model_the_server_does_not_serve_is_refused(local_servers, tmp_path):
    other = ep.Endpoint("other", local_servers["plain"][0].base_url, "not-served")
    refused([local_servers["plain"][0], other], tmp_path, "serves .*smollm2-135m-instruct.*not 'not-served'")


def test_answers_not_shaped_as_the_openai_api_are_refused(local_servers, misbehaving, tmp_path):
    plain = local_servers["plain"][0]
    refused([plain, misbehaving("garbage")], tmp_path, "not as the OpenAI API does")
    refused([plain, misbehaving("chat-garbage")], tmp_path, "OpenAI-compatible server")


def test_a_timeout_is_refused(local_servers, misbehaving, tmp_path):
    refused([local_servers["plain"][0], misbehaving("slow-chat")], tmp_path, "timed out .* raise timeout_s",
            timeout_s=1.0)


def test_a_listening_socket_that_never_answers_times_out(tmp_path):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = ep.Endpoint("silent", f"http://127.0.0.1:{silent.getsockname()[1]}/v1", MODEL)
        with pytest.raises(ep.EndpointError, match="did not answer within"):
            ep.benchmark([endpoint, endpoint.__class__("b", endpoint.base_url, MODEL)], PROMPTS,
                         ep.Settings(timeout_s=1.0), tmp_path / "runs.csv")
    assert not any(tmp_path.iterdir())


def test_bad_settings_are_refused_before_any_request():
    one = ep.Endpoint("a", "http://127.0.0.1:1/v1", MODEL)
    with pytest.raises(ValueError, match="two or more endpoints"):
        ep.measure([one], PROMPTS)
    with pytest.raises(ValueError, match="not endpoints of this run"):
        ep.measure([one, ep.Endpoint("b", one.base_url, MODEL, baseline="c")], PROMPTS)
    with pytest.raises(ValueError, match="unique"):
        ep.measure([one, one], PROMPTS)


# ---------------------------------------------------------------- llama.cpp's server, and stopping servers
def test_harness_against_llama_cpp_server(tmp_path):
    gguf = embedded_gguf_path()
    ports = [ep.free_port(), ep.free_port()]
    with ep.serving(ep.llama_cpp_server_command(ports[0], gguf, MODEL), ports[0]) as plain_process, \
            ep.serving(ep.llama_cpp_server_command(ports[1], gguf, MODEL, lookup_tokens=4), ports[1]) as lookup:
        endpoints = [ep.Endpoint("llama.cpp", f"http://127.0.0.1:{ports[0]}/v1", MODEL),
                     ep.Endpoint("llama.cpp lookup", f"http://127.0.0.1:{ports[1]}/v1", MODEL)]
        prompts = [dict(p, id=f"{p['id']}-{i}") for i in range(2) for p in PROMPTS]  # 2 per task, concurrency 2
        records = ep.benchmark(endpoints, prompts, ep.Settings(max_tokens=24, temperature=0, concurrency=2),
                               tmp_path / "runs.csv")
    assert len(records) == 2 * len(prompts) and (records.completion_tokens.between(1, 24)).all()
    assert (records.latency_s >= records.ttft_s).all() and records.text.str.len().gt(0).all()
    assert records.acceptance.isna().all()  # llama.cpp's server exposes no speculative counters
    for process in (plain_process, lookup):
        assert not psutil.pid_exists(process.pid)


def test_the_local_server_stops_on_sigint_in_the_middle_of_a_stream():
    """The server exits cleanly and leaves no process behind; that the generation in progress stops after its
    round, not after its 400 tokens, is counted in rounds by test_serve (the wait below only keeps a hung server
    from hanging the test)."""
    port = ep.free_port()
    with ep.serving(ep.local_server_command(port, MODEL, "none", dtype="float32"), port) as process:
        body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[0]["prompt"]}], "max_tokens": 400,
                "stream": True}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60) as events:
            next(events.iter_lines())  # the stream has started
            process.send_signal(signal.SIGINT)
            assert process.wait(60) == 0
    assert not psutil.pid_exists(process.pid)


def test_local_endpoints_refuse_llama_cpp_for_a_target_without_a_gguf():
    with pytest.raises(ValueError, match="lookup_tokens = 0"):
        with ep.local_endpoints("some/other-model", lookup_tokens=4):
            pass


def test_prompts_are_repeated_to_fill_a_concurrency_level():
    filled = ep.at_least_per_task(PROMPTS, 3)
    assert [p["task"] for p in filled] == [PROMPTS[0]["task"]] * 3 + [PROMPTS[1]["task"]] * 3
    assert len({p["id"] for p in filled}) == 6 and filled[0] == PROMPTS[0]
    assert ep.at_least_per_task(PROMPTS, 1) == PROMPTS


def test_endpoint_parameters_are_read_or_refused_saying_the_format():
    [one] = ep.endpoints_from([{"name": "a", "base_url": "http://h:1/v1", "model": "m"}], "MY_KEY")
    assert one == ep.Endpoint("a", "http://h:1/v1", "m", "", "MY_KEY") and one.root == "http://h:1"
    with pytest.raises(ValueError, match="keys name, base_url"):
        ep.endpoints_from([{"name": "a", "url": "http://h:1/v1", "model": "m"}])


def test_the_claims_are_checked_on_the_speculative_endpoint_with_counters():
    import pandas as pd

    table = pd.DataFrame({"endpoint": ["p", "s", "l"], "baseline": ["p", "p", "p"],
                          "acceptance": [float("nan"), float("nan"), 0.4]})
    assert ep.speculative_endpoint(table) == "l"
    assert ep.speculative_endpoint(table.assign(acceptance=float("nan"))) == "s"


def test_speedups_over_the_own_baseline_and_over_the_fastest_plain_endpoint():
    """Latencies by hand: plain servers `fast` (1 s) and `slow` (4 s), `spec` (2 s) whose baseline is `slow`:
    2x over its own baseline, 0.5x over the fastest plain endpoint; medians over each endpoint's requests."""
    def record(endpoint, baseline, latency):
        return dict(endpoint=endpoint, baseline=baseline, task="code", concurrency=1, max_tokens=8,
                    latency_s=latency, ttft_s=0.1, tokens_per_s_after_first=10.0, completion_tokens=8,
                    tokens_from="usage", acceptance=float("nan"), accepted_length=float("nan"))

    records = pd.DataFrame([record("fast", "fast", 1.0), record("fast", "fast", 1.2), record("fast", "fast", 0.8),
                            record("slow", "slow", 4.0), record("spec", "slow", 2.0)])
    table = ep.per_task(records).set_index("endpoint")
    assert table.loc["spec", "speedup"] == pytest.approx(2.0)
    assert table.loc["spec", "speedup_over_fastest_plain"] == pytest.approx(0.5)
    assert table.loc["slow", "speedup_over_fastest_plain"] == pytest.approx(0.25)
    assert table.loc["fast", "speedup"] == pytest.approx(1.0) and table.loc["fast", "requests"] == 3
