"""Claim rows: the claims C1..C22 (listed in docs/CLAIMS.md, their sources in docs/SOURCES.md) and their verdicts.

Each notebook ends with the claims it checked: the article's figure, ours, a verdict computed from the
measurement with a stated tolerance, and a one-line reason. Its cells add rows to its ``ClaimSheet`` (one row
per check, the last one wins, so a cell run again replaces its row), which writes
``data/results/claims_<notebook>.csv``; ``04_claims`` gathers them into ``claims.csv`` (one verdict per claim)
and ``report.write_results`` turns the CSVs into docs/RESULTS.md.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from .. import paths

VERDICTS = ("reproduces", "differs", "not testable here")


@dataclass(frozen=True)
class Claim:
    """One claim of the source articles, in short (docs/CLAIMS.md has the longer wording)."""

    id: str  # C1..C22
    articles: str  # source article ids, e.g. "000, 002"
    statement: str  # what the article asserts, in short
    notebook: str  # the notebook that checks it


_N01, _N02, _N03 = "01_unbiasedness", "02_speedup_table", "03_task_acceptance"
CLAIMS: dict[str, Claim] = {c.id: c for c in [
    Claim("C1", "000, 002, 004", "speculative sampling leaves the output law exactly the target's, whatever the draft",
          _N01),
    Claim("C2", "000", "the chance of accepting a drafted token is the overlap sum_x min(p(x), q(x))", _N01),
    Claim("C3", "000", "on article 000's 7-token toy model, 200k speculative samples match 200k direct ones "
          "(its KL and maximum-deviation figures); is its listing itself unbiased?", _N01),
    Claim("C4", "000", "a round emits at least 1 and at most gamma + 1 tokens", _N01),
    Claim("C5", "000", "the formulas for E[N] and the speedup, and the article's 4x4 speedup table", _N02),
    Claim("C6", "000", "alpha 0.5 -> 0.8 doubles the speedup; an optimal gamma exists (5-6 at c = 0.1); a cheaper "
          "draft gives steeper gains", _N02),
    Claim("C7", "004", "as gamma grows without bound, E[N] approaches alpha / (1 - alpha)", _N02),
    Claim("C8", "002", "K = 4 at acceptance 0.8: mean accepted length 3.2, speedup about 2.3 (draft at 1/10 of the "
          "target's cost) or 1.8 (at 1/5)", _N02),
    Claim("C9", "002", "the customer-service example (200 tokens, K = 8): about 3.7x at acceptance 0.7, 1.3x at 0.3",
          _N02),
    Claim("C10", "002", "a draft at 1/20 of the target's cost pays off from acceptance 0.2; at 1/5 it needs more "
          "than 0.5", _N02),
    Claim("C11", "003", "per-task acceptance and speedup on an A100 (code, summarization, dialogue, translation): "
          "the more predictable the output, the higher the acceptance", _N03),
    Claim("C12", "003", "80% of 4 drafted tokens accepted gives about 3x", _N02),
    Claim("C13", "000", "below acceptance 0.6 speculation is not worth enabling; gamma 4-6 is the sweet spot", _N02),
    Claim("C14", "000, 003", "short outputs (a few dozen tokens) gain almost nothing", _N03),
    Claim("C15", "000, 002, 003", "at large batch the gain shrinks or reverses (compute-bound)", _N03),
    Claim("C16", "000", "mismatched sampling settings cut acceptance; penalties break unbiasedness unless handled",
          _N01),
    Claim("C17", "002", "truncating the target to its top-k for verification breaks exactness", _N01),
    Claim("C18", "002", "later positions are harder to predict: acceptance falls along long outputs", _N03),
    Claim("C19", "000, 002, 003", "one target forward over gamma + 1 tokens costs about one decode step", _N02),
    Claim("C20", "000", "batch-1 decoding is memory-bound: the per-token floor is weight bytes over memory bandwidth "
          "(7B fp16: about 7 ms on an A100, 4.2 ms on an H100)", _N02),
    Claim("C21", "000, 002", "published speedups: Leviathan et al., Medusa, EAGLE, DeepSeek MTP, vLLM in production",
          _N03),
    Claim("C22", "004", "the article's demo shows losslessness by speculative error <= 3 x direct error", _N01),
]}
ALL_CLAIMS = list(CLAIMS)


@dataclass
class ClaimRow:
    claim: str  # C1..C22
    source: str  # article file(s), e.g. "000"
    expected: str  # the article's figure or statement, in short
    measured: str  # ours
    verdict: str  # one of VERDICTS
    reason: str  # one line: tolerance and why

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


def verdict(holds: bool) -> str:
    """'reproduces' when the stated check holds, 'differs' otherwise."""
    return "reproduces" if holds else "differs"


def write_claims(rows: list[ClaimRow], name: str, results_dir: Path | None = None,
                 context: dict | None = None) -> pd.DataFrame:
    """Write a notebook's claim rows to ``claims_<name>.csv``; ``context`` (e.g. target, draft, dtype) is added
    to every row."""
    frame = pd.DataFrame([asdict(r) for r in rows]).assign(**(context or {}))
    results_dir = Path(results_dir or paths.results_dir())
    results_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(results_dir / f"claims_{name}.csv", index=False)
    return frame


class ClaimSheet:
    """A notebook's claim rows, one per check: a check is a claim and its source ("C1" on the toy models and "C1"
    on the real pair are two). Adding a check again replaces its row where it stands, so cells can be re-run in
    any order and the sheet stays what one clean run gives."""

    def __init__(self, notebook: str, results_dir: Path, context: dict):
        self.notebook, self.results_dir, self.context = notebook, Path(results_dir), dict(context)
        self.rows: dict[tuple[str, str], ClaimRow] = {}

    def add(self, *rows: ClaimRow) -> None:
        for row in rows:
            self.rows[(row.claim, row.source)] = row

    def missing(self) -> list[str]:
        """The claims this notebook checks (``CLAIMS``) that have no row yet."""
        have = {claim for claim, _ in self.rows}
        return [cid for cid, c in CLAIMS.items() if c.notebook == self.notebook and cid not in have]

    def write(self) -> pd.DataFrame:
        """Write ``claims_<notebook>.csv``; refused while a claim of this notebook has no row (after a kernel
        restart, say), so a partial table never replaces a whole one."""
        if self.missing():
            raise ValueError(f"claims {', '.join(self.missing())} have no row in this kernel yet: run their cells "
                             "first (Run All)")
        return write_claims(list(self.rows.values()), self.notebook, self.results_dir, self.context)


_SHEETS: dict[tuple, ClaimSheet] = {}


def claim_sheet(notebook: str, results_dir: Path, context: dict | None = None) -> ClaimSheet:
    """The claim sheet of ``notebook`` writing to ``results_dir`` with ``context``: the same one every time in
    this process, so running a notebook's set-up cell again keeps the rows its other cells added."""
    context = dict(context or {})
    key = (notebook, str(results_dir), tuple(sorted(context.items())))
    return _SHEETS.setdefault(key, ClaimSheet(notebook, results_dir, context))


# C21 lists other papers' published numbers: nothing here can measure them (docs/CLAIMS.md: cite only).
C21 = ClaimRow("C21", "000, 002", "published: Leviathan 2-2.5x (T5-XXL), Medusa 2.3-3.6x, EAGLE 3-4x, DeepSeek MTP "
               "1.8-2.1x, vLLM 1.7-2.2x", "cited only", "not testable here",
               "needs those models and GPUs; our own measured speedups are in 02 and 03")


def gather(results_dir: Path | None = None) -> pd.DataFrame:
    """One row per claim C1..C22 from every notebook's claims_*.csv. A claim checked in several places is
    'reproduces' only if every check reproduces; a claim no notebook checked is 'not testable here'."""
    frames = [pd.read_csv(p, dtype=str, keep_default_na=False)
              for p in sorted(Path(results_dir or paths.results_dir()).glob("claims_*.csv"))]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(ClaimRow.__annotations__))
    out = []
    for claim in ALL_CLAIMS:
        found = rows[rows.claim == claim]
        if claim == "C21" and found.empty:
            out.append(asdict(C21))
        elif found.empty:
            out.append(asdict(ClaimRow(claim, "", "", "", "not testable here", "no notebook has checked it yet")))
        else:
            verdicts = set(found.verdict)
            overall = "differs" if "differs" in verdicts else (
                "reproduces" if "reproduces" in verdicts else "not testable here")
            out.append({"claim": claim, "source": "; ".join(dict.fromkeys(found.source)),
                        "expected": found.expected.iloc[0], "measured": " | ".join(found.measured),
                        "verdict": overall, "reason": " | ".join(found.reason)})
    return pd.DataFrame(out)
