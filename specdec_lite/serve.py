"""An OpenAI-compatible server over the package's own loop, with or without speculative decoding.

    python -m specdec_lite.serve --target smollm2-135m-instruct --draft auto --port 8000
    python -m specdec_lite.serve --draft none --port 8001                  (plain decoding: the baseline)
    python -m specdec_lite.serve --draft smollm2-135m-draft --max-batch 16 (a chain draft: every request batches)

Endpoints (FastAPI and uvicorn):
  /v1/chat/completions  streaming (server-sent events, ``chat.completion.chunk``) or not, with ``usage``; streaming
                        sends the tokens of each round as it finishes (the loop's ``on_round``), and the usage chunk
                        when asked (``stream_options: {"include_usage": true}``)
  /v1/models            the one model served, with how it runs requests: ``batching`` (``max_batch``, ``joins``,
                        whether greedy and sampled requests batch, and why not where they do not),
                        ``max_concurrent_requests``, ``queued``, ``drafting``
  /metrics              Prometheus text with vLLM's counter names: ``vllm:spec_decode_num_draft_tokens_total``,
                        ``vllm:spec_decode_num_accepted_tokens_total``, ``vllm:spec_decode_num_drafts_total``
                        (speculative mode only, as vLLM; drafts are counted per request and round),
                        ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total``

Batching: concurrent requests are decoded together, up to ``--max-batch`` of them, as one left-padded batch of the
loop (each row decoded as it would be alone). A request that arrives while a batch runs waits and joins the next
batch (rows are not added to a running batch); a batch that starts on an idle server waits ``--gather-ms`` for
requests sent at the same time. Requests share a batch only when they sample alike: greedy ones (temperature 0)
together, others with the same temperature, top_p and seed (one random generator per batch: at temperature > 0 a
row's sample depends on the rows beside it). Each row ends at its own end-of-sequence token or ``max_tokens``: its
reply, or its stream's end, goes out after that round while the other rows go on, and a client that goes away
leaves its row. The oldest waiting request's kind goes first. Drafting that runs one prompt at a time (token trees:
``--draft auto`` at temperature 0) serves those requests one at a time, as ``/v1/models`` and the start-up message
say; ``--max-batch 1`` serves every request alone, first come, first served. For token trees the draft-token
counter counts tree nodes. SIGTERM or SIGINT stops the server after the current round.
"""

import argparse
import asyncio
import json
import logging
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from .core.models import DTYPE_HELP, EMBEDDED_TARGET

PLAIN = "none"  # --draft none: plain decoding
MODES = {"greedy": 0.0, "sampled": 1.0}  # the temperatures /v1/models reports batching at (any T > 0 batches alike)
KEPT_SIZES = 4096  # the engine keeps the sizes of its latest batches, at least this many
log = logging.getLogger(__name__)


class Stopped(Exception):
    """A generation stopped early: the client went away or the server is shutting down."""


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS) or "length"


@dataclass(eq=False)
class Request:
    """One chat completion, waiting for a batch or decoded in one; ``result`` gets its ``Completion`` (or the
    exception that ended it) as soon as its own row ends."""

    messages: list
    max_tokens: int
    sampling: object  # core.sampling.SamplingParams
    seed: int
    on_text: Callable[[str], None]  # the new text after each round (called on the engine's thread)
    cancelled: threading.Event
    result: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    ids: list | None = None  # the prompt's tokens, once formatted
    sent: str = ""  # the text streamed so far
    rounds: int = 0  # rounds this request has seen decoded

    @property
    def key(self) -> tuple:
        """Requests with the same key sample alike and may share a batch."""
        s = self.sampling
        return ("greedy",) if s.greedy else (s.temperature, s.top_p, s.top_k, s.repetition_penalty, self.seed)

    @property
    def done(self) -> bool:
        return self.result.done()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.result.set_exception(error)


class Engine:
    """The model (and draft) and the package's loop, on one worker thread that gathers waiting requests into
    batches (``max_batch`` rows at most; 1: one request at a time) and decodes one batch at a time."""

    def __init__(self, target: str, draft, device: str, dtype: str, gamma: int, name: str, max_batch: int = 16,
                 gather_ms: float = 10.0):
        """``draft``: ``PLAIN``, any name ``load_draft`` takes, or a drafter object."""
        from .core.models import load_model
        from .drafts.loading import load_draft

        if not isinstance(max_batch, int) or max_batch < 1 or gather_ms < 0:
            raise ValueError(f"max_batch must be an integer >= 1 and gather_ms >= 0, got {max_batch}, {gather_ms}")
        self.model, self.tokenizer = load_model(target, device, dtype)
        if draft == PLAIN:
            self.draft = None
        else:
            self.draft = load_draft(draft, self.model) if isinstance(draft, str) else draft
        self.drafting = draft if isinstance(draft, str) else type(draft).__name__
        self.gamma, self.name, self.max_batch, self.gather_s = gamma, name, max_batch, gather_ms / 1000
        self.shutting_down = threading.Event()
        self.metrics = Metrics(speculative=self.draft is not None)
        self.refusals = self.batch_refusals()  # per mode: why its requests run one at a time (None: they batch)
        self.batch_sizes: list[int] = []  # rows of each batch decoded, in order (the latest ones)
        self.pending: list[Request] = []
        self.ready = threading.Condition()
        self.closed = False
        self.worker = threading.Thread(target=self.serve_forever, name="specdec_lite engine", daemon=True)
        self.worker.start()

    # ------------------------------------------------------------ what batches
    def batch_refusals(self) -> dict:
        """{"greedy": reason or None, "sampled": reason or None}: why requests of each kind run one at a time."""
        from .core.requests import batch_refusal
        from .core.sampling import SamplingParams

        if self.max_batch == 1:
            return {mode: "--max-batch 1: one request at a time" for mode in MODES}
        return {mode: batch_refusal(self.model, self.draft, SamplingParams(temperature=t)) for mode, t in MODES.items()}

    def limit_for(self, request: Request) -> int:
        """How many requests may share a batch with ``request``."""
        return 1 if self.refusals["greedy" if request.sampling.greedy else "sampled"] else self.max_batch

    def batching(self) -> dict:
        """What ``/v1/models`` says about batching."""
        return {"max_batch": self.max_batch, "joins": "next batch" if self.max_batch > 1 else "one at a time",
                "gather_ms": self.gather_s * 1000 if self.max_batch > 1 else 0,
                **{mode: reason is None for mode, reason in self.refusals.items()},
                "shared_by": "greedy requests together; at temperature > 0 those with the same temperature, top_p "
                             "and seed",
                "one_at_a_time": {mode: reason for mode, reason in self.refusals.items() if reason}}

    # ------------------------------------------------------------ requests in, batches out
    def submit(self, messages: list, max_tokens: int, temperature: float, top_p: float, seed: int,
               on_text: Callable[[str], None], cancelled: threading.Event) -> Request:
        """Queue one chat; its ``result`` (a Future) gets the ``Completion``. Bad sampling settings raise
        ``ValueError`` here, before the request waits."""
        from .core.sampling import SamplingParams

        request = Request(messages, max_tokens, SamplingParams(temperature=temperature, top_p=top_p), seed, on_text,
                          cancelled)
        with self.ready:
            if self.closed:
                request.fail(Stopped())
            else:
                self.pending.append(request)
                self.ready.notify()
        return request

    def generate(self, messages: list, max_tokens: int, temperature: float, top_p: float, seed: int,
                 on_text, cancelled: threading.Event) -> Completion:
        """Decode one chat and wait for it (in the next batch, with whatever requests join it); ``on_text(piece)``
        gets the new text after every round."""
        return self.submit(messages, max_tokens, temperature, top_p, seed, on_text, cancelled).result.result()

    def close(self) -> None:
        """Stop: the batch in progress ends after its round, waiting requests end with ``Stopped``."""
        self.shutting_down.set()
        with self.ready:
            self.closed = True
            self.ready.notify()
        self.worker.join()

    def serve_forever(self) -> None:
        """The worker thread: take the oldest waiting request and those that may join it, decode them, repeat."""
        while True:
            with self.ready:
                while not self.pending and not self.closed:
                    self.ready.wait()
                if self.closed:
                    for request in self.pending:
                        request.fail(Stopped())
                    self.pending = []
                    return
                limit = self.limit_for(self.pending[0])
                deadline = self.pending[0].arrived + self.gather_s  # past for a request that waited a batch
                while limit > 1 and not self.closed and len(self.pending) < limit and time.monotonic() < deadline:
                    self.ready.wait(deadline - time.monotonic())
                key = self.pending[0].key
                batch = [r for r in self.pending if r.key == key][:limit]
                self.pending = [r for r in self.pending if r not in batch]
            self.run_batch(batch)

    def run_batch(self, batch: list[Request]) -> None:
        """Decode ``batch``; every request gets its result or its error, the worker never stops on one. A batch the
        loop refuses before its first round (drafting or a context that cannot take it) runs one request at a
        time instead, so that each gets its own answer."""
        from .core.tokenizers import chat_ids

        live = []
        for request in batch:
            if self.shutting_down.is_set() or request.cancelled.is_set():
                request.fail(Stopped())
                continue
            try:
                request.ids = chat_ids(self.tokenizer, request.messages)[0].tolist()
            except Exception as err:  # a chat template that refuses these messages (roles, order)
                request.fail(ValueError(f"the model's chat template cannot format these messages: {err}"))
                continue
            live.append(request)
        if not live:
            return
        try:
            self.decode(live)
        except Stopped as stop:
            for request in live:
                request.fail(stop)
        except Exception as err:
            if len(live) > 1 and not any(r.rounds for r in live):  # refused before any work: each alone
                log.warning("a batch of %d was refused (%s); its requests run one at a time", len(live), err)
                for request in live:
                    self.run_batch([request])
            else:
                for request in live:
                    request.fail(err)

    def decode(self, batch: list[Request]) -> None:
        """One batch through the loop (left-padded); each row's text streams to its request after every round,
        and its result is set as soon as its row ends."""
        from .core.decode import autoregressive_generate, padded, speculative_generate
        from .core.requests import end_tokens

        eos = set(end_tokens(self.model))
        pad = self.tokenizer.pad_token_id if isinstance(self.tokenizer.pad_token_id, int) else 0  # masked out
        ids, mask = padded([r.ids for r in batch], pad, left=True)
        input_ids, mask = ids.to(self.model.device), None if bool(mask.all()) else mask.to(self.model.device)
        limits = [r.max_tokens for r in batch]

        def on_round(rows):
            for request, tokens in zip(batch, rows):
                if request.done:
                    continue
                request.rounds += 1
                if request.cancelled.is_set() or self.shutting_down.is_set():
                    request.fail(Stopped())
                    continue
                ended = len(tokens) >= request.max_tokens or (len(tokens) > 0 and int(tokens[-1]) in eos)
                self.stream(request, tokens, ended, eos)
            if all(r.done for r in batch) and any(r.result.exception() for r in batch):
                raise Stopped()  # every row still decoded has stopped: the batch ends here

        # no eos_token_id: the loop stops at the model's own end-of-sequence token(s), as transformers' generate
        options = dict(attention_mask=mask, max_new_tokens=limits[0] if len(set(limits)) == 1 else limits,
                       sampling=batch[0].sampling, seed=batch[0].seed, on_round=on_round)
        self.batch_sizes.append(len(batch))
        if len(self.batch_sizes) > 2 * KEPT_SIZES:
            del self.batch_sizes[:KEPT_SIZES]
        if self.draft is None:
            out = autoregressive_generate(self.model, input_ids, **options)
        else:
            out = speculative_generate(self.model, self.draft, input_ids, gamma=self.gamma, **options)
        for request, tokens in zip(batch, out.sequences):  # rows on_round has not ended (none, as the loop ends)
            if not request.done:
                self.stream(request, tokens, True, eos)
        self.metrics.count(sum(len(r.ids) for r in batch), out.stats)

    def stream(self, request: Request, tokens, ended: bool, eos: set) -> None:
        """Send ``request`` its new text (never half a character, until it ends); once its row ``ended``, its
        result: finished by an end-of-sequence token (one of ``eos``) or by its max_tokens."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        try:
            if len(text) > len(request.sent) and (ended or not text.endswith("\ufffd")):
                request.on_text(text[len(request.sent):])
                request.sent = text
        except Exception as err:  # its client's side failed: that request alone ends
            request.fail(Stopped(f"streaming failed: {err}"))
            return
        if ended:
            finish = "stop" if len(tokens) and int(tokens[-1]) in eos else "length"
            request.result.set_result(Completion(text, len(request.ids), len(tokens), finish))


class Metrics:
    """Prometheus counters under vLLM's names, in a registry of their own."""

    def __init__(self, speculative: bool):
        from prometheus_client import CollectorRegistry, Counter, disable_created_metrics

        disable_created_metrics()  # counters only, as vLLM exposes them
        self.registry = CollectorRegistry()
        self.prompt = Counter("vllm:prompt_tokens", "prompt tokens processed", registry=self.registry)
        self.generated = Counter("vllm:generation_tokens", "tokens generated", registry=self.registry)
        self.speculative = speculative
        if speculative:
            self.drafts = Counter("vllm:spec_decode_num_drafts", "drafts: rounds of each request",
                                  registry=self.registry)
            self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens",
                                        "draft tokens proposed (tree nodes for token trees)", registry=self.registry)
            self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "draft tokens accepted",
                                    registry=self.registry)

    def count(self, prompt_tokens: int, stats) -> None:
        """One run's counts; its drafts are per row and round (``accepted_lengths``), as vLLM counts per request."""
        self.prompt.inc(prompt_tokens)
        self.generated.inc(stats.new_tokens)
        if self.speculative:
            self.drafts.inc(len(stats.accepted_lengths))
            self.draft_tokens.inc(stats.drafted)
            self.accepted.inc(stats.accepted)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def error_response(status: int, message: str, kind: str = "invalid_request_error"):
    """An error in OpenAI's shape: {"error": {"message", "type", "code"}}."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def chunk(request_id: str, model: str, delta: dict, finish_reason=None, usage=None) -> str:
    """One server-sent event of a streamed chat completion."""
    body = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


def usage_of(done: Completion) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def model_entry(engine: Engine) -> dict:
    """The served model as ``/v1/models`` lists it, with how it runs requests."""
    batches = any(reason is None for reason in engine.refusals.values())
    if not batches:
        concurrency = "one request at a time (batch 1); others wait in a first-come queue"
    else:
        alone = [mode for mode, reason in engine.refusals.items() if reason]
        concurrency = (f"up to {engine.max_batch} requests decoded together; requests arriving during a batch wait "
                       "and join the next one" + "".join(f"; {mode} requests one at a time" for mode in alone))
    return {"id": engine.name, "object": "model", "created": 0, "owned_by": "specdec_lite",
            "drafting": engine.drafting, "max_concurrent_requests": engine.max_batch if batches else 1,
            "queued": True, "concurrency": concurrency, "batching": engine.batching()}


def build_app(engine: Engine):
    """The FastAPI application over ``engine``."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.get_running_loop().run_in_executor(None, engine.close)  # stops after the current round

    app = FastAPI(title="specdec_lite", lifespan=lifespan)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_entry(engine)]}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat(request: HTTPRequest):
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the body must be JSON: {\"model\", \"messages\", ...}")
        problem = check_body(body, engine.name)
        if problem:
            return error_response(*problem)
        settings = (body["messages"], max_tokens_of(body), number(body, "temperature", 1.0),
                    number(body, "top_p", 1.0), int(body.get("seed") or 0))
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        cancelled = threading.Event()
        if not body.get("stream"):
            try:
                job = engine.submit(*settings, lambda _: None, cancelled)
                done = await asyncio.wrap_future(job.result)
            except ValueError as err:  # a request the loop refuses (sampling settings, too long for the context)
                return error_response(400, str(err))
            except Stopped:
                return error_response(503, "the server is shutting down; send the request again elsewhere",
                                      "server_error")
            return JSONResponse({"id": request_id, "object": "chat.completion", "created": int(time.time()),
                                 "model": engine.name, "usage": usage_of(done), "choices": [{
                                     "index": 0, "message": {"role": "assistant", "content": done.text},
                                     "finish_reason": done.finish_reason}]})
        loop, pieces = asyncio.get_running_loop(), asyncio.Queue()
        try:
            job = engine.submit(*settings, lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece),
                                cancelled)
        except ValueError as err:
            return error_response(400, str(err))
        job.result.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(stream(engine, job, pieces, request_id, include_usage),
                                 media_type="text/event-stream")

    return app


async def stream(engine: Engine, job: Request, pieces: asyncio.Queue, request_id: str, include_usage: bool):
    """The events of one streamed completion: the role, each round's text, the finish reason, the usage."""
    try:
        yield chunk(request_id, engine.name, {"role": "assistant", "content": ""})
        while (piece := await pieces.get()) is not None:
            yield chunk(request_id, engine.name, {"content": piece})
        try:
            done = job.result.result()
        except Stopped:
            return
        except Exception as err:  # ValueError: a request the loop refuses
            kind = "invalid_request_error" if isinstance(err, ValueError) else "server_error"
            yield f"data: {json.dumps({'error': {'message': str(err), 'type': kind}})}\n\n"
            return
        yield chunk(request_id, engine.name, {}, finish_reason=done.finish_reason)
        if include_usage:
            yield chunk(request_id, engine.name, {}, usage=usage_of(done))
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # a client that went away leaves its batch after the current round


def number(body: dict, key: str, default: float) -> float:
    """A numeric setting of the request (null: the default)."""
    value = body.get(key)
    return default if value is None else float(value)


def max_tokens_of(body: dict, default: int = 256):
    """The request's token limit: ``max_completion_tokens``, else ``max_tokens``, else ``default``."""
    for key in ("max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            return body[key]
    return default


def check_body(body, served: str) -> tuple[int, str] | None:
    """(status, message) for a request this server cannot run, else None."""
    if not isinstance(body, dict):
        return 400, "the body must be a JSON object with \"model\" and \"messages\""
    if body.get("model") != served:
        return 404, f"model {body.get('model')!r} is not served here; this server serves {served!r} (GET /v1/models)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
            for m in messages):
        return 400, "\"messages\" must be a non-empty list of {\"role\": ..., \"content\": \"text\"}"
    max_tokens = max_tokens_of(body)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return 400, f"max_tokens must be an integer >= 1, got {max_tokens!r}"
    if body.get("n", 1) != 1:
        return 400, "this server returns one choice per request: set n = 1"
    for key in ("temperature", "top_p"):
        if body.get(key) is not None and (isinstance(body[key], bool) or not isinstance(body[key], (int, float))):
            return 400, f"{key} must be a number, got {body[key]!r}"
    if body.get("seed") is not None and (isinstance(body["seed"], bool) or not isinstance(body["seed"], int)):
        return 400, f"seed must be an integer, got {body['seed']!r}"
    return None


def check_arguments(target: str, draft: str, device: str, dtype: str) -> None:
    """A clear error, before anything loads, for a name that cannot be loaded, a device that is not there or a
    dtype it cannot run (the checks the notebooks run too)."""
    from .core.models import check_model_name, resolve_device, resolve_dtype
    from .drafts.loading import check_draft_name

    resolve_dtype(dtype, resolve_device(device))
    check_model_name(target)
    if draft != PLAIN:
        check_draft_name(draft)


def main(argv=None):
    """python -m specdec_lite.serve: an OpenAI-compatible server over the package's loop."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--target", default=EMBEDDED_TARGET, help="package name, Hugging Face id or local folder")
    parser.add_argument("--draft", default="auto", help="'none' (plain decoding), 'auto' (the recommended "
                        "drafting) or any name load_draft takes")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per round (a tree's depth)")
    parser.add_argument("--max-batch", type=int, default=16, help="requests decoded together at most (1: one at a "
                        "time); requests arriving during a batch join the next one")
    parser.add_argument("--gather-ms", type=float, default=10.0, help="how long a batch starting on an idle server "
                        "waits for requests sent at the same time")
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda', 'cuda:N' or 'auto'")
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default="", help="the model's name in the API (default: --target)")
    args = parser.parse_args(argv)
    if args.gamma < 1 or args.threads < 0 or args.max_batch < 1 or args.gather_ms < 0:
        parser.error(f"--gamma and --max-batch must be >= 1, --threads and --gather-ms >= 0, got {args.gamma}, "
                     f"{args.max_batch}, {args.threads} and {args.gather_ms}")
    check_arguments(args.target, args.draft, args.device, args.dtype)
    import torch
    import uvicorn

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(args.target, args.draft, args.device, args.dtype, args.gamma,
                    args.served_model_name or args.target, max_batch=args.max_batch, gather_ms=args.gather_ms)
    for mode, reason in engine.refusals.items():
        if reason and args.max_batch > 1:
            print(f"specdec_lite.serve: {mode} requests run one at a time: {reason}", file=sys.stderr, flush=True)
    # uvicorn handles SIGTERM and SIGINT: no new requests, the lifespan's shutdown stops the generation
    uvicorn.run(build_app(engine), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
