"""Benchmark OpenAI-compatible servers as a serving team does (article 003): the same chat prompts, streamed, to
two or more endpoints (plain and speculative), per-task latency, acceptance and speedup.

    endpoints = [Endpoint("plain", "http://127.0.0.1:8001/v1", "smollm2-135m-instruct"),
                 Endpoint("speculative", "http://127.0.0.1:8000/v1", "smollm2-135m-instruct")]
    records = benchmark(endpoints, prompts, Settings(max_tokens=200, temperature=0, concurrency=1), "runs.csv")
    table = per_task(records)                        # medians per endpoint and task, speedup over the baseline

Per request (streamed, ``stream_options={"include_usage": True}``): time to first token, end-to-end latency,
completion tokens (from the stream's usage when the server sends it, else counted as content chunks, which the
column ``tokens_from`` says), and tokens per second after the first, (tokens - 1) / (latency - ttft). Tasks run one
after another, each task's prompts at the chosen concurrency against one endpoint at a time, so the counters of a
server that exposes vLLM's speculative-decoding metrics on ``/metrics`` give each task's acceptance from their
deltas. Every endpoint is checked first (reachable, serving its model, answering as the OpenAI API does); any
failure raises ``EndpointError`` saying what to do, and nothing is written unless every request succeeded
(``save`` writes through a temporary name).

``serving(command, port)`` runs a server in a subprocess for the length of a ``with`` block (waits until
``/v1/models`` answers, always stops it); ``local_server_command`` and ``llama_cpp_server_command`` build the
commands of this package's server (``python -m specdec_lite.serve``, which batches concurrent requests) and
llama.cpp's (which queues them). ``batches_at`` reads from ``/v1/models`` whether servers batch.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from .tasks import by_task

# vLLM's counter names (vllm/v1/metrics): what the acceptance is read from
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"


class EndpointError(RuntimeError):
    """An endpoint that cannot be benchmarked; the message says what to do."""


@dataclass(frozen=True)
class Endpoint:
    name: str  # its label in the tables
    base_url: str  # the OpenAI API's base, e.g. http://127.0.0.1:8000/v1
    model: str  # the model name the server serves
    baseline: str = ""  # the endpoint its speedup is over ("": the first endpoint of the run)
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding its API key (absent: none sent)

    @property
    def root(self) -> str:
        """The server's root, where ``/metrics`` is."""
        return self.base_url.rstrip("/").removesuffix("/v1")

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env) or "none"


@dataclass(frozen=True)
class Settings:
    max_tokens: int = 200  # per request, unless a prompt carries its own "max_tokens"
    temperature: float = 0.0
    concurrency: int = 1  # requests in flight at once, per task and endpoint
    timeout_s: float = 120.0  # for connecting and for each read (between streamed chunks)
    seed: int = 0


def check_run(endpoints: list[Endpoint], prompts: list[dict], settings: Settings) -> None:
    """Refuse bad input before any request: names, baselines, settings, prompts."""
    names = [e.name for e in endpoints]
    if len(endpoints) < 2:
        raise ValueError("give two or more endpoints (a plain one as the baseline, and the others to compare)")
    if len(set(names)) != len(names):
        raise ValueError(f"endpoint names must be unique, got {names}")
    unknown = sorted({e.baseline for e in endpoints if e.baseline} - set(names))
    if unknown:
        raise ValueError(f"baselines {unknown} are not endpoints of this run; name one of {names}")
    if not prompts:
        raise ValueError("no prompts: load some with tasks.load_prompts(...)")
    if settings.max_tokens < 1 or settings.concurrency < 1 or settings.timeout_s <= 0:
        raise ValueError(f"max_tokens and concurrency must be >= 1 and timeout_s > 0, got {settings}")


async def check_endpoint(endpoint: Endpoint, timeout_s: float) -> None:
    """The server answers ``/v1/models`` in the OpenAI API's shape and serves the endpoint's model."""
    import httpx

    url = endpoint.base_url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(url, headers={"Authorization": f"Bearer {endpoint.api_key}"})
    except httpx.TimeoutException:
        raise EndpointError(f"{endpoint.name}: {url} did not answer within {timeout_s} s; check the server is up "
                            "and not busy, or raise timeout_s") from None
    except httpx.HTTPError as err:
        raise EndpointError(f"{endpoint.name}: cannot reach {url} ({type(err).__name__}); start the server or fix "
                            "the base URL (it ends in /v1)") from None
    try:
        served = [m["id"] for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise EndpointError(f"{endpoint.name}: {url} answered HTTP {response.status_code} but not as the OpenAI API "
                            "does (JSON with a 'data' list of models); is this URL an OpenAI-compatible server's "
                            "/v1?") from None
    if endpoint.model not in served:
        raise EndpointError(f"{endpoint.name}: the server at {endpoint.base_url} serves {served}, not "
                            f"{endpoint.model!r}; set the endpoint's model to one of those")


async def read_counters(endpoint: Endpoint, timeout_s: float) -> dict | None:
    """vLLM's speculative-decoding counters from the server's ``/metrics`` (summed over label sets), or None
    where the server exposes none."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(endpoint.root + "/metrics")
        families = list(text_string_to_metric_families(response.text)) if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return None
    totals = {}
    for family in families:
        for sample in family.samples:
            if sample.name in (DRAFT_TOKENS, ACCEPTED_TOKENS, DRAFTS):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals if DRAFT_TOKENS in totals and ACCEPTED_TOKENS in totals else None


async def stream_one(client, endpoint: Endpoint, prompt: dict, settings: Settings) -> dict:
    """One streamed chat request: its timings, tokens and text."""
    import openai

    max_tokens = int(prompt.get("max_tokens", settings.max_tokens))
    start = time.perf_counter()
    first, chunks, usage, text = None, 0, None, []
    try:
        stream = await client.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": prompt["prompt"]}], max_tokens=max_tokens,
            temperature=settings.temperature, seed=settings.seed, stream=True, stream_options={"include_usage": True})
        async for event in stream:
            if getattr(event, "usage", None) is not None:
                usage = event.usage
            for choice in getattr(event, "choices", None) or []:
                if choice.delta is not None and choice.delta.content:
                    first = first or time.perf_counter()
                    chunks += 1
                    text.append(choice.delta.content)
    except openai.APITimeoutError:
        raise EndpointError(f"{endpoint.name}: a request timed out after {settings.timeout_s} s without a "
                            "token; raise timeout_s, or lower max_tokens or concurrency") from None
    except openai.APIConnectionError as err:
        raise EndpointError(f"{endpoint.name}: the connection to {endpoint.base_url} failed ({err}); is the "
                            "server still up?") from None
    except openai.APIStatusError as err:
        raise EndpointError(f"{endpoint.name}: HTTP {err.status_code} from {endpoint.base_url}: {err.message}; "
                            "fix the request or the server's settings") from None
    except (openai.APIError, ValueError, AttributeError, TypeError) as err:
        raise EndpointError(f"{endpoint.name}: {endpoint.base_url} did not stream as the OpenAI API does "
                            f"({type(err).__name__}); is it an OpenAI-compatible server?") from None
    end = time.perf_counter()
    if first is None:
        raise EndpointError(f"{endpoint.name}: {endpoint.base_url} streamed no content for prompt "
                            f"{prompt['id']!r}; is it an OpenAI-compatible server, and does max_tokens allow output?")
    tokens = usage.completion_tokens if usage is not None else chunks
    return {"endpoint": endpoint.name, "task": prompt["task"], "prompt_id": prompt["id"], "max_tokens": max_tokens,
            "ttft_s": first - start, "latency_s": end - start, "completion_tokens": tokens,
            "tokens_from": "usage" if usage is not None else "chunks",
            "tokens_per_s_after_first": (tokens - 1) / (end - first) if tokens > 1 and end > first else float("nan"),
            "text": "".join(text)}


async def run_task(client, endpoint: Endpoint, prompts: list[dict], settings: Settings) -> list[dict]:
    """Every prompt of one task against one endpoint, at most ``settings.concurrency`` in flight."""
    gate = asyncio.Semaphore(settings.concurrency)

    async def one(prompt):
        async with gate:
            return await stream_one(client, endpoint, prompt, settings)

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def client_for(endpoint: Endpoint, settings: Settings):
    import openai

    return openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, timeout=settings.timeout_s,
                              max_retries=0)


async def measure_async(endpoints: list[Endpoint], prompts: list[dict], settings: Settings,
                        warmup: bool = True) -> pd.DataFrame:
    for endpoint in endpoints:
        await check_endpoint(endpoint, settings.timeout_s)
    clients = {e.name: client_for(e, settings) for e in endpoints}
    try:
        return await measure_with(clients, endpoints, prompts, settings, warmup)
    finally:
        for client in clients.values():
            await client.close()


async def measure_with(clients: dict, endpoints: list[Endpoint], prompts: list[dict], settings: Settings,
                       warmup: bool) -> pd.DataFrame:
    if warmup:  # one short request each, not recorded: lazy loading and first-call costs stay out
        for e in endpoints:
            await stream_one(clients[e.name], e, {**prompts[0], "max_tokens": 4}, settings)
    records, acceptance = [], []
    for task, chosen in by_task(prompts).items():
        for e in endpoints:
            before = await read_counters(e, settings.timeout_s)
            rows = await run_task(clients[e.name], e, chosen, settings)
            after = await read_counters(e, settings.timeout_s)
            records += [dict(r, concurrency=settings.concurrency, request=i) for i, r in enumerate(rows)]
            acceptance.append({"endpoint": e.name, "task": task, **counter_deltas(before, after)})
    frame = pd.DataFrame(records).merge(pd.DataFrame(acceptance), on=["endpoint", "task"])
    baselines = {e.name: e.baseline or endpoints[0].name for e in endpoints}
    return frame.assign(temperature=settings.temperature, baseline=frame.endpoint.map(baselines))


def counter_deltas(before: dict | None, after: dict | None) -> dict:
    """Acceptance (accepted / drafted tokens) and mean accepted length per round (1 + accepted / rounds) over a
    task, from the counters before and after it; nan where the server has no such counters."""
    if before is None or after is None:
        return {"acceptance": float("nan"), "accepted_length": float("nan")}
    drafted = after[DRAFT_TOKENS] - before[DRAFT_TOKENS]
    accepted = after[ACCEPTED_TOKENS] - before[ACCEPTED_TOKENS]
    rounds = after.get(DRAFTS, float("nan")) - before.get(DRAFTS, float("nan"))
    return {"acceptance": accepted / drafted if drafted else float("nan"),
            "accepted_length": 1 + accepted / rounds if rounds else float("nan")}


def measure(endpoints: list[Endpoint], prompts: list[dict], settings: Settings = Settings(),
            warmup: bool = True) -> pd.DataFrame:
    """One row per request (every endpoint, every prompt), after every request succeeded; the task's acceptance
    from the server's counters on each row (nan without them). Raises ``EndpointError`` otherwise."""
    check_run(endpoints, prompts, settings)
    return run_coroutine(measure_async(endpoints, prompts, settings, warmup))


def run_coroutine(coroutine):
    """``asyncio.run``, also where an event loop already runs (a Jupyter kernel): then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


def benchmark(endpoints: list[Endpoint], prompts: list[dict], settings: Settings, path: str | Path,
              warmup: bool = True) -> pd.DataFrame:
    """``measure``, then ``save`` the per-request records at ``path``: nothing is written unless every request
    succeeded."""
    records = measure(endpoints, prompts, settings, warmup)
    save(records, path)
    return records


def per_task(records: pd.DataFrame) -> pd.DataFrame:
    """Medians per endpoint, task, concurrency and max_tokens, and each endpoint's speedup over its baseline:
    the baseline's median end-to-end latency over the endpoint's (the article's measure; at temperature 0 both
    produce the same text where the servers decode exactly); ``speedup_over_fastest_plain``: over the fastest
    of the run's baselines at the same task, concurrency and max_tokens (the package's baseline rule)."""
    keys = ["endpoint", "task", "concurrency", "max_tokens"]
    table = records.groupby(keys, sort=False).agg(
        requests=("latency_s", "size"), ttft_s=("ttft_s", "median"), latency_s=("latency_s", "median"),
        tokens_per_s_after_first=("tokens_per_s_after_first", "median"),
        completion_tokens=("completion_tokens", "median"), tokens_from=("tokens_from", "first"),
        acceptance=("acceptance", "first"), accepted_length=("accepted_length", "first"),
        baseline=("baseline", "first")).reset_index()
    base = table.set_index(keys).latency_s
    baseline_latency = [base.get((b, t, c, m), float("nan")) for b, t, c, m in
                        zip(table.baseline, table.task, table.concurrency, table.max_tokens)]
    plain = table[table.endpoint.isin(set(table.baseline))]
    fastest = plain.groupby(["task", "concurrency", "max_tokens"]).latency_s.min()
    fastest_latency = [fastest.get((t, c, m), float("nan"))
                       for t, c, m in zip(table.task, table.concurrency, table.max_tokens)]
    return table.assign(speedup=pd.Series(baseline_latency, index=table.index) / table.latency_s,
                        speedup_over_fastest_plain=pd.Series(fastest_latency, index=table.index) / table.latency_s)


def median_speedup(table: pd.DataFrame, endpoint: str, by: str) -> pd.DataFrame:
    """``endpoint``'s median over tasks of its per-task speedups (``per_task``), for each value of ``by``
    (``"max_tokens"`` or ``"concurrency"``): columns ``by``, speedup, baseline, in increasing ``by``."""
    rows = table[table.endpoint == endpoint]
    return rows.groupby(by).agg(speedup=("speedup", "median"), baseline=("baseline", "first")).reset_index()


def at_least_per_task(prompts: list[dict], n: int) -> list[dict]:
    """Each task's prompts, repeated in turn until the task has at least ``n`` requests (ids made unique), so
    that a concurrency of ``n`` really has ``n`` requests in flight."""
    out = []
    for chosen in by_task(prompts).values():
        count = max(n, len(chosen))
        out += [dict(chosen[i % len(chosen)], id=f"{chosen[i % len(chosen)]['id']}#{i // len(chosen)}")
                if i >= len(chosen) else chosen[i] for i in range(count)]
    return out


def save(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write a CSV through a temporary name, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    frame.to_csv(partial, index=False)
    partial.replace(path)
    return path


# ---------------------------------------------------------------- servers in subprocesses
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_server_command(port: int, target: str, draft: str, dtype: str = "auto", gamma: int = 4,
                         device: str = "cpu", threads: int = 1, max_batch: int = 16) -> list[str]:
    """This package's server (``python -m specdec_lite.serve``); ``draft`` "none" for plain decoding;
    ``max_batch`` concurrent requests decoded together at most (1: one at a time). One CPU thread by default: on a
    2-core machine shared with other work, torch's two threads spinning on each other stalled some kernels many times
    over; 0 keeps torch's default."""
    return [sys.executable, "-m", "specdec_lite.serve", "--target", target, "--draft", draft, "--dtype", dtype,
            "--gamma", str(gamma), "--device", device, "--threads", str(threads), "--max-batch", str(max_batch),
            "--port", str(port)]


def llama_cpp_server_command(port: int, gguf: str | Path, model: str, lookup_tokens: int = 0,
                             threads: int = 1) -> list[str]:
    """llama.cpp's OpenAI-compatible server (llama-cpp-python) on a GGUF file, served as ``model``; with
    ``lookup_tokens`` > 0 it drafts by prompt lookup, that many tokens a round. Requests queue (a new one does
    not interrupt the one streaming). One thread by default: on a 2-core machine with other work, two of
    llama.cpp's spinning threads were measured 100 times slower than one (a 135M model needs no more)."""
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", model,
               "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
               "--n_ctx", "2048", "--interrupt_requests", "False", "--verbose", "False"]
    if lookup_tokens:
        command += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(lookup_tokens)]
    return command


SERVER_KEY_ENV = "SPECDEC_LITE_API_KEY"  # the API key this package's server reads (serve.API_KEY_ENV)


@contextmanager
def serving(command: list[str], port: int, wait_s: float = 300.0, log: str | Path | None = None):
    """Run a server for the ``with`` block: start ``command``, wait until ``http://127.0.0.1:<port>/v1/models``
    answers (``EndpointError`` if the process exits or ``wait_s`` passes first, with its log's tail), yield the
    process, and always stop it (SIGTERM, then SIGKILL after 20 s). The server runs without ``SERVER_KEY_ENV``: the
    harness's local servers take no key."""
    import httpx

    log_path = Path(log) if log else Path(os.devnull)
    # a key in the user's shell would make the local server refuse the harness's unauthenticated requests
    environment = {name: value for name, value in os.environ.items() if name != SERVER_KEY_ENV}
    with open(log_path, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=environment)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if process.poll() is not None:
                raise EndpointError(f"the server {command[2:4]} exited with code {process.returncode} before "
                                    f"answering{log_tail(log_path)}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EndpointError(f"the server {command[2:4]} did not answer on port {port} within {wait_s} s"
                                    f"{log_tail(log_path)}")
            time.sleep(0.5)
        yield process
    finally:
        stop(process)


def stop(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``grace_s``; reaped either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def log_tail(path: Path, lines: int = 15) -> str:
    if path == Path(os.devnull) or not path.exists():
        return ""
    return ":\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def records_frame(endpoints: list[Endpoint]) -> pd.DataFrame:
    """The endpoints as a table (name, base_url, model, baseline), for the notebook to show."""
    return pd.DataFrame([asdict(e) for e in endpoints]).drop(columns="api_key_env")


LOCAL_PLAIN, LOCAL_SPECULATIVE = "local plain", "local speculative"
LOCAL_BATCHING = "local speculative, batching"  # the speculative server of the concurrency runs (``batch_draft``)
LLAMA_PLAIN, LLAMA_LOOKUP = "llama.cpp plain", "llama.cpp prompt lookup"


@contextmanager
def local_endpoints(target: str, draft: str = "auto", dtype: str = "auto", device: str = "cpu", gamma: int = 4,
                    lookup_tokens: int = 4, wait_s: float = 300.0, threads: int = 1, batch_draft: str = "",
                    max_batch: int = 16):
    """Start this package's server plain and speculative (``draft``), with ``batch_draft`` a third one drafting
    with it for the concurrency runs (``LOCAL_BATCHING``: a drafting that batches, a draft model or an EAGLE
    head's chain; "" or ``draft``: none), and, with ``lookup_tokens`` > 0, llama.cpp's server plain and with prompt
    lookup on the embedded target's GGUF, each on a free port; yield their ``Endpoint``s (each speculative one's
    baseline is the plain server of its kind; ``split_runs`` says which run where); stop them all. ``threads``:
    each server's CPU threads (see ``local_server_command``); ``max_batch``: each of this package's servers'
    ``--max-batch``."""
    from ..names import EMBEDDED_TARGET, embedded_gguf_path

    if lookup_tokens and target != EMBEDDED_TARGET:
        raise ValueError(f"llama.cpp's servers load a GGUF file, which only the embedded target ({EMBEDDED_TARGET}) "
                         "ships here: set lookup_tokens = 0, or start them yourself and pass their endpoints")

    def ours(drafting):
        return lambda port: local_server_command(port, target, drafting, dtype, gamma, device, threads, max_batch)

    plan = [(LOCAL_PLAIN, LOCAL_PLAIN, ours("none")), (f"{LOCAL_SPECULATIVE} ({draft})", LOCAL_PLAIN, ours(draft))]
    if batch_draft and batch_draft != draft:
        plan.append((f"{LOCAL_BATCHING} ({batch_draft})", LOCAL_PLAIN, ours(batch_draft)))
    if lookup_tokens:
        gguf = embedded_gguf_path()
        plan += [(LLAMA_PLAIN, LLAMA_PLAIN, lambda port: llama_cpp_server_command(port, gguf, target, 0, threads)),
                 (LLAMA_LOOKUP, LLAMA_PLAIN,
                  lambda port: llama_cpp_server_command(port, gguf, target, lookup_tokens, threads))]
    with tempfile.TemporaryDirectory() as logs, ExitStack() as running:
        started = []
        for i, (name, baseline, command) in enumerate(plan):
            port = free_port()
            running.enter_context(serving(command(port), port, wait_s, Path(logs) / f"server{i}.log"))
            started.append(Endpoint(name, f"http://127.0.0.1:{port}/v1", target, baseline))
        yield started


def endpoints_from(entries: list, api_key_env: str = "OPENAI_API_KEY") -> list[Endpoint]:
    """Endpoints from a notebook parameter: a list of {"name", "base_url", "model"} mappings, optionally with
    "baseline"; refused, saying the format, when an entry is not one."""
    keys, required = {"name", "base_url", "model", "baseline"}, {"name", "base_url", "model"}
    out = []
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not required <= set(entry) or set(entry) - keys:
            raise ValueError(f"endpoint {i} ({entry!r}) must be a mapping with keys name, base_url (ending in /v1) "
                             "and model, and optionally baseline (another endpoint's name)")
        out.append(Endpoint(**{k: str(v) for k, v in entry.items()}, api_key_env=api_key_env))
    return out


def speculative_endpoint(table: pd.DataFrame) -> str:
    """The endpoint the claims are checked on: the first that is not its own baseline and reports acceptance,
    else the first that is not its own baseline."""
    compared = table[table.endpoint != table.baseline]
    counted = compared[compared.acceptance.notna()]
    return (counted if len(counted) else compared).endpoint.iloc[0]


def split_runs(endpoints: list[Endpoint]) -> tuple[list[Endpoint], list[Endpoint]]:
    """(the endpoints of the single-request runs, those of the concurrency runs). With ``local_endpoints``' batching
    speculative server (``LOCAL_BATCHING``), the concurrency runs compare it with this package's plain server (both
    batch) and the other runs leave it out; else every endpoint runs everywhere."""
    batching = [e for e in endpoints if e.name.startswith(LOCAL_BATCHING)]
    if not batching:
        return list(endpoints), list(endpoints)
    plain = [e for e in endpoints if e.name == batching[0].baseline]
    return [e for e in endpoints if e not in batching], plain + batching


def batching_of(endpoint: Endpoint, timeout_s: float = 30.0) -> dict | None:
    """What the server says about batching: its model entry's ``batching`` on ``/v1/models`` (this package's
    server: ``max_batch``, ``joins``, and whether ``greedy`` and ``sampled`` requests batch), or None where it says
    nothing (vLLM, llama.cpp) or does not answer."""
    import httpx

    try:
        response = httpx.get(endpoint.base_url.rstrip("/") + "/models", timeout=timeout_s,
                             headers={"Authorization": f"Bearer {endpoint.api_key}"})
        entries = response.json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    entry = next((m for m in entries if isinstance(m, dict) and m.get("id") == endpoint.model), None)
    found = entry.get("batching") if entry else None
    return found if isinstance(found, dict) else None


def batches_at(endpoints: list[Endpoint], temperature: float, assume: bool = False, timeout_s: float = 30.0) -> bool:
    """Whether every endpoint batches concurrent requests at ``temperature``, as its ``/v1/models`` says (more
    than one request a batch, and greedy or sampled requests batching); an endpoint that does not say counts as
    ``assume`` (given servers such as vLLM batch, llama.cpp's queues)."""
    def batches(endpoint):
        said = batching_of(endpoint, timeout_s)
        if said is None:
            return assume
        return said.get("max_batch", 1) > 1 and bool(said.get("greedy" if temperature == 0 else "sampled"))

    return all(batches(e) for e in endpoints)
