"""An OpenAI-compatible server over the package's own loop, with or without speculative decoding.

    python -m specdec_lite.serve --target smollm2-135m-instruct --draft auto --port 8000
    python -m specdec_lite.serve --draft none --port 8001                  (plain decoding: the baseline)

Endpoints (FastAPI and uvicorn):
  /v1/chat/completions  streaming (server-sent events, ``chat.completion.chunk``) or not, with ``usage``; streaming
                        sends the tokens of each round as it finishes (the loop's ``on_round``), and the usage chunk
                        when asked (``stream_options: {"include_usage": true}``)
  /v1/models            the one model served, with how it runs requests (fields ``max_concurrent_requests``,
                        ``queued``, ``drafting``)
  /metrics              Prometheus text with vLLM's counter names: ``vllm:spec_decode_num_draft_tokens_total``,
                        ``vllm:spec_decode_num_accepted_tokens_total``, ``vllm:spec_decode_num_drafts_total``
                        (speculative mode only, as vLLM), ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total``

One request runs at a time: the loop decodes one prompt at a time (batch 1), so requests wait in a queue (first
come, first served) while one is decoded; concurrent clients are answered one after another. For token trees
the draft-token counter counts tree nodes. SIGTERM or SIGINT stops the server after the current round.
"""
import argparse
import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .core.models import DTYPE_HELP, EMBEDDED_TARGET

PLAIN = "none"  # --draft none: plain decoding


class Stopped(Exception):
    """A generation stopped early: the client went away or the server is shutting down."""


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS) or "length"


class Engine:
    """The model (and draft) and the package's loop; one generation at a time on its single worker thread."""

    def __init__(self, target: str, draft: str, device: str, dtype: str, gamma: int, name: str):
        from .core.models import load_model
        from .drafts.loading import load_draft

        self.model, self.tokenizer = load_model(target, device, dtype)
        self.draft = None if draft == PLAIN else load_draft(draft, self.model)
        self.drafting, self.gamma, self.name = draft, gamma, name
        self.worker = ThreadPoolExecutor(max_workers=1)  # the queue: one generation at a time
        self.shutting_down = threading.Event()
        self.metrics = Metrics(speculative=self.draft is not None)

    def generate(self, messages: list, max_tokens: int, temperature: float, top_p: float, seed: int,
                 on_text, cancelled: threading.Event) -> Completion:
        """Decode one chat (on the worker thread); ``on_text(piece)`` gets the new text after every round."""
        from .core.decode import autoregressive_generate, end_tokens, speculative_generate
        from .core.sampling import SamplingParams
        from .repro.tasks import chat_ids

        ids = chat_ids(self.tokenizer, messages, self.model.device)
        sent = ""

        def on_round(rows):
            nonlocal sent
            if cancelled.is_set() or self.shutting_down.is_set():
                raise Stopped()
            text = self.tokenizer.decode(rows[0], skip_special_tokens=True)
            if len(text) > len(sent) and not text.endswith("\ufffd"):  # never half a character
                on_text(text[len(sent):])
                sent = text

        # no eos_token_id: the loop stops at the model's own end-of-sequence token(s), as transformers' generate
        options = dict(max_new_tokens=max_tokens, sampling=SamplingParams(temperature=temperature, top_p=top_p),
                       seed=seed, on_round=on_round)
        if self.draft is None:
            out = autoregressive_generate(self.model, ids, **options)
        else:
            out = speculative_generate(self.model, self.draft, ids, gamma=self.gamma, **options)
        tokens = out.tokens
        self.metrics.count(ids.shape[1], out.stats)
        finish = "stop" if len(tokens) and int(tokens[-1]) in end_tokens(self.model) else "length"
        return Completion(self.tokenizer.decode(tokens, skip_special_tokens=True), ids.shape[1], len(tokens), finish)


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
            self.drafts = Counter("vllm:spec_decode_num_drafts", "speculative rounds", registry=self.registry)
            self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens",
                                        "draft tokens proposed (tree nodes for token trees)", registry=self.registry)
            self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "draft tokens accepted",
                                    registry=self.registry)

    def count(self, prompt_tokens: int, stats) -> None:
        self.prompt.inc(prompt_tokens)
        self.generated.inc(stats.new_tokens)
        if self.speculative:
            self.drafts.inc(stats.rounds)
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


def build_app(engine: Engine):
    """The FastAPI application over ``engine``."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.shutting_down.set()  # a generation in progress stops after its round
        engine.worker.shutdown(wait=True, cancel_futures=True)

    app = FastAPI(title="specdec_lite", lifespan=lifespan)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": engine.name, "object": "model", "created": 0, "owned_by": "specdec_lite",
            "drafting": engine.drafting, "max_concurrent_requests": 1, "queued": True,
            "concurrency": "one request at a time (batch 1); others wait in a first-come queue"}]}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the body must be JSON: {\"model\", \"messages\", ...}")
        problem = check_body(body, engine.name)
        if problem:
            return error_response(*problem)
        cancelled = threading.Event()
        settings = (body["messages"], max_tokens_of(body),
                    float(body.get("temperature", 1.0)), float(body.get("top_p", 1.0)), int(body.get("seed") or 0))
        loop = asyncio.get_running_loop()
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        if not body.get("stream"):
            try:
                done = await loop.run_in_executor(engine.worker, engine.generate, *settings, lambda _: None,
                                                  cancelled)
            except ValueError as err:  # a request the loop refuses (too long for the context, ...)
                return error_response(400, str(err))
            return JSONResponse({"id": request_id, "object": "chat.completion", "created": int(time.time()),
                                 "model": engine.name, "usage": usage_of(done), "choices": [{
                                     "index": 0, "message": {"role": "assistant", "content": done.text},
                                     "finish_reason": done.finish_reason}]})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(stream(engine, settings, request_id, include_usage, cancelled),
                                 media_type="text/event-stream")

    return app


async def stream(engine: Engine, settings: tuple, request_id: str, include_usage: bool, cancelled):
    """The events of one streamed completion: the role, each round's text, the finish reason, the usage."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    job = loop.run_in_executor(engine.worker, engine.generate, *settings,
                               lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece), cancelled)
    job.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
    try:
        yield chunk(request_id, engine.name, {"role": "assistant", "content": ""})
        while (piece := await pieces.get()) is not None:
            yield chunk(request_id, engine.name, {"content": piece})
        try:
            done = job.result()
        except ValueError as err:
            yield f"data: {json.dumps({'error': {'message': str(err), 'type': 'invalid_request_error'}})}\n\n"
            return
        yield chunk(request_id, engine.name, {}, finish_reason=done.finish_reason)
        if include_usage:
            yield chunk(request_id, engine.name, {}, usage=usage_of(done))
        yield "data: [DONE]\n\n"
    finally:
        cancelled.set()  # a client that went away stops its generation after the current round


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
    return None


def main(argv=None):
    """python -m specdec_lite.serve: an OpenAI-compatible server over the package's loop."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--target", default=EMBEDDED_TARGET, help="package name, Hugging Face id or local folder")
    parser.add_argument("--draft", default="auto", help="'none' (plain decoding), 'auto' (the recommended "
                        "drafting) or any name load_draft takes")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per round (a tree's depth)")
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda', 'cuda:N' or 'auto'")
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default="", help="the model's name in the API (default: --target)")
    args = parser.parse_args(argv)
    if args.gamma < 1 or args.threads < 0:
        parser.error(f"--gamma must be >= 1 and --threads >= 0, got {args.gamma} and {args.threads}")
    from .repro.notebook import check_parameters

    check_parameters(args.target, args.draft, args.device, args.dtype, check_draft=args.draft != PLAIN)
    import torch
    import uvicorn

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(args.target, args.draft, args.device, args.dtype, args.gamma,
                    args.served_model_name or args.target)
    # uvicorn handles SIGTERM and SIGINT: no new requests, the lifespan's shutdown stops the generation
    uvicorn.run(build_app(engine), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
