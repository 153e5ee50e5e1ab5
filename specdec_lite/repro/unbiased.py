"""The unbiasedness experiments of notebook 01 (claims C1-C4, C16, C17, C22): each returns the table the
notebook shows; the verdicts are in ``checks``.

Exact checks enumerate every branch of the loop (``exact``); statistical ones run the loop itself
(``speculative_generate``) on the toy pairs (``toy``) and test the emitted tokens by chi-square (``stats``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..core.decode import EXACT, Verifier
from ..generate import autoregressive_generate, speculative_generate
from ..core.sampling import SamplingParams
from . import articles, stats
from .exact import exact_speculative_distribution, exact_target_distribution, max_abs_difference
from .mutants import MUTANTS, NO_EXACT_LAW
from .toy import article000_pair, article004_pair, random_pair, truncated_top_k

CORRECT = "correct verifier"


def toy_pairs() -> dict:
    """The three toy (target, draft) pairs notebook 01 checks: article 000's, article 004's, and a pair far apart."""
    return {"article 000 (7 tokens)": article000_pair(), "article 004 (Dirichlet, 5 tokens)": article004_pair(),
            "far apart (Dirichlet 0.5, 6 tokens)": random_pair(6, 0.5, 0)}


def first_tokens(target, draft, n_samples: int, gamma: int, n_tokens: int, seed: int = 0,
                 sampling: SamplingParams = SamplingParams(), verifier: Verifier = EXACT) -> np.ndarray:
    """The first ``n_tokens`` tokens of ``n_samples`` runs of the loop after token 0 (one ragged batch):
    an (n_samples, n_tokens) array."""
    gen = speculative_generate(target, draft, torch.zeros(n_samples, 1, dtype=torch.long), gamma=gamma,
                               max_new_tokens=n_tokens, sampling=sampling, seed=seed, verifier=verifier,
                               ignore_eos=True)
    return torch.stack(gen.sequences).numpy()


def marginal_law(law: dict, positions) -> dict:
    """The law of the tokens at the given output positions (1-based) from a law over whole sequences."""
    out = {}
    for seq, p in law.items():
        key = tuple(seq[j - 1] for j in positions)
        out[key] = out.get(key, 0.0) + p
    return out


def exact_table(pairs: dict, settings: dict, cases=((1, 3), (2, 3), (3, 4))) -> pd.DataFrame:
    """max |speculative law - target law| of the first ``tokens`` tokens, for every pair, sampling setting and
    (gamma, tokens) case, by exact enumeration after token 0."""
    rows = []
    for pair_name, (t, d) in pairs.items():
        for setting, sampling in settings.items():
            for g, n in cases:
                spec = exact_speculative_distribution(t, d, [0], g, n, sampling)
                rows.append({"pair": pair_name, "sampling": setting, "gamma": g, "tokens": n,
                             "max |spec - target|": max_abs_difference(spec, exact_target_distribution(t, [0], n, sampling))})
    return pd.DataFrame(rows)


def mutation_check(target, draft, n_samples: int, sizes, gamma: int, n_tokens: int, level: float,
                   seed: int = 0, mutants: dict = MUTANTS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The chi-square test of the first ``n_tokens`` tokens against the target's exact law, for the correct
    verifier and each broken one: (p-value and max deviation against sample size, one row per verifier with
    the p-value at ``n_samples``, the test's power against that mutant's exact law, and whether it rejected)."""
    law = exact_target_distribution(target, [0], n_tokens)
    curves, rows = [], []
    for name, verifier in {CORRECT: EXACT, **mutants}.items():
        samples = first_tokens(target, draft, n_samples, gamma, n_tokens, seed, verifier=verifier)
        for n in sizes:
            curves.append({"verifier": name, "samples": n,
                           "p-value": max(stats.chi_square_pvalue(samples[:n], law), 1e-300),
                           "max deviation": max_abs_difference(stats.empirical_law(samples[:n]), law)})
        power = float("nan")
        if name not in NO_EXACT_LAW | {CORRECT}:
            broken_law = exact_speculative_distribution(target, draft, [0], gamma, n_tokens, verifier=verifier)
            power = stats.chi_square_power(law, broken_law, n_samples, level)
        rows.append({"verifier": name, "samples": n_samples, "p-value": stats.chi_square_pvalue(samples, law),
                     "power at this N": power})
    mutation = pd.DataFrame(rows)
    return pd.DataFrame(curves), mutation.assign(rejected=mutation["p-value"] < level)


def overlap_acceptance(target, draft, n: int, seed: int = 0) -> pd.DataFrame:
    """C2 on article 000's two-state pair: the exact overlap sum_x min(p, q) after token 0 and after any other,
    the loop's measured acceptance (gamma 1, ``n`` runs per state) and |z| = |measured - overlap| / standard error."""
    rows = []
    for context in range(2):
        overlap = torch.minimum(target.transition[context], draft.transition[context]).sum().item()
        gen = speculative_generate(target, draft, torch.full((n, 1), context), gamma=1, max_new_tokens=1,
                                   seed=seed + context, ignore_eos=True)
        measured = gen.stats.acceptance_rate
        se = (overlap * (1 - overlap) / n) ** 0.5
        rows.append({"after token": "0" if context == 0 else "1..6", "overlap (exact)": overlap,
                     "acceptance (measured)": measured, "|z|": abs(measured - overlap) / se})
    return pd.DataFrame(rows)


def _first_token_law(gen) -> dict:
    return stats.empirical_law(torch.stack(gen.sequences).numpy())


def article000_rerun(target, draft, n: int, seed: int = 0, null_repeats: int = 5) -> tuple[float, float, pd.DataFrame]:
    """Article 000's numerical check with the package's loop: KL and max deviation between ``n`` direct and
    ``n`` speculative (gamma 4) first tokens after token 0, and the same two statistics between pairs of
    independent direct samples (the yardstick), one row per repeat: (kl, max deviation, yardstick)."""
    prompt = torch.zeros(n, 1, dtype=torch.long)
    first = dict(max_new_tokens=1, ignore_eos=True)
    h_direct = _first_token_law(autoregressive_generate(target, prompt, seed=seed + 10, **first))
    h_spec = _first_token_law(speculative_generate(target, draft, prompt, gamma=4, seed=seed + 11, **first))
    null = []
    for r in range(null_repeats):
        la = _first_token_law(autoregressive_generate(target, prompt, seed=seed + 100 + 2 * r, **first))
        lb = _first_token_law(autoregressive_generate(target, prompt, seed=seed + 101 + 2 * r, **first))
        null.append({"KL": stats.kl_divergence(la, lb), "max deviation": max_abs_difference(la, lb)})
    return stats.kl_divergence(h_direct, h_spec), max_abs_difference(h_direct, h_spec), pd.DataFrame(null)


def article000_listing_pvalues(target, runs: int, seed: int = 0, positions=(4, 5)) -> dict:
    """Chi-square p-values of article 000's listing (re-implemented) at the given output positions against
    the target's exact law there: {"as published": p, "bonus from position gamma+1": p}."""
    law = marginal_law(exact_target_distribution(target, [0], max(positions)), positions)
    return {name: stats.chi_square_pvalue(articles.article000_tokens_at(runs, list(positions), seed=seed + i,
                                                                        fixed=fixed), law)
            for i, (name, fixed) in enumerate([("as published", False), ("bonus from position gamma+1", True)])}


def round_bounds(target, draft, gammas=(1, 2, 4, 8), runs: int = 5000, tokens: int = 24, seed: int = 0) -> pd.DataFrame:
    """C4: the fewest and most tokens any round emitted, over ``runs`` runs of ``tokens`` tokens, per gamma."""
    rows = []
    for g in gammas:
        gen = speculative_generate(target, draft, torch.zeros(runs, 1, dtype=torch.long), gamma=g,
                                   max_new_tokens=tokens, seed=seed, ignore_eos=True)
        lengths = np.array(gen.stats.accepted_lengths)
        rows.append({"gamma": g, "min": int(lengths.min()), "max": int(lengths.max()), "rounds": len(lengths)})
    return pd.DataFrame(rows)


def truncation_table(pairs: dict, ks=(2, 3), gamma: int = 2, tokens: int = 3) -> pd.DataFrame:
    """C17: total variation between the target's law of the first ``tokens`` tokens and the loop's when the
    target is truncated to its top-k for verification only (exact enumeration, rounded to 4 places)."""
    rows = []
    for pair_name, (t, d) in pairs.items():
        target_law = exact_target_distribution(t, [0], tokens)
        for k in ks:
            spec = exact_speculative_distribution(truncated_top_k(t, k), d, [0], gamma, tokens)
            tv = 0.5 * sum(abs(spec.get(s, 0) - v) for s, v in target_law.items())
            rows.append({"pair": pair_name, "verify with target top-k": k, "total variation to the target": round(tv, 4)})
    return pd.DataFrame(rows)


def article004_leak_table(leaks=(0.0, 0.05, 0.1, 0.2, 0.4), level: float = 1e-3, steps: int = 20000,
                          gamma: int = 5) -> pd.DataFrame:
    """C22: article 004's check (rerun faithfully) on its loop and on variants that accept a fraction ``leak``
    of draft tokens unchecked, with a chi-square on the same transition counts."""
    frame = pd.DataFrame([{"leak": leak, **articles.article004_check(steps=steps, gamma=gamma, leak=leak)}
                          for leak in leaks])
    return frame.assign(chi_square_rejects=frame.chi_square_pvalue < level)


def real_first_token(target_model, draft_model, prompt_ids: torch.Tensor, runs: int, gamma: int,
                     seed: int = 0) -> tuple[float, torch.Tensor]:
    """C1 on a real pair: the first emitted token of ``runs`` batch-1 runs at temperature 1 against the target's
    next-token law (one forward), by chi-square with sparse tokens merged: (p-value, the target's law)."""
    with torch.inference_mode():
        p_next = target_model(input_ids=prompt_ids).logits[0, -1].float().softmax(-1).cpu().double()
    law = {(i,): float(v) for i, v in enumerate(p_next) if v > 0}
    firsts = np.array([[int(speculative_generate(target_model, draft_model, prompt_ids, gamma=gamma, max_new_tokens=1,
                                                 sampling=SamplingParams(temperature=1.0), seed=seed + i,
                                                 ignore_eos=True).tokens[0])]
                       for i in range(runs)])
    return stats.chi_square_pvalue(firsts, law), p_next
