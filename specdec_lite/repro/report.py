"""Tables for people: markdown renderings of result frames."""
from __future__ import annotations

import numpy as np
import pandas as pd


def to_markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table (no extra dependency)."""
    def cell(v):
        return f"{v:.{digits}f}" if isinstance(v, (float, np.floating)) else str(v)
    header = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])
