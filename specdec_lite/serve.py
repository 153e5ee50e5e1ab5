"""An OpenAI-compatible server over the package's own loop, with or without speculative decoding.

    python -m specdec_lite.serve --target smollm2-135m-instruct --draft auto --port 8000
    python -m specdec_lite.serve --draft none --port 8001                  (plain decoding: the baseline)
    python -m specdec_lite.serve --draft smollm2-135m-draft --max-batch 16 (a chain draft: every request batches)
    python -m specdec_lite.serve --draft none --dtype bfloat16             (faster on some CPUs; greedy answers then
                                                                            depend on the requests beside them)

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
                        ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total`` and
                        ``vllm:request_success_total{finished_reason="stop"|"length"|"abort"|"error"}``: every request
                        that ends, its tokens included, whether its client stayed or not
  /health               200 while the server takes requests, 503 once it drains

What a chat completion honours (``check_body``, the one place that reads a request): ``model`` (the one served:
404 otherwise), ``messages`` (roles ``system``, ``developer`` (as system), ``user``, ``assistant``; content a string
or a list of ``{"type": "text", "text": ...}`` parts, joined by newlines), ``stop`` (a string or up to 4: the reply
ends before the first, finish_reason "stop", and no part of one is ever streamed), ``max_tokens`` or
``max_completion_tokens`` (absent: what the context leaves, at most 256), ``temperature`` (0 to 2), ``top_p``
(above 0, at most 1), ``seed`` (0 to 2^63 - 1), ``n`` (1), ``stream`` (a boolean), ``stream_options``
(``include_usage``; with ``stream`` only), ``user`` and ``safety_identifier`` (strings that name the end user).
Accepted at their neutral value only: ``frequency_penalty`` and ``presence_penalty`` 0, ``logprobs`` false,
``logit_bias`` {}, ``response_format`` {"type": "text"}, ``store`` false, ``metadata`` {}, ``parallel_tool_calls``
(either boolean: without tools it changes nothing). Refused when given: tools and function calls, log
probabilities, audio and other modalities, predicted outputs, reasoning settings, web search, service tiers, and
every field the API does not define. A null field counts as not given. Every refusal is OpenAI's error object
``{"error": {"message", "type", "code", "param"}}``, ``param`` naming the field (``messages[2].role``), the message
saying what to send instead. A prompt the loop would refuse (too long for the context with its ``max_tokens``) is
a 400 when the request arrives (``Engine.submit``), before a stream starts.

Bodies are read with a limit and a deadline (``read_body``): a ``Content-Length`` above ``--max-body-bytes`` is a
413 at once, a body that has not arrived within ``--body-timeout`` seconds a 408, and both close the connection;
JSON nested too deep to parse is a 400. ``--api-key`` (or ``SPECDEC_LITE_API_KEY``) makes every ``/v1/...`` route
require ``Authorization: Bearer <key>`` (401 otherwise); ``/metrics`` and ``/health`` stay open. The default host is
127.0.0.1; the start-up message says whether a key is required.

Batching: concurrent requests are decoded together, up to ``--max-batch`` of them, as one left-padded batch of the
loop (each row decoded as it would be alone; on a CPU the server runs in float32 unless ``--dtype`` says otherwise,
so that a greedy answer does not depend on the rows beside it: ``server_dtype``). A request that arrives while a
batch runs waits and joins the next batch (rows are not added to a running batch); a batch that starts on an idle
server waits ``--gather-ms`` for requests sent at the same time. Requests share a batch only when they sample alike:
greedy ones (temperature 0) together, others with the same temperature, top_p and seed (one random generator per
batch: at temperature > 0 a row's sample depends on the rows beside it). Each request ends at its own
end-of-sequence token, stop string or ``max_tokens``, or when its client goes away (finish_reason "abort", counted
in ``/metrics``): its reply, or its stream's end, goes out after that round while the other rows go on, and a batch
whose requests have all ended stops there (a row whose request ended while others go on is still computed: the loop
keeps its rows together). The oldest waiting request's kind goes first. Drafting that runs one prompt at a time
(token trees: ``--draft auto`` at temperature 0) serves those requests one at a time, as ``/v1/models`` and the
start-up message say; ``--max-batch 1`` serves every request alone, first come, first served. For token trees the
draft-token counter counts tree nodes.

SIGTERM or SIGINT drains: no new connection is accepted and a request that still arrives gets a 503, the requests
already accepted go on for up to ``--drain-seconds``, then every one still running ends after its round with
finish_reason "abort" (a stream with its finish chunk and ``data: [DONE]``), and the process exits.
"""

import argparse
import asyncio
import hmac
import json
import logging
import os
import reprlib
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from .tuning.devices import DTYPE_HELP
from .names import EMBEDDED_TARGET
from .requests import MAX_SEED, is_integer, is_number

PLAIN = "none"  # --draft none: plain decoding
MODES = {"greedy": 0.0, "sampled": 1.0}  # the temperatures /v1/models reports batching at (any T > 0 batches alike)
KEPT_SIZES = 4096  # the engine keeps the sizes of its latest batches, at least this many
DEFAULT_MAX_TOKENS = 256  # a request without max_tokens gets this many at most (fewer where the context ends)
API_KEY_ENV = "SPECDEC_LITE_API_KEY"
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's finished_reason labels (error: the loop failed)
DISCONNECT_POLL_S = 0.25  # how often a non-streamed request looks whether its client is still there
SHUTDOWN_MARGIN_S = 5.0  # after the drain, the time uvicorn gives the last events to go out
log = logging.getLogger(__name__)


class Refused(ValueError):
    """A request this server does not run, as its HTTP answer: the status, a message that names the field and says
    what to send instead, the field (OpenAI's ``param``), and whether the connection closes after it."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", close: bool = False):
        super().__init__(message)
        self.message, self.param, self.status, self.kind, self.close = message, param, status, kind, close

    def response(self):
        headers = {"Connection": "close"} if self.close else {}
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return error_response(self.status, self.message, self.kind, self.param, headers)


# ---------------------------------------------------------------- reading a request: the body, then its fields
@dataclass(frozen=True)
class BodyLimits:
    """How much of a request body is read, and for how long (``--max-body-bytes``, ``--body-timeout``)."""

    max_bytes: int = 1 << 20
    timeout_s: float = 10.0


async def read_body(request, limits: BodyLimits) -> bytes:
    """The request's body, refused with a 413 when it declares or brings more than ``limits.max_bytes``, and with a
    408 when it has not arrived in full within ``limits.timeout_s`` (a client whose ``Content-Length`` promises more
    than it sends would otherwise hold its connection open); both close the connection."""
    declared = request.headers.get("content-length", "")
    too_large = Refused(f"the body is larger than this server's limit of {limits.max_bytes} bytes "
                        "(--max-body-bytes): send a smaller request", status=413, close=True)
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise too_large

    async def collect() -> bytes:
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limits.max_bytes:
                raise too_large
        return bytes(body)

    try:
        return await asyncio.wait_for(collect(), limits.timeout_s)
    except asyncio.TimeoutError:
        raise Refused(f"the body did not arrive within {limits.timeout_s:g} s (--body-timeout; Content-Length "
                      f"{declared or 'not given'}): send the whole body at once, with a Content-Length that "
                      "matches it", status=408, close=True) from None


def parse_json(raw: bytes):
    """The body as JSON; a body that is not JSON, or nests deeper than the parser goes, is a 400 (not a 500)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise Refused("the body nests JSON arrays or objects too deeply to read: send a chat completion, "
                      '{"model": ..., "messages": [{"role": "user", "content": "..."}]}') from None
    except ValueError as err:
        raise Refused(f"the body is not JSON ({err}): send a JSON object, "
                      '{"model": ..., "messages": [{"role": "user", "content": "..."}]}') from None


@dataclass(frozen=True)
class Chat:
    """A checked chat completion request: what the engine runs and how its answer is sent."""

    messages: list  # [{"role": "system" | "user" | "assistant", "content": str}]
    max_tokens: int | None = None  # None: what the context leaves, at most DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple = ()
    stream: bool = False
    include_usage: bool = False


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MESSAGE_FIELDS = ("name", "tool_calls", "tool_call_id", "function_call", "audio", "refusal")  # refused unless null
MAX_STOPS = 4
HONOURED = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "stop",
            "stream", "stream_options", "user", "safety_identifier")
NEUTRAL = {  # field: (whether a value changes nothing, what this server accepts)
    "frequency_penalty": (lambda v: is_number(v) and v == 0, "0 (this server applies no frequency penalty)"),
    "presence_penalty": (lambda v: is_number(v) and v == 0, "0 (this server applies no presence penalty)"),
    "logprobs": (lambda v: v is False, "false (this server returns no log probabilities)"),
    "logit_bias": (lambda v: v == {}, "{} (this server applies no logit bias)"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"} (this server has no JSON mode or schema)'),
    "store": (lambda v: v is False, "false (this server stores no completions)"),
    "metadata": (lambda v: v == {}, "{} (metadata goes with stored completions, which this server does not keep)"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "true or false (without tools it changes nothing)"),
}
UNSUPPORTED = {  # field: what this server does not do
    "tools": "tool calls", "tool_choice": "tool calls", "functions": "function calls",
    "function_call": "function calls", "top_logprobs": "log probabilities", "audio": "audio output",
    "modalities": "output other than text", "prediction": "predicted outputs", "reasoning_effort": "reasoning settings",
    "verbosity": "verbosity settings", "web_search_options": "web search", "service_tier": "service tiers",
    "prompt_cache_key": "prompt caching",
}


def check_body(body, served: str) -> Chat:
    """The request as a ``Chat``, or ``Refused`` naming the first field this server cannot honour: every field of
    OpenAI's chat completions is honoured with its meaning or refused here (see the module's text)."""
    if not isinstance(body, dict):
        raise Refused(f"the body must be a JSON object, got {shown(body)}: send "
                      '{"model": ..., "messages": [{"role": "user", "content": "..."}]}')
    check_fields(body)
    model = body.get("model")
    if not isinstance(model, str):
        raise Refused(f"model must be the served model's name, a string, got {shown(model)}: send "
                      f'"model": "{served}" (GET /v1/models)', "model")
    if model != served:
        raise Refused(f"model {reprlib.repr(model)} is not served here; this server serves {served!r} "
                      "(GET /v1/models)", "model", status=404)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise Refused(f"stream must be true or false (a JSON boolean), got {shown(stream)}", "stream")
    n = body.get("n")
    if n is not None and (not is_integer(n) or n != 1):
        raise Refused(f"n must be 1 (this server returns one choice per request), got {shown(n)}; send n = 1 or "
                      "omit it", "n")
    for key in ("user", "safety_identifier"):
        if body.get(key) is not None:
            check_text(body[key], key)
    return Chat(messages=check_messages(body.get("messages")), max_tokens=max_tokens_of(body),
                temperature=number(body, "temperature", 1.0, 0, 2, "0 is greedy"),
                top_p=number(body, "top_p", 1.0, 0, 1, "above 0; 1 switches nucleus sampling off", above=True),
                seed=integer(body, "seed", 0, 0, MAX_SEED), stop=check_stop(body.get("stop")),
                stream=bool(stream), include_usage=check_stream_options(body.get("stream_options"), bool(stream)))


def check_fields(body: dict) -> None:
    """Refuse fields this server does not know, those it does not support, and neutral ones at another value."""
    known = (*HONOURED, *NEUTRAL, *UNSUPPORTED)
    unknown = sorted(key for key in body if key not in known)
    if unknown:
        names = ", ".join(reprlib.repr(key) for key in unknown)
        raise Refused(f"unknown field{'s' * (len(unknown) > 1)} {names}: this server takes "
                      f"{', '.join((*HONOURED, *NEUTRAL))}; remove the others", unknown[0])
    for key, what in UNSUPPORTED.items():
        if body.get(key) is not None:
            raise Refused(f"{key} is not supported: this server has no {what}; omit {key}", key)
    for key, (neutral, accepted) in NEUTRAL.items():
        if body.get(key) is not None and not neutral(body[key]):
            raise Refused(f"{key} {shown(body[key])} is not supported: this server accepts only {accepted}; omit "
                          f"{key} or send that", key)


def check_messages(messages) -> list[dict]:
    """Each message as {"role", "content": str}: ``developer`` becomes ``system``, content parts are joined."""
    if not isinstance(messages, list) or not messages:
        raise Refused('messages must be a non-empty array of {"role": ..., "content": "text"} objects, got '
                      f"{shown(messages)}", "messages")
    return [check_message(message, f"messages[{i}]") for i, message in enumerate(messages)]


def check_message(message, path: str) -> dict:
    """One message as {"role", "content": str}; keys of OpenAI's messages that this server does not honour (names,
    tool calls, audio) are refused unless null."""
    if not isinstance(message, dict):
        raise Refused(f'{path} must be an object {{"role": ..., "content": "text"}}, got {shown(message)}', path)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise Refused(f"{path}.role must be one of {', '.join(ROLES)} (developer is read as system), got "
                      f"{shown(role)}: send that turn's text under one of them", f"{path}.role")
    for key in message:
        if key not in ("role", "content") and (key not in MESSAGE_FIELDS or message[key] is not None):
            raise Refused(f'{path}.{key} is not supported: a message here has only "role" and "content" (no names, '
                          "tool calls or audio); remove it", f"{path}.{key}")
    return {"role": ROLES[role], "content": check_content(message.get("content"), f"{path}.content")}


def check_content(content, path: str) -> str:
    """A message's text: a string, or a non-empty list of text parts (joined by newlines)."""
    if isinstance(content, str):
        return check_text(content, path)
    if not isinstance(content, list) or not content:
        raise Refused(f'{path} must be a string or a non-empty array of {{"type": "text", "text": "..."}} parts, '
                      f"got {shown(content)}", path)
    texts = []
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else part
            raise Refused(f'{where}.type must be "text" (this server reads text only), got {shown(kind)}: send '
                          '{"type": "text", "text": "..."}', f"{where}.type")
        extra = sorted(str(key) for key in part if key not in ("type", "text"))
        if extra or not isinstance(part.get("text"), str):
            name = extra[0] if extra else "text"
            raise Refused(f'{where}.{name}: a text part is {{"type": "text", "text": "a string"}}, got '
                          f"{shown(part)}", f"{where}.{name}")
        texts.append(check_text(part["text"], f"{where}.text"))
    return "\n".join(texts)


def check_text(value, param: str) -> str:
    """``value`` if it is a string of valid text; JSON may spell an unpaired UTF-16 surrogate ("\\ud800"), which
    is no character and cannot be encoded or tokenized."""
    if not isinstance(value, str):
        raise Refused(f"{param} must be a string, got {shown(value)}", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Refused(f"{param} is not valid UTF-8 text: character {err.start} is a lone surrogate "
                      f"({value[err.start]!r}); send text whose \\ud800-\\udfff escapes come in pairs", param) from None
    return value


def check_stop(stop) -> tuple:
    """The stop strings: a string or a list of up to ``MAX_STOPS`` non-empty strings."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise Refused(f"stop must be a non-empty string or an array of up to {MAX_STOPS} non-empty strings, got "
                      f"{shown(stop)}", "stop")
    return tuple(check_text(s, "stop") for s in stops)


def check_stream_options(options, stream: bool) -> bool:
    """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
    if options is None:
        return False
    if not stream:
        raise Refused('stream_options goes with "stream": true only; omit it or stream', "stream_options")
    if not isinstance(options, dict):
        raise Refused(f'stream_options must be an object {{"include_usage": true}}, got {shown(options)}',
                      "stream_options")
    for key, value in options.items():
        if key != "include_usage":
            raise Refused(f"stream_options.{key} is not supported: this server takes include_usage only; remove it",
                          f"stream_options.{key}")
        if value is not None and not isinstance(value, bool):
            raise Refused(f"stream_options.include_usage must be true or false, got {shown(value)}",
                          "stream_options.include_usage")
    return bool(options.get("include_usage"))


def max_tokens_of(body: dict) -> int | None:
    """The request's token limit: ``max_completion_tokens`` or ``max_tokens`` (None: neither given)."""
    given = {key: integer(body, key, None, 1, None) for key in ("max_completion_tokens", "max_tokens")}
    values = {value for value in given.values() if value is not None}
    if len(values) > 1:
        raise Refused(f"max_tokens {given['max_tokens']} and max_completion_tokens {given['max_completion_tokens']} "
                      "disagree: send one of them", "max_tokens")
    return values.pop() if values else None


def number(body: dict, key: str, default: float, low: float, high: float, note: str, above: bool = False) -> float:
    """A numeric setting from ``low`` (excluded with ``above``) to ``high``; null or absent: ``default``."""
    value = body.get(key)
    if value is None:
        return default
    if not is_number(value) or not (value > low if above else value >= low) or not value <= high:
        bounds = f"above {low:g}" if above else f"from {low:g}"
        raise Refused(f"{key} must be a number {bounds} to {high:g} ({note}), got {shown(value)}", key)
    return float(value)


def integer(body: dict, key: str, default: int | None, low: int, high: int | None) -> int | None:
    """An integer setting from ``low`` to ``high`` (None: no upper bound); null or absent: ``default``."""
    value = body.get(key)
    if value is None:
        return default
    if not is_integer(value) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"from {low} to {high}"
        raise Refused(f"{key} must be an integer {bounds}, got {shown(value)}", key)
    return value


def shown(value) -> str:
    """A value as an error message quotes it: short, with its JSON type."""
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null"}
    return f"{reprlib.repr(value)} ({kinds.get(type(value), type(value).__name__)})"


# ---------------------------------------------------------------- the engine
@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS or a stop string), "length" (max_tokens) or "abort" (client gone, server stopped)


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
    ids: list  # the prompt's tokens
    stop: tuple = ()  # stop strings
    result: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    sent: str = ""  # the text streamed so far
    rounds: int = 0  # rounds this request has seen decoded
    seen_tokens: int = 0  # its tokens at the end of the round before

    @property
    def key(self) -> tuple:
        """Requests with the same key sample alike and may share a batch."""
        s = self.sampling
        return ("greedy",) if s.greedy else (s.temperature, s.top_p, s.top_k, s.repetition_penalty, self.seed)

    @property
    def done(self) -> bool:
        return self.result.done()


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
        self.shutting_down = threading.Event()  # set: every request ends ("abort") after its current round
        self.draining = False  # set by drain: new requests are refused
        self.deadline: float | None = None  # when a drain ends the requests still running
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
        from .requests import batch_refusal
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

    # ------------------------------------------------------------ requests in
    def submit(self, messages: list, max_tokens: int | None, temperature: float, top_p: float, seed: int,
               on_text: Callable[[str], None], cancelled: threading.Event, stop: tuple = ()) -> Request:
        """Check and queue one chat; its ``result`` (a Future) gets the ``Completion``. Everything the loop would
        refuse is refused here, as ``Refused`` (a ``ValueError``), before the request waits: a stream never starts
        for it. ``max_tokens`` None: what the context leaves, at most ``DEFAULT_MAX_TOKENS``."""
        from .core.sampling import SamplingParams

        if self.draining or self.closed:
            raise self.unavailable()
        sampling = SamplingParams(temperature=temperature, top_p=top_p)
        ids = self.prompt_ids(messages)
        max_tokens = self.fit(ids, max_tokens, sampling, seed)
        request = Request(messages, max_tokens, sampling, seed, on_text, cancelled, ids, tuple(stop))
        with self.ready:
            if self.closed:
                raise self.unavailable()
            self.pending.append(request)
            self.ready.notify()
        return request

    def generate(self, messages: list, max_tokens: int | None, temperature: float, top_p: float, seed: int,
                 on_text, cancelled: threading.Event, stop: tuple = ()) -> Completion:
        """Decode one chat and wait for it (in the next batch, with whatever requests join it); ``on_text(piece)``
        gets the new text after every round."""
        return self.submit(messages, max_tokens, temperature, top_p, seed, on_text, cancelled, stop).result.result()

    @staticmethod
    def unavailable() -> Refused:
        return Refused("the server is shutting down and takes no new requests; send the request again elsewhere or "
                       "once it is back", status=503, kind="server_error")

    def prompt_ids(self, messages: list) -> list[int]:
        """The chat's prompt tokens, formatted by the model's chat template."""
        from .tokenizers import chat_ids

        try:
            return chat_ids(self.tokenizer, messages)[0].tolist()
        except Exception as err:  # a chat template that refuses these messages (roles, order)
            raise Refused(f"messages: the model's chat template cannot format these messages ({err}); send them in "
                          "an order it takes (e.g. one system message first, then user and assistant turns)",
                          "messages") from None

    def fit(self, ids: list[int], max_tokens: int | None, sampling, seed: int) -> int:
        """``max_tokens`` for this prompt, checked by the loop's own checks (``requests.check_generation``,
        which the run makes again); None: what the context leaves after the prompt, at most
        ``DEFAULT_MAX_TOKENS``."""
        import torch

        from .requests import check_generation, context_limit

        gamma = 1 if self.draft is None else self.gamma  # what autoregressive_generate checks with

        def check(n: int):
            return check_generation(self.model, self.draft, torch.tensor([ids]), attention_mask=None, gamma=gamma,
                                    max_new_tokens=n, sampling=sampling, seed=seed, eos_token_id=None,
                                    ignore_eos=False, plain=self.draft is None)

        try:
            checked = check(1)
        except (ValueError, TypeError, NotImplementedError) as err:
            raise Refused(f"messages: the prompt ({len(ids)} tokens) cannot be run ({err}); send shorter "
                          "messages", "messages") from None
        max_length, _ = context_limit(checked.target_lm, getattr(checked.drafter, "lm", None))
        left = DEFAULT_MAX_TOKENS if max_length is None else room_left(max_length, len(ids), gamma)
        if max_tokens is None:
            return min(DEFAULT_MAX_TOKENS, left)
        try:
            check(max_tokens)
        except (ValueError, TypeError, NotImplementedError) as err:
            raise Refused(f"max_tokens {max_tokens} does not fit after this {len(ids)}-token prompt: send at most "
                          f"{left}, or omit max_tokens ({err})", "max_tokens") from None
        return max_tokens

    # ------------------------------------------------------------ stopping
    def drain(self, seconds: float) -> None:
        """Take no new requests; those accepted run on for ``seconds``, then end after their round with
        finish_reason "abort". It only assigns, so a signal handler may call it."""
        self.draining = True
        deadline = time.monotonic() + seconds
        self.deadline = deadline if self.deadline is None else min(self.deadline, deadline)

    def stopping(self) -> bool:
        """Whether every request ends now: the server closes, or a drain ran out of time."""
        return self.shutting_down.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    def close(self) -> None:
        """Stop: the batch in progress ends after its round, waiting requests end, all with "abort"."""
        self.draining = True
        self.shutting_down.set()
        with self.ready:
            self.closed = True
            self.ready.notify()
        self.worker.join()

    # ------------------------------------------------------------ batches out
    def serve_forever(self) -> None:
        """The worker thread: take the oldest waiting request and those that may join it, decode them, repeat."""
        while True:
            with self.ready:
                while not self.pending and not self.closed:
                    self.ready.wait()
                if self.closed:
                    for request in self.pending:
                        self.end(request, [], "abort")
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
        loop refuses before its first round (drafting that cannot batch, a context that cannot take the longest
        prompt with the largest max_tokens) runs one request at a time instead, so that each gets its own answer."""
        live = []
        for request in batch:
            if self.stopping() or request.cancelled.is_set():
                self.end(request, [], "abort")
            else:
                live.append(request)
        if not live:
            return
        try:
            self.decode(live)
        except Exception as err:
            if len(live) > 1 and not any(r.rounds for r in live):  # refused before any work: each alone
                log.warning("a batch of %d was refused (%s); its requests run one at a time", len(live), err)
                for request in live:
                    self.run_batch([request])
                return
            log.exception("a batch of %d failed", len(live))
            for request in live:
                if not request.done:
                    request.result.set_exception(err)
                    self.metrics.success.labels(finished_reason="error").inc()

    def decode(self, batch: list[Request]) -> None:
        """One batch through the loop (left-padded); each row's text streams to its request after every round,
        its result is set as soon as its request ends, and the run stops once every request of the batch has."""
        from .generate import autoregressive_generate, speculative_generate
        from .tokenizers import padded
        from .requests import end_tokens

        eos = set(end_tokens(self.model))
        pad = self.tokenizer.pad_token_id if isinstance(self.tokenizer.pad_token_id, int) else 0  # masked out
        ids, mask = padded([r.ids for r in batch], pad, left=True)
        input_ids, mask = ids.to(self.model.device), None if bool(mask.all()) else mask.to(self.model.device)
        limits = [r.max_tokens for r in batch]

        def on_round(rows) -> bool:
            for request, tokens in zip(batch, rows):
                if request.done:
                    continue
                if not request.rounds:
                    self.metrics.prompt.inc(len(request.ids))  # its prompt went through this round's forward
                request.rounds += 1
                if request.cancelled.is_set() or self.stopping():
                    self.end(request, tokens, "abort")
                else:
                    self.stream(request, tokens, eos)
            return all(r.done for r in batch)  # True ends the run here

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
                self.stream(request, tokens, eos, last=True)
        self.metrics.count_drafts(out.stats)

    def stream(self, request: Request, tokens, eos: set, last: bool = False) -> None:
        """Send ``request`` its new text after a round, and end it where its row ended: at a stop string (the text
        before it), an end-of-sequence token (one of ``eos``), its max_tokens, or the run's end (``last``). Text that
        may be the start of a stop string, and half a character, wait for the next round."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = first_stop(text, request.stop)
        if cut is not None:
            self.end(request, tokens[:self.tokens_to_stop(request, tokens)], "stop", text[:cut])
            return
        request.seen_tokens = len(tokens)
        if len(tokens) > 0 and int(tokens[-1]) in eos:
            self.end(request, tokens, "stop", text)
        elif last or len(tokens) >= request.max_tokens:
            self.end(request, tokens, "length", text)
        else:
            self.send(request, text[:len(text) - held_back(text, request.stop)].rstrip("\ufffd"))

    def tokens_to_stop(self, request: Request, tokens) -> int:
        """How many of ``tokens`` it took to reach the first stop string (a round may bring several): what its
        usage counts, as vLLM's does."""
        for n in range(request.seen_tokens + 1, len(tokens)):
            if first_stop(self.tokenizer.decode(tokens[:n], skip_special_tokens=True), request.stop) is not None:
                return n
        return len(tokens)

    def send(self, request: Request, text: str) -> None:
        """Hand the client the part of ``text`` it has not had; a client whose side fails is cancelled (its request
        ends with "abort" after the next round)."""
        if len(text) <= len(request.sent):
            return
        try:
            request.on_text(text[len(request.sent):])
            request.sent = text
        except Exception as err:
            log.warning("a client's stream failed (%s); its request is cancelled", err)
            request.cancelled.set()

    def end(self, request: Request, tokens, reason: str, text: str | None = None) -> None:
        """End ``request``: the rest of its ``text`` (None: what it was sent, as an aborted one), its result, its
        counts in /metrics."""
        if text is not None:
            self.send(request, text)
        done = Completion(request.sent if text is None else text, len(request.ids), len(tokens), reason)
        request.result.set_result(done)
        self.metrics.count_request(done)


def room_left(max_length: int, prompt_tokens: int, gamma: int) -> int:
    """The most max_new_tokens ``requests.check_request`` admits after a prompt of ``prompt_tokens`` (its rule:
    prompt + max_new_tokens + gamma <= the context; a test holds the two together)."""
    return max_length - prompt_tokens - gamma


def first_stop(text: str, stops: tuple) -> int | None:
    """Where the first stop string in ``text`` starts (None: none is there)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: tuple) -> int:
    """How many characters at the end of ``text`` could be the start of a stop string: a stream waits with them."""
    longest = max((len(s) - 1 for s in stops), default=0)
    for n in range(min(longest, len(text)), 0, -1):
        if any(s.startswith(text[-n:]) for s in stops):
            return n
    return 0


class Metrics:
    """Prometheus counters under vLLM's names, in a registry of their own."""

    def __init__(self, speculative: bool):
        from prometheus_client import CollectorRegistry, Counter, disable_created_metrics

        disable_created_metrics()  # counters only, as vLLM exposes them
        self.registry = CollectorRegistry()
        self.prompt = Counter("vllm:prompt_tokens", "prompt tokens processed", registry=self.registry)
        self.generated = Counter("vllm:generation_tokens", "tokens generated", registry=self.registry)
        self.success = Counter("vllm:request_success", "requests ended, by why", ["finished_reason"],
                               registry=self.registry)
        for reason in FINISH_REASONS:
            self.success.labels(finished_reason=reason)  # each one shown from the start, at 0
        self.speculative = speculative
        if speculative:
            self.drafts = Counter("vllm:spec_decode_num_drafts", "drafts: rounds of each request",
                                  registry=self.registry)
            self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens",
                                        "draft tokens proposed (tree nodes for token trees)", registry=self.registry)
            self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "draft tokens accepted",
                                    registry=self.registry)

    def count_request(self, done: Completion) -> None:
        """A request that ended, however it ended: its reason and the tokens it was given."""
        self.success.labels(finished_reason=done.finish_reason).inc()
        self.generated.inc(done.completion_tokens)

    def count_drafts(self, stats) -> None:
        """One run's drafts; they are per row and round (``accepted_lengths``), as vLLM counts per request."""
        if self.speculative:
            self.drafts.inc(len(stats.accepted_lengths))
            self.draft_tokens.inc(stats.drafted)
            self.accepted.inc(stats.accepted)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# ---------------------------------------------------------------- the HTTP application
def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                   headers: dict | None = None):
    """An error in OpenAI's shape: {"error": {"message", "type", "code", "param"}}; written as ASCII JSON, so a
    field name the client spelled with a lone surrogate cannot break it."""
    from fastapi.responses import Response

    body = {"error": {"message": message, "type": kind, "code": status, "param": param}}
    return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")


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


def check_key(headers, api_key: str | None) -> None:
    """With ``api_key`` set, a request without ``Authorization: Bearer <api_key>`` is a 401 (compared in constant
    time); without one, every request passes."""
    if api_key and not hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {api_key}".encode()):
        raise Refused("this server requires an API key: send the header Authorization: Bearer <key>, the key given "
                      f"to --api-key or {API_KEY_ENV}", status=401, kind="authentication_error")


def build_app(engine: Engine, api_key: str | None = None, limits: BodyLimits = BodyLimits()):
    """The FastAPI application over ``engine``; ``api_key``: what every ``/v1`` route requires."""
    from contextlib import asynccontextmanager

    from fastapi import APIRouter, Depends, FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.get_running_loop().run_in_executor(None, engine.close)  # stops after the current round

    app = FastAPI(title="specdec_lite", lifespan=lifespan)

    async def refused(request: HTTPRequest, refusal: Refused):
        return refusal.response()

    async def no_route(request: HTTPRequest, error: HTTPException):  # an unknown path or method, in OpenAI's shape
        return error_response(error.status_code, f"{error.detail}: {request.method} {request.url.path}; this server "
                              "has POST /v1/chat/completions, GET /v1/models, GET /metrics and GET /health")

    async def require_key(request: HTTPRequest):
        check_key(request.headers, api_key)

    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(HTTPException, no_route)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_key)])

    @app.get("/health")
    async def health():
        if engine.draining:
            return error_response(503, "the server is shutting down; send requests elsewhere", "server_error")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.text(), media_type="text/plain; version=0.0.4")

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [model_entry(engine)]}

    @v1.post("/chat/completions")
    async def chat(request: HTTPRequest):
        settings = check_body(parse_json(await read_body(request, limits)), engine.name)
        request_id, cancelled = f"chatcmpl-{uuid.uuid4().hex}", threading.Event()
        if settings.stream:
            loop, pieces = asyncio.get_running_loop(), asyncio.Queue()
            job = await submit(engine, settings, lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece),
                               cancelled)
            job.result.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
            return StreamingResponse(stream(engine, job, pieces, request_id, settings.include_usage),
                                     media_type="text/event-stream", background=BackgroundTask(cancelled.set))
        job = await submit(engine, settings, lambda _: None, cancelled)
        try:
            done = await outcome(job, request)
        except Exception as err:
            return error_response(500, f"the generation failed: {err}", "server_error")
        return JSONResponse({"id": request_id, "object": "chat.completion", "created": int(time.time()),
                             "model": engine.name, "usage": usage_of(done), "choices": [{
                                 "index": 0, "message": {"role": "assistant", "content": done.text},
                                 "finish_reason": done.finish_reason}]})

    app.include_router(v1)
    return app


async def submit(engine: Engine, chat: Chat, on_text, cancelled: threading.Event) -> Request:
    """``engine.submit`` off the event loop (it formats and tokenizes the prompt)."""
    return await asyncio.to_thread(engine.submit, chat.messages, chat.max_tokens, chat.temperature, chat.top_p,
                                   chat.seed, on_text, cancelled, chat.stop)


async def outcome(job: Request, request) -> Completion:
    """The job's completion; a client that goes away meanwhile cancels it (it ends after its next round)."""
    result = asyncio.wrap_future(job.result)
    while not (await asyncio.wait({result}, timeout=DISCONNECT_POLL_S))[0]:
        if await request.is_disconnected():
            job.cancelled.set()
    return result.result()


async def stream(engine: Engine, job: Request, pieces: asyncio.Queue, request_id: str, include_usage: bool):
    """The events of one streamed completion: the role, each round's text, the finish reason, the usage."""
    try:
        yield chunk(request_id, engine.name, {"role": "assistant", "content": ""})
        while (piece := await pieces.get()) is not None:
            yield chunk(request_id, engine.name, {"content": piece})
        try:
            done = job.result.result()
        except Exception as err:  # the loop failed on this batch
            error = {"error": {"message": f"the generation failed: {err}", "type": "server_error", "code": 500,
                               "param": None}}
            yield f"data: {json.dumps(error)}\n\n"
            return
        yield chunk(request_id, engine.name, {}, finish_reason=done.finish_reason)
        if include_usage:
            yield chunk(request_id, engine.name, {}, usage=usage_of(done))
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # a client that went away leaves its batch after the current round


# ---------------------------------------------------------------- the command
def server_dtype(device: str) -> str:
    """The dtype a server runs in when none is asked for: float32 on a CPU, where batched greedy answers are the same
    as alone (half precision rounds a batch's forward differently, so a greedy answer can change with the requests
    beside it; ``repro.greedy_load`` measures both), else the device's "auto" dtype."""
    from .tuning.devices import resolve_device

    return "float32" if resolve_device(device).type == "cpu" else "auto"


def check_arguments(target: str, draft: str, device: str, dtype: str) -> None:
    """A clear error, before anything loads, for a name that cannot be loaded, a device that is not there or a
    dtype it cannot run (the checks the notebooks run too)."""
    from .names import check_model_name
    from .tuning.devices import resolve_device, resolve_dtype
    from .drafts.loading import check_draft_name

    resolve_dtype(dtype, resolve_device(device))
    check_model_name(target)
    if draft != PLAIN:
        check_draft_name(draft)


def draining_server(config, engine: Engine, drain_seconds: float):
    """A uvicorn server whose SIGTERM or SIGINT also starts the engine's drain: uvicorn stops accepting
    connections and waits for the open ones (its ``timeout_graceful_shutdown``), while the engine lets the
    accepted requests run ``drain_seconds`` before it ends them with "abort"."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            engine.drain(drain_seconds)
            super().handle_exit(sig, frame)

    return DrainingServer(config)


def startup_message(host: str, port: int, name: str, api_key: str) -> str:
    where = f"specdec_lite.serve: serving {name!r} at http://{host}:{port}/v1"
    if api_key:
        return f"{where}; an API key is required (Authorization: Bearer <key>)"
    return (f"{where}; no API key is required: anyone who can reach {host}:{port} can use it (set --api-key or "
            f"{API_KEY_ENV} to require one)")


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
    parser.add_argument("--dtype", default=None, help=f"{DTYPE_HELP}; default: float32 on a CPU, where a greedy "
                        "answer is the same alone or in a batch (in bfloat16 it may not be), else auto")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default="", help="the model's name in the API (default: --target)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV, ""), help="require 'Authorization: "
                        f"Bearer <key>' on every /v1 route (default: ${API_KEY_ENV}; unset: no key required)")
    parser.add_argument("--max-body-bytes", type=int, default=BodyLimits.max_bytes, help="larger request bodies "
                        "are refused (413)")
    parser.add_argument("--body-timeout", type=float, default=BodyLimits.timeout_s, help="seconds a request body "
                        "has to arrive in full (408 and the connection closed otherwise)")
    parser.add_argument("--drain-seconds", type=float, default=30.0, help="on SIGTERM or SIGINT, how long running "
                        "requests may go on before they end with finish_reason 'abort'")
    args = parser.parse_args(argv)
    if args.gamma < 1 or args.threads < 0 or args.max_batch < 1 or args.gather_ms < 0:
        parser.error(f"--gamma and --max-batch must be >= 1, --threads and --gather-ms >= 0, got {args.gamma}, "
                     f"{args.max_batch}, {args.threads} and {args.gather_ms}")
    if args.max_body_bytes < 1 or not args.body_timeout > 0 or not args.drain_seconds >= 0:
        parser.error(f"--max-body-bytes must be >= 1, --body-timeout > 0 and --drain-seconds >= 0, got "
                     f"{args.max_body_bytes}, {args.body_timeout} and {args.drain_seconds}")
    args.dtype = args.dtype or server_dtype(args.device)
    try:
        check_arguments(args.target, args.draft, args.device, args.dtype)
    except (ValueError, TypeError, FileNotFoundError) as err:
        parser.error(str(err))  # one line and the usage, no traceback
    import torch
    import uvicorn

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(args.target, args.draft, args.device, args.dtype, args.gamma,
                    args.served_model_name or args.target, max_batch=args.max_batch, gather_ms=args.gather_ms)
    for mode, reason in engine.refusals.items():
        if reason and args.max_batch > 1:
            print(f"specdec_lite.serve: {mode} requests run one at a time: {reason}", file=sys.stderr, flush=True)
    app = build_app(engine, args.api_key or None, BodyLimits(args.max_body_bytes, args.body_timeout))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=args.drain_seconds + SHUTDOWN_MARGIN_S)
    print(startup_message(args.host, args.port, engine.name, args.api_key), file=sys.stderr, flush=True)
    try:
        draining_server(config, engine, args.drain_seconds).run()
    except KeyboardInterrupt:  # uvicorn raises SIGINT again once it has shut down, as uvicorn.run expects
        pass


if __name__ == "__main__":
    main()
