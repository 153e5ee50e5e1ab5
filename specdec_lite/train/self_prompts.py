"""Requests the target writes itself, for training text that reads like the evaluation's (Magpie, Xu et al. 2024).

The harvested prompts (``sources.py``) come from code and documentation, so they ask about Python modules and
Debian packages; the evaluation asks everyday things ("I just moved to a new city..."). An instruction-tuned model
given its chat template up to the user's turn writes a user request of the kind it was tuned on. Here it is also
given the request's first words (``OPENINGS``, no trailing space: the tokenizer puts a word's space before it), so
that the requests cover the evaluation's four tasks:

    dialogue       requests it writes from openings such as "Can you recommend" or "My"
    code           requests it writes from openings such as "Write a Bash script"
    summarization  "Summarize ...: <passage>", the passages being its own replies to the requests it wrote from
                   openings such as "Write a short news report about" (``PASSAGE_OPENINGS``)
    translation    "Translate into <language>: <sentence>", the sentences being its short one-sentence
                   dialogue requests and sentences of those same replies

The requests are stored in ``self_requests.jsonl`` beside the corpus (``paths.corpus_dir()``; appended to, so a run
resumes); the corpus answers the prompts made from them, ids ``self-<family>-<hash>``, and the summarization and
translation prompts grow as the replies they are made from are stored:

    python -m specdec_lite.train.self_prompts --requests 2560          # try 2,560 rows in all (resumable)
    python -m specdec_lite.train.corpus --self-made --dtype bfloat16 --batch-size 64 --max-new-tokens 128

Run the corpus again once replies to the passage requests are stored: its summarization prompts and the
translations of their sentences are made when it starts. On a 2-core Xeon with AMX, bfloat16: 2,560 rows tried in
15 minutes (1,990 clean requests); 3,990 replies (397k tokens) in 33 minutes.

Requests that are not one clean request (no end of turn within ``MAX_REQUEST_TOKENS``, other scripts, markup,
fewer than four words) are dropped, and so is any prompt that leaks into the evaluation prompts
(``sources.without_leaks``).
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import torch

from .. import paths
from ..tuning.devices import DTYPE_HELP
from ..names import EMBEDDED_TARGET
from ..core.models import load_model
from . import sources

REQUESTS_FILE = "self_requests.jsonl"
MAX_REQUEST_TOKENS = 48
REQUEST_TEMPERATURE, REQUEST_TOP_P = 0.8, 0.95  # plain T=1 writes many garbled requests with a 135M model
OPENINGS = {
    "dialogue": ("", "", "Hi!", "Hey,", "Can you", "Can you recommend", "Can you tell me a short story about",
                 "What", "What's a good way to", "What are some", "How do I", "How can I", "How do you", "I",
                 "I'm", "I want to", "I have", "My", "Is it better to", "Should I", "Why do", "Any tips for",
                 "Do you have any advice on", "Could you explain", "Tell me about"),
    "code": ("Write a Python function", "Write a Python function", "Write a Python script that",
             "Implement a Python class", "Write a Python generator", "Write a JavaScript function",
             "Write a SQL query", "Write a Bash script", "Write a C function", "Write a Java method",
             "Implement", "Write a function in Go", "Write a regular expression"),
}
PASSAGE_OPENINGS = ("Write a short news report about", "Write a short news story about",
                    "Write a short paragraph about", "Write a short article about", "Describe",
                    "Tell me a short story about", "Write a short blog post about")
_MARKUP = re.compile(r"<\||\|>|https?://|[{}\[\]<>#*_`|\\]")


def is_request(text: str, family: str) -> bool:
    """Whether ``text`` (a request the target wrote, end of turn stripped) is one clean request: 4-80 words of
    ASCII, one paragraph (code requests may quote a snippet), no markup."""
    if not 4 <= len(text.split()) <= 80 or not text.isascii():
        return False
    return family == "code" or ("\n" not in text and not _MARKUP.search(text))


def request_prompt(tokenizer, opening: str) -> str:
    """The chat template up to the user's turn, then ``opening``: the target continues it with a request."""
    marker = "\x00REQUEST\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=False,
                                         tokenize=False)
    return text[: text.index(marker)] + opening


@torch.inference_mode()
def write_requests(model, tokenizer, openings: list[tuple[str, str]], seed: int) -> list[str | None]:
    """The target's continuation of each (family, opening) of ``openings`` into a user request, in one batch
    (``REQUEST_TEMPERATURE``, ``REQUEST_TOP_P``); None where it is not a clean request (``is_request``)."""
    texts = [request_prompt(tokenizer, opening) for _, opening in openings]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=False).to(model.device)
    torch.manual_seed(seed)
    out = model.generate(**enc, max_new_tokens=MAX_REQUEST_TOKENS, do_sample=True, temperature=REQUEST_TEMPERATURE,
                         top_p=REQUEST_TOP_P, top_k=0, pad_token_id=tokenizer.eos_token_id)
    requests = []
    for (family, opening), row in zip(openings, out[:, enc["input_ids"].shape[1]:].tolist()):
        if tokenizer.eos_token_id not in row:
            requests.append(None)
            continue
        text = (opening + tokenizer.decode(row[: row.index(tokenizer.eos_token_id)])).strip()
        requests.append(text if is_request(text, family) else None)
    return requests


def load_requests(out_dir: Path | None = None) -> list[dict]:
    path = Path(out_dir or paths.corpus_dir()) / REQUESTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def opening_schedule(batch_no: int, batch_size: int) -> list[tuple[str, str]]:
    """The (kind, opening) of each row of request batch ``batch_no``: dialogue, code and passage requests in the
    proportions 3:1:1, openings drawn with the batch number as the seed."""
    rng = random.Random(batch_no)
    kinds = rng.choices(["dialogue", "code", "passage"], weights=[3, 1, 1], k=batch_size)
    return [(kind, rng.choice(PASSAGE_OPENINGS if kind == "passage" else OPENINGS[kind])) for kind in kinds]


def generate_requests(model, tokenizer, n: int, out_dir: Path | None = None, batch_size: int = 64,
                      progress: bool = True, target_name: str = EMBEDDED_TARGET) -> int:
    """Append requests written by ``model`` (recorded as ``target_name``) to ``out_dir``'s ``REQUESTS_FILE`` until
    it holds ``n`` batches' worth of attempts made (``n`` rows tried, clean or not: a resumed run continues with
    the next batch number). Returns the clean requests added."""
    from ..show import progress_bar

    out_dir = Path(out_dir or paths.corpus_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    done = load_requests(out_dir)
    first_batch = max((r["batch"] for r in done), default=-1) + 1
    added = 0
    batches = range(first_batch, -(-n // batch_size))
    for batch_no in progress_bar(batches, desc="request batches", disable=not progress):
        schedule = opening_schedule(batch_no, batch_size)
        kept = [{"kind": kind, "opening": opening, "request": text, "batch": batch_no, "target": target_name,
                 "temperature": REQUEST_TEMPERATURE, "top_p": REQUEST_TOP_P}
                for (kind, opening), text in zip(schedule, write_requests(model, tokenizer, schedule, batch_no))
                if text is not None]
        if not kept:  # keep the batch number, so a resumed run does not redo it
            kept = [{"kind": "none", "opening": "", "request": None, "batch": batch_no}]
        with open(out_dir / REQUESTS_FILE, "a") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
        added += sum(r["request"] is not None for r in kept)
    return added


def self_made_prompts(tokenizer, records, out_dir: Path | None = None, seed: int = 0) -> list[dict]:
    """The prompts of the four families made from the requests stored in ``out_dir`` and, for summarization and
    translation, from the replies to them among ``records`` (``corpus.load_records``: (index entry, token ids)),
    less those that leak into the evaluation prompts."""
    requests = [r for r in load_requests(out_dir) if r["request"]]
    prompts = [{"id": "", "family": r["kind"] if r["kind"] != "passage" else "dialogue",
                "source": f"self:{r['kind']}", "prompt": r["request"]} for r in requests]
    one_sentence = [("self:dialogue", r["request"]) for r in requests
                    if r["kind"] == "dialogue" and len(sources.sentences(r["request"], 4, 25)) == 1]
    passage_requests = {r["request"] for r in requests if r["kind"] == "passage"}
    replies = [(f"self:{e['id']}", tokenizer.decode(arr[e["prompt_len"]:], skip_special_tokens=True).strip())
               for e, arr in records if e["id"].startswith("self-") and e["prompt"] in passage_requests]
    replies = [(source, text) for source, text in replies if "\n\n" in text or len(text.split()) >= 40]
    prompts += sources.summarization_prompts(replies, seed)
    sentences = one_sentence + [(source, s) for source, text in replies for s in sources.sentences(text, 5, 25)]
    prompts += sources.translation_prompts(sentences, seed)
    for p in prompts:
        p["id"] = f"self-{p['family']}-{sources.stable_hash(p['prompt'])}"
    return sources.without_leaks(prompts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, required=True, help="request rows to have tried in all")
    parser.add_argument("--dtype", default="bfloat16", help=DTYPE_HELP)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", default=None, help="default: the training text in the cache (paths.corpus_dir())")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(EMBEDDED_TARGET, dtype=args.dtype, batch_invariant=False)
    added = generate_requests(model, tokenizer, args.requests, args.out, args.batch_size)
    print(f"added {added} requests; {len(load_requests(args.out))} lines in {REQUESTS_FILE}")


if __name__ == "__main__":
    main()
