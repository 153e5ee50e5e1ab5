"""The tables of notebook 02 (claims C5-C10, C12, C13, C19, C20): the closed forms of ``theory`` laid out as
the articles print them, the loop's simulation beside them, and the real pair's predicted against measured
speedup. The verdicts are in ``checks``."""
from __future__ import annotations

import pandas as pd
import torch

from ..generate import speculative_generate
from . import theory
from .toy import constant_alpha_pair

ARTICLE002_C8 = ((0.1, 2.3), (0.2, 1.8))  # (draft cost, printed speedup) at K 4, acceptance 0.8
ARTICLE002_C9 = ((0.7, 6.6, 3.7), (0.3, 2.4, 1.3))  # (acceptance, printed tokens/round, printed speedup) at K 8


def simulate_speedup(alpha: float, gamma: int, c: float, v: float = 1.0, rows: int = 20_000, tokens: int = 64,
                     seed: int = 0) -> float:
    """The speedup the loop itself achieves on the constant-alpha toy pair under the cost model
    (one draft step = c, one verification = v, one baseline step = 1): tokens / (rounds * (gamma c + v))."""
    target, draft = constant_alpha_pair(alpha)
    gen = speculative_generate(target, draft, torch.zeros(rows, 1, dtype=torch.long), gamma=gamma,
                               max_new_tokens=tokens, seed=seed, ignore_eos=True)
    return gen.stats.mean_accepted_length / (gamma * c + v)


def article000_table(tolerance: float = 0.006) -> pd.DataFrame:
    """Article 000's 16 printed cells beside the formula (rounded to 3 places) and whether they match."""
    table = pd.DataFrame(theory.article000_comparison(), columns=["alpha", "c", "gamma", "article", "formula"])
    table["formula"] = table["formula"].round(3)
    table[f"matches ({tolerance})"] = (table.article - table.formula).abs() <= tolerance
    return table


def simulated(table: pd.DataFrame, rows: int, tokens: int = 48, seed: int = 0) -> list:
    """The loop's speedup on the constant-alpha toy pair for each (alpha, c, gamma) row of ``table``."""
    return [simulate_speedup(a, g, c, rows=rows, tokens=tokens, seed=seed)
            for a, c, g in zip(table.alpha, table.c, table.gamma)]


def wide_table(alphas, cs, gammas=range(1, 11)) -> pd.DataFrame:
    """Expected speedup (v = 1) for every alpha, c and gamma."""
    return pd.DataFrame([{"alpha": a, "c": c, "gamma": g, "speedup": theory.speedup(a, g, c)}
                         for c in cs for a in alphas for g in gammas])


def optimal_table(alphas=(0.5, 0.6, 0.7, 0.8, 0.9), cs=(0.05, 0.1)) -> pd.DataFrame:
    """The best gamma and its speedup (2 places) for each alpha and c (v = 1)."""
    return pd.DataFrame([{"alpha": a, "c": c, "best gamma": theory.best_gamma(a, c),
                          "speedup": round(theory.speedup(a, theory.best_gamma(a, c), c), 2)}
                         for a in alphas for c in cs])


def limits_table(alphas=(0.5, 0.7, 0.9), gamma: int = 200) -> pd.DataFrame:
    """E[N] at a large gamma beside its limit 1/(1-alpha) and article 004's alpha/(1-alpha)."""
    return pd.DataFrame([{"alpha": a, f"E[N] at gamma {gamma}": round(theory.expected_tokens(a, gamma), 4),
                          "1/(1-alpha)": round(1 / (1 - a), 4), "article: alpha/(1-alpha)": round(a / (1 - a), 4)}
                         for a in alphas])


def article002_c8_table(alpha: float = 0.8, gamma: int = 4) -> pd.DataFrame:
    """Article 002's worked example (C8): its speedups and mean accepted length beside the formula's."""
    en = theory.expected_tokens(alpha, gamma)
    return pd.DataFrame([{"draft cost": c, "article speedup": s, "article A": round(gamma * alpha, 2),
                          "E[N]": round(en, 3), "formula speedup": round(theory.speedup(alpha, gamma, c), 3)}
                         for c, s in ARTICLE002_C8])


def article002_c9_table(sim_rows: int, seed: int = 0, gamma: int = 8, tokens: int = 200) -> pd.DataFrame:
    """Article 002's latency example (C9): ``theory.latency_example`` for each acceptance, rounded as printed,
    beside the article's numbers and the loop's simulated speedup (c = 0.1, v = 1)."""
    rows = []
    for alpha, art_tokens, art_speedup in ARTICLE002_C9:
        ex = theory.latency_example(alpha, gamma, tokens)
        rows.append({"acceptance": alpha, "article tokens/round": art_tokens, "E[N]": round(ex["E[N]"], 2),
                     "rounds": round(ex["rounds"], 1), "latency ms": round(ex["latency ms"], 0),
                     "speedup": round(ex["speedup"], 2), "article speedup": art_speedup,
                     "simulated speedup": round(simulate_speedup(alpha, gamma, 0.1, 1.0, rows=max(sim_rows // 10, 500),
                                                                        tokens=tokens, seed=seed), 2)})
    return pd.DataFrame(rows)


def break_even_table(cs=(0.05, 0.2)) -> pd.DataFrame:
    return pd.DataFrame([{"c": c, "break-even alpha (v = 1)": round(theory.break_even_alpha(c), 3)} for c in cs])


def break_even_curves(cs, vs=(1.0, 1.3, 1.7), resolution: int = 401) -> pd.DataFrame:
    """The smallest alpha that pays off at the best gamma, against c, for several verification costs v."""
    return pd.DataFrame([{"c": c, "v": f"v = {v}", "break-even alpha": theory.break_even_alpha(c, v, resolution=resolution)}
                         for v in vs for c in cs])


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def predicted_vs_measured(spec_runs: pd.DataFrame, costs) -> pd.DataFrame:
    """Per gamma: the median alpha and measured speedup of ``spec_runs`` (rows of ``evaluate.run_prompts``
    for the speculative methods, column gamma) over plain decoding of the same configuration ('measured', what
    the formula speaks of) and over the fastest plain decoding of the run ('measured over the fastest plain'),
    and the speedup the formula predicts from that alpha with this machine's c and v(gamma) (``costs.Costs``),
    and with v = 1."""
    by_gamma = spec_runs.groupby("gamma").agg(
        alpha=("alpha", "median"), measured=("speedup_same_config", "median"),
        **{"measured over the fastest plain": ("speedup", "median")}).reset_index()
    by_gamma["predicted"] = [theory.speedup(a, g, costs.c, costs.v[g]) for a, g in zip(by_gamma.alpha, by_gamma.gamma)]
    by_gamma["predicted (v = 1)"] = [theory.speedup(a, g, costs.c) for a, g in zip(by_gamma.alpha, by_gamma.gamma)]
    return by_gamma


def position_means(spec_runs: pd.DataFrame, gamma: int) -> pd.Series:
    """Mean acceptance at each draft position (columns accept_pos1..gamma) of the runs at that gamma."""
    return spec_runs[spec_runs.gamma == gamma][[f"accept_pos{i}" for i in range(1, gamma + 1)]].mean()

