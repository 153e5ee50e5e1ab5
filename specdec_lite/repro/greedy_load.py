"""Greedy answers under load: does a served greedy answer depend on the requests that share its batch, and what
does keeping it the same cost?

    python -m specdec_lite.repro.greedy_load                       (the embedded target, three configurations)
    python -m specdec_lite.repro.greedy_load --configs default float32 --concurrency 1 4 --prompts 8

For each configuration of the plain server (``python -m specdec_lite.serve --draft none``): ``auto`` (the dtype
the device decodes fastest in: bfloat16 on CPUs with native bfloat16, ``--dtype auto``) and ``float32`` (the
server's default on a CPU, ``serve.server_dtype``), a server is started, every prompt is sent alone, one after another (the reference answers), then all of them again at each
concurrency (that many requests in flight at once, so that they share batches), greedy (temperature 0) with
``--max-tokens`` each. One row per configuration and concurrency: the throughput (completion tokens of all the
requests over the wall time of the pass) and how many answers differ from the same request's reference. The table
is printed and written as a CSV (default ``out/greedy_load.csv``). The machine should be otherwise quiet.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from pathlib import Path

import pandas as pd

from ..names import EMBEDDED_TARGET
from .endpoints import EndpointError, free_port, local_server_command, run_coroutine, save, serving
from .tasks import TASKS, load_prompts

CONFIGS = {"auto": "auto", "float32": "float32"}  # name: the server's --dtype
CONCURRENCY = (1, 4, 16)


def config_command(config: str, port: int, target: str, threads: int) -> list[str]:
    """The plain server's command for ``config`` (one of ``CONFIGS``)."""
    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}: choose from {', '.join(CONFIGS)}")
    return local_server_command(port, target, "none", dtype=CONFIGS[config], threads=threads)


async def answer(client, url: str, model: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    """(text, completion tokens) of one greedy chat completion."""
    response = await client.post(url, json={"model": model, "messages": [{"role": "user", "content": prompt}],
                                            "max_tokens": max_tokens, "temperature": 0})
    response.raise_for_status()
    body = response.json()
    return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]


async def one_pass(url: str, model: str, prompts: list[str], max_tokens: int, concurrency: int):
    """Every prompt once, ``concurrency`` in flight at a time: ([(text, tokens)] in prompt order, wall seconds)."""
    import httpx

    gate = asyncio.Semaphore(concurrency)

    async def limited(client, prompt):
        async with gate:
            return await answer(client, url, model, prompt, max_tokens)

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        answers = await asyncio.gather(*(limited(client, p) for p in prompts))
        return answers, time.perf_counter() - start


def measure_config(config: str, target: str, prompts: list[str], concurrencies, max_tokens: int,
                   threads: int = 1) -> list[dict]:
    """One configuration's rows: a server started for it, the reference pass, one pass per concurrency."""
    port = free_port()
    with tempfile.TemporaryDirectory() as logs, serving(config_command(config, port, target, threads), port,
                                                        log=Path(logs) / "server.log"):
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        alone, _ = run_coroutine(one_pass(url, target, prompts, max_tokens, 1))
        rows = []
        for concurrency in concurrencies:
            answers, seconds = run_coroutine(one_pass(url, target, prompts, max_tokens, concurrency))
            tokens = sum(n for _, n in answers)
            rows.append({"config": config, "concurrency": concurrency, "requests": len(prompts),
                         "completion_tokens": tokens, "seconds": round(seconds, 3),
                         "tokens_per_s": round(tokens / seconds, 2),
                         "differ_from_alone": sum(a[0] != b[0] for a, b in zip(answers, alone))})
        return rows


def measure(target: str, prompts: list[str], configs=tuple(CONFIGS), concurrencies=CONCURRENCY,
            max_tokens: int = 48, threads: int = 1) -> pd.DataFrame:
    """The table: a row per configuration and concurrency (see the module's text). A configuration whose server
    does not start (a dtype the device cannot run) gets one row saying why, and the others are still measured."""
    if not prompts or any(not isinstance(c, int) or c < 1 for c in concurrencies) or max_tokens < 1:
        raise ValueError(f"give at least one prompt, concurrencies >= 1 and max_tokens >= 1, got {len(prompts)} "
                         f"prompts, {list(concurrencies)} and {max_tokens}")
    rows = []
    for config in configs:
        try:
            rows += measure_config(config, target, prompts, concurrencies, max_tokens, threads)
        except EndpointError as err:
            rows.append({"config": config, "not_run": str(err).splitlines()[-1]})
    return pd.DataFrame(rows)


def distinct_prompts(n: int) -> list[str]:
    """``n`` distinct prompts of the shipped set, taken evenly from its tasks."""
    records = load_prompts(per_task=math.ceil(n / len(TASKS)))[:n]
    if len(records) < n:
        raise ValueError(f"the shipped prompts hold {len(records)} prompts, fewer than --prompts {n}")
    return [r["prompt"] for r in records]


def main(argv=None):
    """python -m specdec_lite.repro.greedy_load: throughput and greedy answers that change under load."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--target", default=EMBEDDED_TARGET, help="package name, Hugging Face id or local folder")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(CONCURRENCY),
                        help="requests in flight at once, one pass each")
    parser.add_argument("--prompts", type=int, default=16, help="distinct prompts, sent once per pass")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (0: torch's default)")
    parser.add_argument("--out", default="out/greedy_load.csv")
    args = parser.parse_args(argv)
    table = measure(args.target, distinct_prompts(args.prompts), args.configs, args.concurrency, args.max_tokens,
                    args.threads)
    print(table.to_string(index=False))
    print(f"written to {save(table, args.out)}")
    return table


if __name__ == "__main__":
    main()
