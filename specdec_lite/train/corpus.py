"""Target-made training text: the raw material for training drafts (standalone, EAGLE-style, Medusa).

Prompts come from three places:
  - templates here (``training_prompts``): families code, explain, advice, translate, chat, and summarize (the
    target's own stored replies to explain/advice prompts, given back to it as passages to summarize);
  - files installed on the machine (``sources.py``, ``--sources``): tens of thousands of prompts in the families
    code, dialogue, summarization and translation (the evaluation's four tasks), ids ``src-<family>-<hash>``;
  - requests the target wrote itself (``self_prompts.py``, ``--self-made``), in the same four families, ids
    ``self-<family>-<hash>``: they read like the evaluation's prompts, where the harvested ones ask about code.
All are disjoint from the evaluation prompts in ``data/prompts/`` (tests check it).

Text written by the target itself is what a draft must learn to predict, and on a 2-core CPU it is the scarce
resource, so it is kept compactly in the cache (``paths.corpus_dir()``; the shipped text is restored there by
``python -m specdec_lite.train.restore``) and every run appends to it, a batch at a time (a run can be stopped at
any moment and resumed):

    tokens.bin    uint16 token ids, records back to back (prompt with chat template, then reply)
    index.jsonl   one line per record: id, family, prompt, offset, prompt_len, gen_len,
                                   temperature, top_p, seed, target; the records since the harvested sources
                                   also source (where the prompt came from), top_k (0: none) and dtype

    python -m specdec_lite.train.corpus --budget 200000          # templates; resumes: done prompts are skipped
    python -m specdec_lite.train.corpus --sources --dtype bfloat16 --batch-size 64 --minutes 150 --budget 50000000
    python -m specdec_lite.train.corpus --self-made --dtype bfloat16 --batch-size 64 --max-new-tokens 128 --minutes 30

The template batches cycle temperatures 0, 0.7 and 1 with top_p 0.95 (and, before ``top_k=0`` was passed,
transformers' default top_k of 50). The harvested and self-made prompts are answered greedily and at T=1 (plain
sampling: top_p 1, no top_k) in turn for each family, a family per batch (``family_batches``).

Speed (reply tokens written a second on the embedded target, 192 new tokens at most). Earlier runs used
``model.generate`` a batch at a time: on a 2-core AMD EPYC with AVX512-BF16 (a shared machine, so roughly), bfloat16
as it is (``batch_invariant=False``) 252 at batch 16 against float32's 31; batch 32: 410, 64: 481; batches of one
family +12% at batch 32. On a 2-core Xeon with AMX, bfloat16: one forward step of 64 rows with a warm cache 578
tokens/s, ``generate`` over rows of equal length 319, and the command above 190-240 a second: a batch's rows end at
different lengths, so about a third of the row-steps were idle (transformers' continuous batching,
``generate_batch``, wrote 151 tokens/s there). Hence ``refill.RefillingSampler``, which gives a row the next prompt
as soon as its reply ends, and ``core.sampling.sample`` by inverse transform (``torch.multinomial`` took about 1 ms
a row of a T=1 batch). Same 384 harvested prompts, same 2-core AMD EPYC, one run: ``generate`` batches of 64 wrote
208.5 tokens/s, the refilling sampler 243.1 (1.17x; both including the last rows' drain); the command above for 10
minutes then 224 a second over its whole wall time (158,895 reply tokens in 11.8 minutes, loading, harvesting the
prompts and the drain included), and for 42 minutes 635,157 reply tokens, 248 a second (its first 10 minutes shared
with other work; 262 a second over the 20 quiet minutes in its middle).
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from .. import paths
from ..tuning.devices import DTYPE_HELP
from ..names import EMBEDDED_TARGET
from ..core.models import load_model
from .refill import RefillingSampler
from .restore import missing_text

TEMPERATURES = (0.0, 0.7, 1.0)  # cycled over records: greedy text for greedy acceptance, sampled for variety
SOURCE_TEMPERATURES = (0.0, 1.0)  # the harvested prompts: greedy and plain sampling, as in the evaluation


def corpus_folder(out_dir: Path | None = None) -> Path:
    """``out_dir``, or the training text in the cache, which must then be there (``train.restore`` writes it)."""
    if out_dir is not None:
        return Path(out_dir)
    if not (paths.corpus_dir() / "index.jsonl").exists():
        raise missing_text(paths.corpus_dir(), "target-made text")
    return paths.corpus_dir()


def load_index(out_dir: Path | None = None) -> list[dict]:
    """The corpus's index entries (``index.jsonl``), one per record (none in a new folder)."""
    path = corpus_folder(out_dir) / "index.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_records(out_dir: Path | None = None) -> list[tuple[dict, np.ndarray]]:
    """[(index entry, token ids of prompt + reply)] for every stored record (none in a new folder)."""
    out_dir = corpus_folder(out_dir)
    if not (out_dir / "tokens.bin").exists():
        return []
    tokens = np.fromfile(Path(out_dir) / "tokens.bin", dtype=np.uint16)
    return [(e, tokens[e["offset"]: e["offset"] + e["prompt_len"] + e["gen_len"]].astype(np.int64))
            for e in load_index(out_dir)]

_CODE_TASKS = [
    "reverses a linked list", "merges two sorted lists", "counts the vowels in a string", "computes a factorial",
    "checks whether a number is prime", "finds the largest element of a list", "removes duplicates from a list",
    "converts Celsius to Fahrenheit", "parses a CSV line into fields", "computes the mean and median of numbers",
    "flattens a nested list", "returns the n-th Fibonacci number", "checks if two strings are anagrams",
    "sorts a list of dictionaries by a key", "reads a text file and counts its lines", "implements binary search",
    "validates an email address with a regular expression", "computes the greatest common divisor",
    "transposes a matrix", "groups words by their first letter", "finds the longest common prefix",
    "implements a simple stack class", "implements a queue with two stacks", "rotates a list by k positions",
    "counts word frequencies in a text", "converts a Roman numeral to an integer", "checks balanced parentheses",
    "generates all permutations of a list", "computes the power set of a set", "formats a number with commas",
    "converts a string to title case", "finds all primes below n with a sieve", "merges two dictionaries",
    "computes the edit distance between two strings", "returns the k most common items", "chunks a list",
    "computes a running total", "checks whether a year is a leap year", "capitalizes every sentence",
    "computes the dot product of two vectors", "finds the second largest number", "zips two lists into a dict",
]
_LANGUAGES = ["Python", "JavaScript", "C", "Go", "Rust"]
_CODE_STYLES = ["", " Include a docstring.", " Add short comments.", " Then show an example call.",
                " Keep it short.", " Handle invalid input."]

_TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "compound interest", "the French Revolution", "volcanoes",
    "how vaccines work", "the stock market", "machine learning", "climate change", "the human heart", "rainbows",
    "plate tectonics", "the printing press", "electric cars", "honey bees", "the internet", "sleep", "inflation",
    "the Roman Empire", "renewable energy", "coral reefs", "the immune system", "gravity", "recycling",
    "the moon landing", "DNA", "earthquakes", "supply and demand", "the solar system", "antibiotics",
    "democracy", "jazz music", "the Great Wall of China", "deserts", "tides", "coffee", "chess", "bread making",
]
_EXPLAIN = ["Explain {t} in simple terms.", "Write a short paragraph about {t}.", "What are three facts about {t}?",
            "Describe {t} to a ten-year-old.", "Why is {t} important?", "Give a brief history of {t}.",
            "What are common misconceptions about {t}?", "Write a short news report about {t}.",
            "Compare {t} with something from everyday life.", "Write a short poem about {t}."]
_ADVICE = [
    "What are some tips for {a}?", "How do I get better at {a}?", "I am nervous about {a}. Any advice?",
    "Can you make a simple plan for {a}?", "What mistakes do beginners make when {a}?",
]
_ACTIVITIES = [
    "learning to cook", "running a marathon", "saving money", "learning a new language", "public speaking",
    "starting a garden", "studying for exams", "moving to a new city", "job interviews", "writing a novel",
    "learning to swim", "keeping a journal", "making new friends", "waking up early", "learning the guitar",
    "traveling alone", "training a puppy", "working from home", "reading more books", "planning a wedding",
]
_SUBJECTS = ["My brother", "The teacher", "Our neighbors", "The little girl", "My best friend", "The old man",
             "The students", "Her mother", "The doctor", "We", "They", "The cat"]
_VERBS = ["is reading a book", "went to the market", "will visit Paris next summer", "likes to play football",
          "cooked dinner for everyone", "is learning to drive", "forgot the keys at home", "painted the kitchen",
          "is waiting for the bus", "bought a new bicycle", "wrote a letter", "is sleeping in the garden"]
_WHEN = ["", " yesterday", " every morning", " on Sunday", " after work", " this evening"]
_TARGET_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
# conversational requests
_SITUATIONS = [
    "I started a new job last week", "my roommate never cleans the kitchen", "I can't fall asleep before 2 am",
    "I want to eat healthier but I love snacks", "my team at work ignores my ideas", "I have an exam on Friday",
    "I feel lonely on weekends", "my dog barks at every stranger", "I spend too much time on my phone",
    "my parents are visiting for a week", "I keep procrastinating on my thesis", "I want to start running",
    "my laptop is getting very slow", "I forgot my friend's birthday", "I have to give a toast at a wedding",
    "I want to learn to draw", "my neighbour plays loud music at night", "I'm planning a trip on a small budget",
    "I got a bad grade on my essay", "I want to ask for a raise", "my kids don't want to read books",
    "I'm bored with my usual dinners", "I have too many emails to answer", "my bike keeps getting flat tyres",
    "I want to volunteer in my community", "I'm nervous about flying", "I want to decorate a tiny apartment",
    "my sourdough bread does not rise", "I'm choosing between two job offers", "I want to quit coffee",
]
_CHAT_FRAMES = ["{s}. What should I do?", "{s}. Any tips?", "Hey, {s}. Can you help me think this through?",
                "{s}, and I don't know where to begin.", "Quick question: {s}. What would you suggest?",
                "{s}. What are my options?", "So {s}. How do other people handle this?",
                "{s}. Could you give me a simple plan?"]
_SUMMARY_INSTRUCTIONS = ["Give a one-sentence summary of this text:", "Summarize this in two sentences:",
                         "What is the main point of the following passage?",
                         "Write a short summary (at most 30 words) of the text below.",
                         "Condense this paragraph into a single short sentence:",
                         "Briefly summarize the passage that follows."]


def training_prompts(seed: int = 0) -> list[dict]:
    """Template-made instructions in four families (code, explain, advice, translate), shuffled with ``seed``.
    Every prompt has a stable id, so appending runs skip what is done."""
    prompts = []
    for task, lang, style in itertools.product(_CODE_TASKS, _LANGUAGES, _CODE_STYLES):
        prompts.append(("code", f"Write a {lang} function that {task}.{style}"))
    for template, topic in itertools.product(_EXPLAIN, _TOPICS):
        prompts.append(("explain", template.format(t=topic)))
    for template, act in itertools.product(_ADVICE, _ACTIVITIES):
        prompts.append(("advice", template.format(a=act)))
    for i, (subj, verb, lang) in enumerate(itertools.product(_SUBJECTS, _VERBS, _TARGET_LANGUAGES)):
        when = _WHEN[i % len(_WHEN)]
        prompts.append(("translate", f"Translate to {lang}: {subj} {verb}{when}."))
    for situation, frame in itertools.product(_SITUATIONS, _CHAT_FRAMES):  # appended: earlier ids stay stable
        text = frame.format(s=situation)
        prompts.append(("chat", text[0].upper() + text[1:]))
    records = [{"id": f"train-{fam}-{j:05d}", "family": fam, "prompt": text} for j, (fam, text) in enumerate(prompts)]
    random.Random(seed).shuffle(records)
    return records


def summary_prompts(tokenizer, out_dir: Path | None = None, seed: int = 0) -> list[dict]:
    """Summarization requests whose passages are the target's own stored replies to 'explain' and 'advice'
    instructions (so no outside text is needed, and none of it comes from the evaluation prompts)."""
    rng = random.Random(seed)
    out = []
    for entry, arr in load_records(out_dir):
        if entry["family"] not in ("explain", "advice"):
            continue
        passage = tokenizer.decode(arr[entry["prompt_len"]:], skip_special_tokens=True).strip()
        if len(passage.split()) < 40:
            continue
        instruction = rng.choice(_SUMMARY_INSTRUCTIONS)
        out.append({"id": f"train-summarize-{entry['id']}", "family": "summarize",
                    "prompt": f"{instruction}\n\n{passage}"})
    return out


def _append(out_dir: Path, entries: list[dict], arrays: list[np.ndarray]) -> None:
    bin_path = out_dir / "tokens.bin"
    offset = bin_path.stat().st_size // 2 if bin_path.exists() else 0
    with open(bin_path, "ab") as fb, open(out_dir / "index.jsonl", "a") as fi:
        for entry, arr in zip(entries, arrays):
            entry["offset"] = offset
            fb.write(arr.astype(np.uint16).tobytes())
            offset += len(arr)
            fi.write(json.dumps(entry, ensure_ascii=False) + "\n")


def cycled_batches(todo: list[dict], batch_size: int, first: int = 0):
    """(batch, temperature) for the template-made prompts: batches in order, temperatures cycled over
    ``TEMPERATURES`` from batch number ``first``."""
    for i, start in enumerate(range(0, len(todo), batch_size)):
        yield todo[start: start + batch_size], TEMPERATURES[(first + i) % len(TEMPERATURES)]


def family_batches(todo: list[dict], batch_size: int, done: list[dict], window: int = 8):
    """(batch, temperature) for the harvested prompts (``sources.py``): the families take turns, a batch holds
    one family's prompts (their replies end at similar lengths, so fewer rows wait for the longest), sorted by
    length within windows of ``window`` batches (less padding), and a batch is greedy or T=1
    (``SOURCE_TEMPERATURES``), whichever its family has fewer records of in ``done`` and so far."""
    prefix = todo[0]["id"].split("-")[0] + "-" if todo else ""  # src- or self-: each kind is balanced on its own
    counts = Counter((e["family"], e["temperature"]) for e in done if e["id"].startswith(prefix))
    queues: dict[str, list[dict]] = {}
    for p in todo:
        queues.setdefault(p["family"], []).append(p)
    turns = {family: _windowed(prompts, batch_size, window) for family, prompts in queues.items()}
    while turns:
        for family in list(turns):
            batch = next(turns[family], None)
            if batch is None:
                del turns[family]
                continue
            temperature = min(SOURCE_TEMPERATURES, key=lambda t: counts[family, t])
            counts[family, temperature] += len(batch)
            yield batch, temperature


def _windowed(prompts: list[dict], batch_size: int, window: int):
    for start in range(0, len(prompts), batch_size * window):
        chunk = sorted(prompts[start: start + batch_size * window], key=lambda p: len(p["prompt"]))
        for i in range(0, len(chunk), batch_size):
            yield chunk[i: i + batch_size]


@torch.inference_mode()
def generate_corpus(model, tokenizer, out_dir: Path | None = None, budget_tokens: int = 100_000,
                    batch_size: int = 16, max_new_tokens: int = 192, top_p: float | None = None, seed: int = 0,
                    target_name: str = "smollm2-135m-instruct", progress: bool = True,
                    max_minutes: float | None = None, families=None, sources: bool = False,
                    self_made: bool = False) -> int:
    """Append target-written replies to ``out_dir`` until ``budget_tokens`` new reply tokens are written (or
    ``max_minutes`` have passed; the replies under way are finished first). Returns the number written.
    The replies are written by ``refill.RefillingSampler``, ``batch_size`` rows at a time, each row taking the
    next prompt as soon as its reply ends. By default the prompts are the template-made ones, a batch's worth of
    prompts at one temperature in turn (cycled over
    ``TEMPERATURES``, ``top_p`` 0.95 unless given); ``sources=True`` answers the prompts harvested from installed
    files instead (``sources.harvest_prompts``, batched by ``family_batches``: greedy and T=1 in turn, ``top_p``
    1 unless given); ``self_made=True`` answers, in the same way, the prompts made from the requests the
    target wrote itself (``self_prompts.self_made_prompts``). ``families`` (e.g.
    ``["chat", "summarize"]``) restricts the prompts to those families; the 'summarize' template prompts are made
    from stored replies (``summary_prompts``)."""
    from ..show import progress_bar

    out_dir = Path(out_dir or paths.corpus_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(tokenizer) > 65535:
        raise ValueError("token ids are stored as uint16; this tokenizer has more than 65,535 tokens")
    done = load_index(out_dir)
    done_ids = {e["id"] for e in done}
    if sources and self_made:
        raise ValueError("choose one of sources and self_made: each run answers one kind of prompts")
    if sources:
        from .sources import harvest_prompts
        candidates = harvest_prompts(seed)
    elif self_made:
        from .self_prompts import self_made_prompts
        candidates = self_made_prompts(tokenizer, load_records(out_dir), out_dir, seed)
    else:
        candidates = training_prompts(seed) + summary_prompts(tokenizer, out_dir, seed)
    todo = [p for p in candidates if p["id"] not in done_ids and (families is None or p["family"] in families)]
    if not todo:
        raise ValueError(f"no prompts left to answer for families {families}; every one is in {out_dir}")
    harvested = sources or self_made
    top_p = top_p if top_p is not None else (1.0 if harvested else 0.95)
    batches = (family_batches(todo, batch_size, done) if harvested
               else cycled_batches(todo, batch_size, len(done_ids) // batch_size))
    requests = ((prompt, temperature) for batch, temperature in batches for prompt in batch)
    sampler = RefillingSampler(model, tokenizer, batch_size, max_new_tokens, top_p,
                               seed=seed * 1_000_003 + len(done))  # a resumed run draws afresh
    written, entries, arrays = 0, [], []
    bar = progress_bar(total=budget_tokens, desc="target-made tokens", disable=not progress)
    started = time.monotonic()
    out_of_time = lambda: max_minutes is not None and time.monotonic() - started > 60 * max_minutes
    for prompt, temperature, prompt_ids, reply in sampler.run(requests, stop=lambda: written >= budget_tokens
                                                                or out_of_time()):
        entries.append({**prompt, "prompt_len": len(prompt_ids), "gen_len": len(reply), "temperature": temperature,
                        "top_p": top_p if temperature > 0 else 1.0, "top_k": 0,
                        "dtype": str(model.dtype).removeprefix("torch."), "seed": seed, "target": target_name})
        arrays.append(np.array(prompt_ids + reply))
        written += len(reply)
        bar.update(len(reply))
        if len(entries) >= batch_size:  # appended a batch's worth at a time: a stopped run loses at most the rows
            _append(out_dir, entries, arrays)  # under way
            entries, arrays = [], []
    if entries:
        _append(out_dir, entries, arrays)
    bar.close()
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=EMBEDDED_TARGET)
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--out", default=None, help="default: the training text in the cache (paths.corpus_dir())")
    parser.add_argument("--budget", type=int, default=100_000, help="new reply tokens to write")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long (finishing the batch)")
    parser.add_argument("--families", nargs="+", default=None,
                        help="only these prompt families (templates: code explain advice translate chat summarize; "
                             "--sources and --self-made: code dialogue summarization translation)")
    parser.add_argument("--sources", action="store_true",
                        help="answer the prompts harvested from installed files (sources.py), not the templates")
    parser.add_argument("--self-made", action="store_true",
                        help="answer the prompts made from the target's own requests (self_prompts.py; write "
                             "them first with python -m specdec_lite.train.self_prompts)")
    parser.add_argument("--top-p", type=float, default=None,
                        help="nucleus for the sampled batches (default: 1.0 with --sources, else 0.95)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's; 1 leaves a core to other work on a shared machine)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out or paths.corpus_dir())
    model, tokenizer = load_model(args.target, dtype=args.dtype, batch_invariant=False)
    n = generate_corpus(model, tokenizer, out_dir, args.budget, args.batch_size, args.max_new_tokens, top_p=args.top_p,
                        seed=args.seed, target_name=args.target, max_minutes=args.minutes, families=args.families,
                        sources=args.sources, self_made=args.self_made)
    print(f"wrote {n} reply tokens; {len(load_index(out_dir))} records in {out_dir}")


if __name__ == "__main__":
    main()
