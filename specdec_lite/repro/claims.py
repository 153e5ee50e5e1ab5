"""Claim rows: each notebook ends with the claims it checked (C1..C22 of ../shared/CLAIMS.md), the article's
figure, ours, a verdict computed from the measurement with a stated tolerance, and a one-line reason.
Rows are written to ``data/results/claims_<notebook>.csv``; ``04_claims`` gathers them."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from .. import paths

VERDICTS = ("reproduces", "differs", "not testable here")


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


def write_claims(rows: list[ClaimRow], name: str, results_dir: Path | None = None) -> pd.DataFrame:
    frame = pd.DataFrame([asdict(r) for r in rows])
    results_dir = Path(results_dir or paths.results_dir())
    results_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(results_dir / f"claims_{name}.csv", index=False)
    return frame


ALL_CLAIMS = [f"C{i}" for i in range(1, 23)]
# C21 lists other papers' published numbers: nothing here can measure them (CLAIMS.md: cite only).
C21 = ClaimRow("C21", "000, 002", "published: Leviathan 2-2.5x (T5-XXL), Medusa 2.3-3.6x, EAGLE 3-4x, DeepSeek MTP "
               "1.8-2.1x, vLLM 1.7-2.2x", "cited only", "not testable here",
               "needs those models and GPUs; our own measured speedups are in 02 and 03")
README_START, README_END = "<!-- claims:start -->", "<!-- claims:end -->"


def gather(results_dir: Path | None = None) -> pd.DataFrame:
    """One row per claim C1..C22 from every notebook's claims_*.csv. A claim checked in several places is
    'reproduces' only if every check reproduces; a claim no notebook checked is 'not testable here'."""
    frames = [pd.read_csv(p, dtype=str, keep_default_na=False) for p in sorted(Path(results_dir or paths.results_dir()).glob("claims_*.csv"))]
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


def readme_section(table: pd.DataFrame) -> str:
    lines = [README_START, "| claim | article | expected | measured here | verdict | why |", "| --- | --- | --- | --- | --- | --- |"]
    for r in table.itertuples(index=False):
        cells = [str(v).replace("|", "/").replace("\n", " ") for v in
                 (r.claim, r.source, r.expected, r.measured, f"**{r.verdict}**", r.reason)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [README_END])


def update_readme(readme: Path, table: pd.DataFrame) -> None:
    """Replace the README's claims section (between the markers) with the table."""
    text = Path(readme).read_text()
    if README_START not in text or README_END not in text:
        raise ValueError(f"{readme} has no claims section: add the lines {README_START} and {README_END}")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    Path(readme).write_text(head + readme_section(table) + tail)
