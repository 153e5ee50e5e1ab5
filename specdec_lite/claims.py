"""Claim rows: each notebook ends with the claims it checked (C1..C22 of ../shared/CLAIMS.md), the article's
figure, ours, a verdict computed from the measurement with a stated tolerance, and a one-line reason.
Rows are written to ``data/results/claims_<notebook>.csv``; ``04_claims`` gathers them."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

VERDICTS = ("reproduces", "differs", "not testable here")
RESULTS_DIR = Path(__file__).resolve().parents[1] / "data" / "results"


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


def write_claims(rows: list[ClaimRow], name: str, results_dir: Path = RESULTS_DIR) -> pd.DataFrame:
    frame = pd.DataFrame([asdict(r) for r in rows])
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(results_dir / f"claims_{name}.csv", index=False)
    return frame
