"""The GPU check's benchmark: random-weight Llama models of real shapes, made on the device,
transformers' ``generate`` against our plain and speculative decoding, one row at a time.

    python -m specdec_lite.repro.gpu_bench --device cuda                (make gpu-check; Llama-3.1-8B + 3.2-1B shapes)
    python -m specdec_lite.repro.gpu_bench --device cpu --shapes tiny   (the CPU rehearsal of the same code, minutes)

Random weights need no download (a bare GPU machine has only torch, transformers and pytest), and speed does not
depend on what the weights say. The rows, in the order they are measured (the plain rows first: every speedup is
over one of them):

1. ``generate eager``: transformers' ``generate`` with its default growing cache, eager;
2. ``ours plain eager``: our plain (autoregressive) decoding, growing cache, eager;
3. ``ours plain static eager``: the same on a preallocated static cache (``core.lm.use_static_cache``);
4. ``generate static compiled``: ``generate`` with its own static cache and its documented automatic compilation
   (``cache_implementation="static"`` and a ``CompileConfig(fullgraph=True)``: torch.compile, on CUDA with CUDA
   graphs, of the decoding steps), the peer a GPU user would pick;
5. ``ours plain static compiled``: our plain decoding on the static cache, its decode forwards compiled;
6. ``oracle a=... gamma=...``: speculative decoding on the static compiled path with an **oracle drafter** at
   acceptance a = 0.8, 0.6, 0.9 and gamma 4, 3, 5, 2, 6 (that order: gamma 4 at a = 0.8 first), beside the
   formula's prediction E[N] / (gamma c + v(gamma)) from c and v(gamma) measured on the same path just before;
7. ``auto tree``: auto's kind of token tree (3 branches at the root, chains beneath: ``OracleTree``) on the static
   compiled path with an oracle head at a = 0.8, gamma 4 (``auto_tree_row``), its rows padded to a node budget.

The oracle drafter proposes, at each draft position, the target's own greedy token with probability ``a`` and
another token otherwise, while running the real draft model alongside, so that a round costs what it would with
that draft. The target is made to continue each token by repeating it with a margin no rounding can close
(``make_greedy_unambiguous``): otherwise, in bfloat16, a forward over gamma + 1 tokens rounds differently from a
decode step, the output parts from the reference the oracle proposes from, and the acceptance collapses (it did,
at token 34 of the tiny pair on a 2-core Intel Xeon: 1.27 tokens a round at a = 0.8). Each timed call of an oracle
row uses another seed, and the row records the acceptance and the tokens per round it got. c and v(gamma) are
median times of single forwards fed as the loop feeds them (``forward_seconds``), so they replay the loop's
compiled graphs.

Speedups: plain rows over ``generate eager`` and over ``generate`` on the same cache kind; oracle rows over our
plain decoding on the same path (what the formula predicts) and over the fastest plain decoding measured in the
run. At the end the three claims of the GPU path are checked against the rows (printed, and written to
``verdicts.csv``): ours plain >= 1.0x ``generate`` on the same cache kind; ours compiled >= 2.5x ``generate``
eager; the oracle at 0.8 / gamma 4 >= 2.0x the fastest plain decoding and within 15% of the formula. They are
claims about GPUs: a CPU rehearsal prints them for the record only.

Every row is appended to ``gpu_check.csv`` and flushed as soon as it is measured, so a run cut short keeps what it
measured; each row's wall time (compilation and warm-up included) and the graphs compiled meanwhile are printed
and recorded. A compiled row that compiled nothing stops the run (transformers' ``generate`` falls back to eager
silently), and so does hitting torch's limit on graphs per function (raised to 64 here).

Time budget (``PLANS``; ``--budget-s``): ``make gpu-check`` must finish in 8 minutes on one H100 or H200, its
device tests taking about 2-3 of them, so the benchmark has about 4.5: ``--budget-s 270`` (the ``gpu`` plan's
default), counted from the models' creation. Most of it is compilation, one graph per shape a compiled forward
sees (each row records how many it compiled): the target's decode step twice (transformers' and ours), its
verification over gamma + 1 tokens once per gamma (5), the draft's steps (3); today also the target's and the
draft's single steps timed for c (fed contiguous tokens, while the loop feeds views of its token buffer, and the
compiled forward specializes on strides) and 2 more of the draft's per gamma (that buffer's width depends on
gamma): 20 graphs where 10 would do, tens of seconds each for the 8B shape. The eager rows cost 3 rows x 3 calls x
128 decode steps, the compiled oracle rows far less a step. Before each gamma the run checks that the budget still
covers what the previous gamma took; if not, that gamma's rows are recorded as skipped for the time budget (the
plain rows and gamma 4 come first, so the claims' rows are measured first). Fewer tokens and repeats
(``--new-tokens``, ``--repeats``) shorten a run; nothing is cut by a timeout.

No pandas, seaborn or matplotlib needed: the figure is drawn only when matplotlib is importable.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from ..generate import autoregressive_generate, speculative_generate
from ..core.drafter import Drafter, ModelDraft
from ..core.lm import HFCausalLM, use_dynamic_cache, use_static_cache
from ..tuning.devices import DTYPE_HELP, dtype_name, resolve_device, resolve_dtype
from ..core.sampling import SamplingParams
from ..core.tree import Tree, TreeBuilder
from ..instruments.timing import timed
from . import theory

GREEDY = SamplingParams(temperature=0)
LLAMA3 = dict(num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0)
SHAPES = {  # LlamaConfig fields of the real models (weights random)
    "llama-3.1-8b": dict(LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         tie_word_embeddings=False),
    "llama-3.2-1b": dict(LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         tie_word_embeddings=True),
    "tiny-target": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False),
    "tiny-draft": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False),
}
PAIRS = {"gpu": ("llama-3.1-8b", "llama-3.2-1b"), "tiny": ("tiny-target", "tiny-draft")}
ACCEPTANCES = (0.8, 0.6, 0.9)  # measured in this order: the claim's a = 0.8 first
GAMMAS = (4, 3, 5, 2, 6)  # likewise gamma 4 first; each further gamma compiles one more graph of the target


@dataclass(frozen=True)
class Plan:
    """How much a run measures: prompt and new tokens per call, timed calls per row, and the seconds the
    benchmark may take (checked before each gamma, see the module's docstring)."""

    prompt_len: int
    new_tokens: int
    repeats: int
    budget_s: float
    gammas: tuple = GAMMAS
    acceptances: tuple = ACCEPTANCES
    cpu_threads: int | None = None  # torch's threads during a CPU run (None: as they are)


# prompts longer than core.lm.EAGER_ABOVE (16) tokens, so that prefills run eagerly and compile nothing. The tiny
# shapes run on one thread: they gain nothing from more, and on a 2-core machine busy with other work two threads
# spinning on each other made every eager step many times slower
PLANS = {"gpu": Plan(prompt_len=64, new_tokens=128, repeats=2, budget_s=270),
         "tiny": Plan(prompt_len=32, new_tokens=48, repeats=2, budget_s=600, cpu_threads=1)}
CLAIM_A, CLAIM_GAMMA = 0.8, 4
COMPILED_WARMUPS = 2  # untimed calls before timing a compiled path: compilation, then CUDA-graph recording
COST_REPEATS = 10  # timed forwards per measured cost (c and v): a few ms each on a GPU

COLUMNS = ["row", "kind", "path", "status", "device", "dtype", "target", "draft", "prompt tokens", "new tokens",
           "repeats", "seconds", "graphs compiled", "tokens/s", "ms/token", "over generate eager",
           "over generate same cache", "a", "gamma", "measured acceptance", "tokens/round", "c", "v(gamma)",
           "formula speedup", "formula at measured tokens/round", "speedup over ours plain same path",
           "measured / formula", "fastest plain", "speedup over fastest plain", "greedy identical", "note"]


def random_llama(shape: str, device, dtype: torch.dtype, seed: int = 0, max_positions: int = 4096):
    """A Llama of a known shape with random weights, made directly on ``device`` in ``dtype``; no end-of-sequence
    token, so every run goes to its token count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {sorted(SHAPES)}")
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=max_positions, eos_token_id=None)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


@torch.no_grad()
def make_greedy_unambiguous(model, scale: float = 1e-4):
    """Make a random Llama's greedy next token its current token, by a margin rounding cannot close: every
    layer's output projections (attention ``o_proj``, MLP ``down_proj``) are scaled by ``scale``, so the last
    hidden state is the current token's embedding and little else, and the output layer is the input embedding
    (its row for the current token scores about hidden_size x the embedding's rms, 82 for the 8B shape, against a
    few for any other). The forwards compute exactly what they did (same shapes, same work): only values change.
    Returns the model."""
    embedding = model.get_input_embeddings().weight
    for name, module in model.named_modules():
        if name.endswith(("o_proj", "down_proj")):
            module.weight.mul_(scale)
    output = model.get_output_embeddings().weight
    if output.data_ptr() != embedding.data_ptr():  # untied: copy; tied: already the embedding
        output.copy_(embedding)
    return model


class OracleDraft(Drafter):
    """Proposes the target's own greedy continuation (``reference``, the tokens after the prompt) with
    probability ``a`` per position and a different token otherwise, so that greedy verification accepts each
    position with probability ``a`` until the first miss. The real draft model runs alongside (its tokens are
    discarded), so the round costs what it would with that draft. A point-mass draft: q is None."""

    def __init__(self, draft_model, reference: torch.Tensor, prompt_len: int, a: float, seed: int = 0):
        if not 0 <= a <= 1:
            raise ValueError(f"the oracle's acceptance a must lie in [0, 1], got {a}")
        self.inner = ModelDraft(draft_model)
        self.vocab_size = self.inner.vocab_size
        self.reference, self.prompt_len, self.a, self.seed = reference.cpu(), prompt_len, a, seed

    def begin(self, input_ids: torch.Tensor, padding: list[int] | None = None, tokens: int | None = None) -> None:
        self.inner.begin(input_ids, padding, tokens)
        self.rng = torch.Generator().manual_seed(self.seed)
        self.length = input_ids.shape[1]  # the sequence's length, kept on the host (a GPU would wait for a read)

    def propose(self, seq, lengths, gamma, sampling, generator):
        self.inner.propose(seq, lengths, gamma, sampling, generator)  # the draft model's cost
        start = self.length - self.prompt_len  # index of the next token in the reference
        tokens = []
        for i in range(gamma):
            right = int(self.reference[start + i]) if start + i < len(self.reference) else 0
            if float(torch.rand((), generator=self.rng)) < self.a:
                tokens.append(right)
            else:  # any other token
                tokens.append((right + 1 + int(torch.randint(self.vocab_size - 1, (), generator=self.rng)))
                              % self.vocab_size)
        return torch.tensor([tokens], device=seq.device), None

    def rollback(self, kept) -> None:
        self.inner.rollback(kept)
        self.length = kept[0] + 1  # the caches keep all but the newest token (batch 1)


def pooled_acceptance(accepted_lengths, proposed_lengths) -> float:
    """Accepted drafts / drafts the verifier looked at (a round that proposed k and accepted n < k looked at
    n + 1): alpha when every position accepts with probability alpha (``evaluate.alpha_estimate``, without numpy)."""
    accepted = sum(n - 1 for n in accepted_lengths)
    looked = sum(min(n, k) for n, k in zip(accepted_lengths, proposed_lengths))
    return accepted / looked if looked else float("nan")


# ------------------------------------------------------------------------------------------------ measuring
@dataclass
class Timing:
    tokens_per_s: float  # all timed calls' tokens over all their seconds
    output: object  # the last call's result
    results: list  # every timed call's result


def time_calls(call, device, warmups: int, repeats: int, count=len) -> Timing:
    """``call(i)`` for i = 0 .. warmups - 1 untimed (compilation, CUDA-graph recording), then ``repeats`` timed
    calls i = warmups, ...; ``count(result)``: the new tokens a result holds."""
    for i in range(warmups):
        call(i)
    results, seconds = [], 0.0
    for i in range(warmups, warmups + repeats):
        result, s = timed(lambda: call(i), device)
        results.append(result)
        seconds += s
    return Timing(sum(count(r) for r in results) / seconds, results[-1], results)


def forward_seconds(model, role: str, n_tokens: int, context: torch.Tensor, repeats: int = COST_REPEATS) -> float:
    """Median seconds of one forward over ``n_tokens`` new tokens on a warm cache holding ``context`` (1, T), fed
    the way the loop feeds them (``num_logits=n_tokens``, the same cache role), so that a compiled path replays the
    very graph the loop uses and compiles nothing extra (``instruments.timing.forward_seconds`` keeps every logit, which
    would be another graph). Two untimed forwards first."""
    lm = HFCausalLM(model, role=role)
    lm.reset(1)
    lm.feed(context, num_logits=1)
    keep = [context.shape[1]]
    tokens = torch.randint(0, lm.vocab_size, (1, n_tokens), generator=torch.Generator().manual_seed(n_tokens))
    tokens = tokens.to(lm.device)
    times = []
    for r in range(COMPILED_WARMUPS + repeats):
        _, seconds = timed(lambda: lm.feed(tokens, num_logits=n_tokens), lm.device)
        lm.crop(keep)
        if r >= COMPILED_WARMUPS:
            times.append(seconds)
    return statistics.median(times)


def set_path(models, path: str, max_length: int) -> None:
    """Put ``models`` on a path: "eager-dynamic", "static-eager" or "static-compiled"."""
    for model in models:
        if path == "eager-dynamic":
            use_dynamic_cache(model)
        else:
            use_static_cache(model, max_length=max_length, compile=path == "static-compiled")


def generate_call(model, x, new_tokens: int, static_compiled: bool):
    """A function of the call index running transformers' ``generate`` greedily for exactly ``new_tokens``
    tokens; with ``static_compiled``, on its own static cache with its automatic compilation (``CompileConfig``;
    transformers compiles only on accelerators unless told to compile on every device, as for the CPU
    rehearsal)."""
    from transformers import CompileConfig

    options = dict(attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                   do_sample=False, pad_token_id=0)
    if static_compiled:
        config = CompileConfig(fullgraph=True)
        config._compile_all_devices = x.device.type != "cuda"  # transformers' own switch for compiling on a CPU
        options |= dict(cache_implementation="static", compile_config=config)
    prompt_len = x.shape[1]
    return lambda i: model.generate(x, **options)[0, prompt_len:]


def graphs_compiled() -> int:
    """Graphs torch.compile has made in this process so far (dynamo's count)."""
    return counters["stats"]["unique_graphs"]


def check_compiled(name: str, graphs: int) -> None:
    """Refuse a compiled row that compiled nothing: transformers' generate, for one, falls back to eager without
    a word when its criteria for compiling are not met."""
    if graphs < 1:
        raise RuntimeError(f"the {name!r} row compiled no graph: it would have been timed eager")


def ours_plain_call(target, x, new_tokens: int):
    return lambda i: autoregressive_generate(target, x, max_new_tokens=new_tokens, sampling=GREEDY,
                                             ignore_eos=True, timed=False).tokens


def oracle_call(target, draft, x, reference, a: float, gamma: int, new_tokens: int):
    """A function of the call index: one speculative generation with an oracle of acceptance ``a``, seeded by
    the index (each timed call draws other acceptances)."""
    prompt_len = x.shape[1]
    return lambda i: speculative_generate(target, OracleDraft(draft, reference, prompt_len, a, seed=i), x,
                                          gamma=gamma, max_new_tokens=new_tokens, sampling=GREEDY, ignore_eos=True,
                                          timed=False)


# ------------------------------------------------------------------------------------------------ the rows
class RowWriter:
    """The run's CSV: the header at once, then each row appended and flushed as soon as it is measured (a run cut
    short keeps every row it finished); rows are also kept in ``rows`` and logged with their wall time."""

    def __init__(self, path: Path, log=print):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.log, self.rows, self.start = path, log, [], time.perf_counter()
        self.file = open(path, "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=COLUMNS)
        self.writer.writeheader()
        self.file.flush()

    def write(self, row: dict) -> dict:
        unknown = sorted(set(row) - set(COLUMNS))
        if unknown:
            raise ValueError(f"columns {unknown} are not in gpu_bench.COLUMNS")
        self.writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        self.file.flush()
        self.rows.append(row)
        self.log(describe(row) + f"  [{time.perf_counter() - self.start:.0f} s so far]")
        return row

    def close(self) -> None:
        self.file.close()


def describe(row: dict) -> str:
    """One printed line per row."""
    if row["status"] != "measured":
        return f"{row['row']}: {row['status']} ({row['note']})"
    text = (f"{row['row']}: {row['tokens/s']:.1f} tokens/s, {row['seconds']:.1f} s "
            f"({row['graphs compiled']} graphs compiled)")
    if "formula speedup" in row:
        text += (f"; acceptance {row['measured acceptance']:.2f}, {row['speedup over ours plain same path']:.2f}x "
                 f"over ours plain on this path (formula {row['formula speedup']:.2f}x at a, "
                 f"{row['formula at measured tokens/round']:.2f}x at the measured tokens/round), "
                 f"{row['speedup over fastest plain']:.2f}x over the fastest plain")
    elif "over generate eager" in row:
        text += f"; {row['over generate eager']:.2f}x generate eager"
    return text


PLAIN_ROWS = (  # (row, kind, path); the order they are measured in
    ("generate eager", "transformers", "eager-dynamic"),
    ("ours plain eager", "ours plain", "eager-dynamic"),
    ("ours plain static eager", "ours plain", "static-eager"),
    ("generate static compiled", "transformers", "static-compiled"),
    ("ours plain static compiled", "ours plain", "static-compiled"),
)
SAME_CACHE = {"ours plain eager": "generate eager", "ours plain static compiled": "generate static compiled"}


def plain_rows(target, draft, x, plan: Plan, common: dict, writer: RowWriter) -> dict:
    """The five plain rows; returns {row name: row}. Leaves both models on the static compiled path."""
    device, max_length = x.device, static_length(plan)
    rows = {}
    for name, kind, path in PLAIN_ROWS:
        start = time.perf_counter()
        set_path([target, draft], path, max_length)
        if kind == "transformers":
            call = generate_call(target, x, plan.new_tokens, static_compiled=path == "static-compiled")
        else:
            call = ours_plain_call(target, x, plan.new_tokens)
        compiled = path == "static-compiled"
        graphs = graphs_compiled()
        timing = time_calls(call, device, COMPILED_WARMUPS if compiled else 1, plan.repeats)
        graphs = graphs_compiled() - graphs
        if compiled:
            check_compiled(name, graphs)
        row = common | {"row": name, "kind": kind, "path": path, "status": "measured",
                        "seconds": time.perf_counter() - start, "graphs compiled": graphs,
                        "tokens/s": timing.tokens_per_s, "ms/token": 1000 / timing.tokens_per_s,
                        "output": timing.output}
        row["over generate eager"] = row["tokens/s"] / rows.get("generate eager", row)["tokens/s"]
        if name in SAME_CACHE:
            row["over generate same cache"] = row["tokens/s"] / rows[SAME_CACHE[name]]["tokens/s"]
        rows[name] = row
        writer.write({k: v for k, v in row.items() if k != "output"})
    return rows


def static_length(plan: Plan) -> int:
    """Tokens preallocated per row on the static path: the prompt, the new tokens, a round's overshoot."""
    return plan.prompt_len + plan.new_tokens + 2 * max(plan.gammas) + 8


@dataclass(frozen=True)
class Costs:
    """c = T_draft(1) / T_target(1) on the static compiled path, and T_target(1), which each v(gamma) =
    T_target(gamma + 1) / T_target(1) is measured against."""

    target_one: float  # seconds of one target decode step
    c: float


def measure_c(target, draft, x) -> Costs:
    target_one = forward_seconds(target, "target", 1, x)
    return Costs(target_one, forward_seconds(draft, "draft", 1, x) / target_one)


def oracle_row(target, draft, x, reference, a: float, gamma: int, costs: Costs, v: float, plain: dict,
               plan: Plan, common: dict) -> dict:
    """One oracle row: measured tokens/s and acceptance beside the formula's E[N] / (gamma c + v)."""
    start, graphs = time.perf_counter(), graphs_compiled()
    call = oracle_call(target, draft, x, reference, a, gamma, plan.new_tokens)
    timing = time_calls(call, x.device, COMPILED_WARMUPS, plan.repeats, count=lambda g: len(g.tokens))
    accepted = [n for g in timing.results for n in g.stats.accepted_lengths]
    proposed = [k for g in timing.results for k in g.stats.proposed_lengths]
    identical = all(torch.equal(g.tokens.cpu(), reference.cpu()) for g in timing.results)
    if not identical and target.dtype == torch.float32:  # promised in float32 only (docs/SPEED.md)
        raise AssertionError(f"greedy identity broken on the static compiled path at a = {a}, gamma = {gamma}")
    ours = plain["ours plain static compiled"]["tokens/s"]
    fastest = max(plain.values(), key=lambda r: r["tokens/s"])
    formula = theory.speedup(a, gamma, costs.c, v)
    tokens_per_round = sum(accepted) / len(accepted)
    return common | {
        "row": f"oracle a={a} gamma={gamma}", "kind": "ours speculative", "path": "static-compiled",
        "status": "measured", "seconds": time.perf_counter() - start, "graphs compiled": graphs_compiled() - graphs,
        "tokens/s": timing.tokens_per_s, "ms/token": 1000 / timing.tokens_per_s, "a": a, "gamma": gamma,
        "measured acceptance": pooled_acceptance(accepted, proposed), "tokens/round": tokens_per_round,
        "c": costs.c, "v(gamma)": v, "formula speedup": formula,
        "formula at measured tokens/round": tokens_per_round / (gamma * costs.c + v),
        "speedup over ours plain same path": timing.tokens_per_s / ours,
        "measured / formula": timing.tokens_per_s / ours / formula,
        "fastest plain": fastest["row"], "speedup over fastest plain": timing.tokens_per_s / fastest["tokens/s"],
        "greedy identical": identical}


def oracle_rows(target, draft, x, plain: dict, plan: Plan, common: dict, writer: RowWriter, started: float,
                clock=time.perf_counter) -> None:
    """Every (gamma, a) of the plan's gammas x acceptances, in that order, on the static compiled path; a gamma
    whose rows would overrun the time budget (``started`` + ``plan.budget_s`` on ``clock``, estimated by the
    previous gamma's wall time) is recorded as skipped."""
    reference = plain["ours plain static compiled"]["output"]
    start = clock()
    costs = measure_c(target, draft, x)
    writer.log(f"c = {costs.c:.3f} (target {1000 * costs.target_one:.2f} ms a step), measured in "
               f"{clock() - start:.1f} s (compiling the draft's step included)")
    previous = 0.0  # wall time of the last gamma's rows: the estimate for the next
    for gamma in plan.gammas:
        elapsed = clock() - started
        if elapsed + previous > plan.budget_s:
            for a in plan.acceptances:
                writer.write(skipped(common, f"oracle a={a} gamma={gamma}", "ours speculative", a=a, gamma=gamma,
                                     note=f"time budget: {elapsed:.0f} s spent, the last gamma took {previous:.0f} "
                                          f"s, the budget is {plan.budget_s:.0f} s (--budget-s)"))
            continue
        start = clock()
        v = forward_seconds(target, "target", gamma + 1, x) / costs.target_one
        writer.log(f"v({gamma}) = {v:.3f}, measured in {clock() - start:.1f} s (compiling the target's "
                   f"forward over {gamma + 1} tokens included)")
        for a in plan.acceptances:
            writer.write(oracle_row(target, draft, x, reference, a, gamma, costs, v, plain, plan, common))
        previous = clock() - start


def skipped(common: dict, name: str, kind: str, note: str, **fields) -> dict:
    return common | {"row": name, "kind": kind, "path": "static-compiled", "status": "skipped", "note": note} | fields


class OracleTree(Drafter):
    """A token tree of auto's kind with an oracle head: ``branches`` children of the root, a chain of gamma - 1
    under each (``branches`` x gamma nodes). With probability 1 - (1 - a)^branches one root child, drawn at random,
    is the target's next greedy token (``reference``), and the chain under it follows the reference with
    probability ``a`` a position; every other token is wrong. The head's own cost is left out (auto's EAGLE head is
    one decoder layer of the target's width); the cost is the target's tree forward. A point-mass draft."""

    proposes_trees = True

    def __init__(self, vocab_size: int, reference: torch.Tensor, prompt_len: int, a: float, branches: int = 3,
                 seed: int = 0):
        self.vocab_size, self.reference, self.prompt_len = vocab_size, reference.cpu().tolist(), prompt_len
        self.a, self.branches, self.rng = a, branches, torch.Generator().manual_seed(seed)

    def begin(self, input_ids: torch.Tensor, padding: list[int] | None = None, tokens: int | None = None) -> None:
        self.length = input_ids.shape[1]  # kept on the host (a GPU would wait for a read)

    def token(self, position: int, right: bool) -> int:
        want = self.reference[position] if position < len(self.reference) else 0
        if right:
            return want
        return (want + 1 + int(torch.randint(self.vocab_size - 1, (), generator=self.rng))) % self.vocab_size

    def draw(self, p: float) -> bool:
        return float(torch.rand((), generator=self.rng)) < p

    def propose_tree(self, seq, lengths, gamma, sampling, generator) -> Tree:
        start = self.length - self.prompt_len  # index of the next token in the reference
        builder = TreeBuilder(int(self.reference[start - 1]) if start > 0 else 0)
        hit = int(torch.randint(self.branches, (), generator=self.rng)) if self.draw(
            1 - (1 - self.a) ** self.branches) else -1
        for branch in range(self.branches):
            node, on_path = builder.add(0, self.token(start, branch == hit)), branch == hit
            for depth in range(1, gamma):
                on_path = on_path and self.draw(self.a)
                node = builder.add(node, self.token(start + depth, on_path))
        return builder.build()

    def rollback(self, kept) -> None:
        self.length = kept[0] + 1  # the caches keep all but the newest token (batch 1)


def auto_tree_row(target, x, reference, plain: dict, plan: Plan, common: dict, a: float = 0.8,
                  gamma: int = 4) -> dict:
    """auto's kind of tree (``OracleTree``: 3 branches x ``gamma``, 12 nodes, one ``TREE_ROWS`` budget) on the
    static compiled path at acceptance ``a``: tokens/s over ours plain on that path and over the fastest plain."""
    start, graphs = time.perf_counter(), graphs_compiled()
    vocab = target.config.vocab_size

    def call(i):
        return speculative_generate(target, OracleTree(vocab, reference, x.shape[1], a, seed=i), x, gamma=gamma,
                                    max_new_tokens=plan.new_tokens, sampling=GREEDY, ignore_eos=True, timed=False)

    timing = time_calls(call, x.device, COMPILED_WARMUPS, plan.repeats, count=lambda g: len(g.tokens))
    accepted = [n for g in timing.results for n in g.stats.accepted_lengths]
    identical = all(torch.equal(g.tokens.cpu(), reference.cpu()) for g in timing.results)
    if not identical and target.dtype == torch.float32:
        raise AssertionError(f"greedy identity broken by a tree on the static compiled path at a = {a}")
    ours = plain["ours plain static compiled"]["tokens/s"]
    fastest = max(plain.values(), key=lambda r: r["tokens/s"])
    return common | {
        "row": f"auto tree (oracle head) a={a} gamma={gamma}", "kind": "ours tree", "path": "static-compiled",
        "status": "measured", "seconds": time.perf_counter() - start, "graphs compiled": graphs_compiled() - graphs,
        "tokens/s": timing.tokens_per_s, "ms/token": 1000 / timing.tokens_per_s, "a": a, "gamma": gamma,
        "tokens/round": sum(accepted) / len(accepted),
        "speedup over ours plain same path": timing.tokens_per_s / ours,
        "fastest plain": fastest["row"], "speedup over fastest plain": timing.tokens_per_s / fastest["tokens/s"],
        "greedy identical": identical}


# ------------------------------------------------------------------------------------------------ the run
def check_plan(plan: Plan) -> None:
    """Refuse a plan that cannot run, saying why."""
    if plan.new_tokens < 1 or plan.repeats < 1 or plan.budget_s <= 0:
        raise ValueError(f"need new_tokens >= 1, repeats >= 1 and budget_s > 0, got {plan.new_tokens}, "
                         f"{plan.repeats}, {plan.budget_s}")
    if plan.prompt_len <= 16:
        raise ValueError(f"the prompt must be longer than 16 tokens (it runs eagerly), got {plan.prompt_len}")
    if not plan.gammas or any(not isinstance(g, int) or g < 1 for g in plan.gammas):
        raise ValueError(f"gammas must be integers >= 1, got {plan.gammas}")
    if not plan.acceptances or any(not 0 <= a <= 1 for a in plan.acceptances):
        raise ValueError(f"acceptances must lie in [0, 1], got {plan.acceptances}")


def run(device="cuda", shapes="gpu", dtype="auto", *, out: Path | str = "out/gpu_check", log=print,
        **overrides) -> list[dict]:
    """The whole benchmark for ``PAIRS[shapes]``: every row written to ``out``/gpu_check.csv as it is measured;
    returns the rows. ``overrides``: fields of ``Plan`` replacing the ``PLANS[shapes]`` values (None: kept)."""
    if shapes not in PAIRS:
        raise ValueError(f"unknown shapes {shapes!r}; choose from {sorted(PAIRS)}")
    unknown = sorted(set(overrides) - set(Plan.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown plan fields {unknown}; a plan has {list(Plan.__dataclass_fields__)}")
    plan = replace(PLANS[shapes], **{k: v for k, v in overrides.items() if v is not None})
    check_plan(plan)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    started = time.perf_counter()
    (target_shape, draft_shape), (target, draft) = PAIRS[shapes], make_pair(shapes, device, dtype)
    x = torch.randint(3, target.config.vocab_size, (1, plan.prompt_len), generator=torch.Generator().manual_seed(0))
    x = x.to(device)
    common = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
              "dtype": dtype_name(dtype), "target": target_shape, "draft": draft_shape,
              "prompt tokens": plan.prompt_len, "new tokens": plan.new_tokens, "repeats": plan.repeats}
    log(f"{target_shape} + {draft_shape} on {common['device']} in {common['dtype']}: {plan.new_tokens} new tokens, "
        f"{plan.repeats} timed calls a row, budget {plan.budget_s:.0f} s; models made in "
        f"{time.perf_counter() - started:.0f} s")
    writer = RowWriter(Path(out) / "gpu_check.csv", log)
    with benchmark_settings(device, plan):
        try:
            plain = plain_rows(target, draft, x, plan, common, writer)
            oracle_rows(target, draft, x, plain, plan, common, writer, started)
            reference = plain["ours plain static compiled"]["output"]
            writer.write(auto_tree_row(target, x, reference, plain, plan, common))
        finally:
            writer.close()
            set_path([target, draft], "eager-dynamic", 0)
    return writer.rows


def make_pair(shapes: str, device, dtype: torch.dtype) -> tuple:
    """(target, draft) of ``PAIRS[shapes]`` on ``device`` in ``dtype``, the target's greedy output unambiguous."""
    target_shape, draft_shape = PAIRS[shapes]
    target = make_greedy_unambiguous(random_llama(target_shape, device, dtype, seed=0))
    return target, random_llama(draft_shape, device, dtype, seed=1)


@contextmanager
def benchmark_settings(device: torch.device, plan: Plan):
    """torch's settings during a run, restored after: the plan's CPU threads (on a CPU), and room for a graph per
    shape each compiled forward sees (both models' graphs count, they share the forward's code: more than torch's
    default limit of 8), a hit limit, which would fall back to eager without a word, stopping the run."""
    threads = torch.get_num_threads()
    if device.type == "cpu" and plan.cpu_threads:
        torch.set_num_threads(plan.cpu_threads)
    try:
        with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
            yield
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------ the claims
def verdicts(rows: list[dict]) -> list[dict]:
    """The GPU path's three claims, from the rows: {"claim", "measured", "needed", "holds"} each; a claim whose rows
    are missing or skipped is reported as not measured (holds None)."""
    by_name = {r["row"]: r for r in rows if r["status"] == "measured"}

    def ratio(name, column):
        return by_name[name][column] if name in by_name else None

    oracle = f"oracle a={CLAIM_A} gamma={CLAIM_GAMMA}"
    closeness = None if oracle not in by_name else abs(by_name[oracle]["measured / formula"] - 1)
    checks = [("ours plain eager >= 1.0x generate eager", ratio("ours plain eager", "over generate same cache"),
               1.0, True),
              ("ours plain static compiled >= 1.0x generate static compiled",
               ratio("ours plain static compiled", "over generate same cache"), 1.0, True),
              ("ours plain static compiled >= 2.5x generate eager",
               ratio("ours plain static compiled", "over generate eager"), 2.5, True),
              (f"{oracle} >= 2.0x the fastest plain decoding", ratio(oracle, "speedup over fastest plain"), 2.0, True),
              (f"{oracle} within 15% of the formula (|measured / formula - 1|)", closeness, 0.15, False)]
    return [{"claim": claim, "measured": value, "needed": (">= " if at_least else "<= ") + f"{needed}",
             "holds": None if value is None else (value >= needed if at_least else value <= needed)}
            for claim, value, needed, at_least in checks]


def write_verdicts(checks: list[dict], path: Path, on_gpu: bool, log=print) -> Path:
    """Print the claims' verdicts and write them to ``path`` (CSV)."""
    log("the GPU path's claims" + ("" if on_gpu else " (made for GPUs: on a CPU for the record only)") + ":")
    for c in checks:
        verdict = "not measured" if c["holds"] is None else ("holds" if c["holds"] else "FAILS")
        log(f"  {c['claim']}: {'-' if c['measured'] is None else format(c['measured'], '.3f')} "
            f"(needed {c['needed']}): {verdict}")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["claim", "measured", "needed", "holds"])
        writer.writeheader()
        writer.writerows(checks)
    return path


def figure_rows(rows: list[dict]) -> list[dict]:
    """The rows ``figures.gpu_check`` draws, one per path of ``generate``: generate and ours plain on it, and on
    the static compiled path the oracle at gamma 4 with the formula's prediction (nan where not measured:
    transformers' assisted generation is not, and no oracle on the eager path)."""
    by_name = {r["row"]: r for r in rows if r["status"] == "measured"}
    nan = float("nan")
    out = []
    for generate, ours, path in (("generate eager", "ours plain eager", "eager-dynamic"),
                                 ("generate static compiled", "ours plain static compiled", "static-compiled")):
        if generate not in by_name or ours not in by_name:
            continue
        row = {k: by_name[ours][k] for k in ("target", "draft", "device", "dtype")} | {
            "path": path, "transformers generate tokens/s": by_name[generate]["tokens/s"],
            "transformers assisted tokens/s": nan, "ours autoregressive tokens/s": by_name[ours]["tokens/s"]}
        for a in {r["a"] for r in rows if r["kind"] == "ours speculative"}:
            oracle = by_name.get(f"oracle a={a} gamma={CLAIM_GAMMA}") if path == "static-compiled" else None
            row[f"speculative tokens/s a={a}"] = oracle["tokens/s"] if oracle else nan
            row[f"predicted speedup a={a}"] = oracle["formula speedup"] if oracle else nan
        out.append(row)
    return out


def write_figure(rows: list[dict], path: Path) -> Path | None:
    """Tokens/s of generate, ours plain and the oracle at gamma 4 (``figures.gpu_check``); None when matplotlib
    is not installed or nothing plain was measured."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from . import figures
    except ImportError:
        return None
    drawn = figure_rows(rows)
    if not drawn:
        return None
    acceptances = sorted({r["a"] for r in rows if r["kind"] == "ours speculative" and r["status"] == "measured"})
    figures.save(figures.gpu_check(drawn, acceptances), path, dpi=110, close=True)
    return path


def main(argv=None):
    """python -m specdec_lite.repro.gpu_bench: generate against ours, plain and speculative (oracle), on random
    Llama-shaped models; rows written as they are measured."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="gpu", choices=sorted(PAIRS),
                        help="gpu: Llama-3.1-8B + Llama-3.2-1B shapes; tiny: the CPU rehearsal (and smoke test)")
    parser.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    parser.add_argument("--new-tokens", type=int, help="new tokens per call (default: the plan's, 128 for gpu)")
    parser.add_argument("--repeats", type=int, help="timed calls per row (default: the plan's, 2)")
    parser.add_argument("--budget-s", type=float, help="seconds the benchmark may take (default: the plan's, 270 "
                                                       "for gpu); gammas that would overrun it are skipped")
    parser.add_argument("--out", default="out/gpu_check")
    args = parser.parse_args(argv)
    for name in ("new_tokens", "repeats", "budget_s"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    started = time.perf_counter()
    out = Path(args.out)
    rows = run(args.device, args.shapes, args.dtype, new_tokens=args.new_tokens, repeats=args.repeats,
               budget_s=args.budget_s, out=out)
    print("wrote", out / "gpu_check.csv")
    print("wrote", write_verdicts(verdicts(rows), out / "verdicts.csv", on_gpu=rows[0]["device"] != "CPU"))
    figure = write_figure(rows, out / "gpu_check.png")
    print("wrote", figure) if figure else print("no figure: matplotlib is not installed")
    print(f"gpu_bench took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
