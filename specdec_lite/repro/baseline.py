"""The baseline of every speedup this package reports: the fastest plain decoding of the same target on the
same machine, measured in the same run.

The candidates are plain autoregressive decoding by ours (``autoregressive_generate``) and by transformers'
``generate``, each in float32 and in each half precision the device runs, native or emulated
(``tuning.devices.plain_dtypes``: on a CPU without native bfloat16, plain decoding can be faster in emulated half
precision than in float32), on the model as it loads (not made batch-invariant, default attention), and, in each
dtype whose linear layers ours packs for oneDNN (``tuning.packed_linear``), also as transformers loads it (so the
rule's "transformers' generate" on the unchanged model is always among the candidates), and, for the embedded
target on a CPU with native bfloat16, in bfloat16 on the 4-bit blocks its GGUF stores (``tuning.int4``). Every
candidate is timed on the same prompts as the methods it is compared with, warmed up first, with the same number
of new tokens (EOS is ignored while timing). The baseline is the candidate with the lowest median time per token
over the prompts; a method's speedup on a prompt is the baseline's time per token on that prompt over the
method's. The speedup over the run's own configuration (ours, plain, same model and dtype: the method row
"autoregressive") stands beside it as ``speedup_same_config``.
"""
from __future__ import annotations

import pandas as pd
import torch

from ..core.models import load_model
from ..names import is_embedded_target
from ..tuning.batch_invariance import is_batch_invariant
from ..tuning.devices import dtype_name, plain_dtypes
from ..tuning.int4 import has_int4_linears, int4_supported
from ..tuning.packed_linear import can_pack, kept_unpacked

SAME_CONFIG = "autoregressive"  # the method row of plain decoding by ours on the run's own target
OWN_PLAIN = (SAME_CONFIG, "transformers generate")  # plain decoding rows of the run's own target (unlabelled)
UNPACKED = " unpacked"  # the name's mark of a model with the linear layers transformers loads (no oneDNN packing)
INT4 = " int4"  # ... and of one whose linear layers run on their 4-bit blocks


def plain_configurations(device: torch.device, name: str = "") -> list[dict]:
    """``load_model`` settings (dtype, packed_linears, int4) of every plain configuration that is a baseline
    candidate for the model ``name`` on ``device``: each dtype of ``plain_dtypes`` as it loads, each dtype whose
    linear layers ours packs also as transformers loads it, and the embedded target on its 4-bit blocks in bfloat16
    wherever torch's 4-bit kernel runs: on CPUs without native bfloat16 too, where a decode step reads a quarter of
    bfloat16's bytes and can be the fastest plain decoding (docs/INT4.md)."""
    dtypes = plain_dtypes(device)
    configs = [dict(dtype=dtype, packed_linears=None, int4=False) for dtype in dtypes]
    configs += [dict(dtype=dtype, packed_linears=False, int4=False) for dtype in dtypes if can_pack(device, dtype)]
    if is_embedded_target(name) and not int4_supported(device, torch.bfloat16):
        configs.append(dict(dtype=torch.bfloat16, packed_linears=None, int4=True))
    return configs


def configuration_name(dtype, int4: bool = False, unpacked: bool = False, batch_invariant: bool = False) -> str:
    """The name of a way to run the model, as the baseline's name says it: its dtype, and whether it was made
    batch-invariant, runs its linear layers on 4-bit blocks (``INT4``) or keeps those transformers loads where ours
    packs them (``UNPACKED``)."""
    if batch_invariant:
        return dtype_name(dtype) + " batch-invariant"
    return dtype_name(dtype) + (INT4 if int4 else "") + (UNPACKED if unpacked else "")


def label(config: dict) -> str:
    """The name ``configuration`` gives a model loaded with ``config`` (``plain_configurations``), before loading."""
    return configuration_name(config["dtype"], config["int4"], config["packed_linears"] is not None)


def plain_candidates(target, limit: int | None = None) -> dict:
    """{configuration: model} of the other plain configurations to time beside ``target``
    (``plain_configurations``: the same weights, each loaded anew), except the one ``target`` itself is (when it
    is plain, its own rows are candidates). A configuration whose copy does not fit in memory is left out.
    ``limit``: at most that many, in ``plain_configurations``' order (a smoke run times one: it checks that the
    comparison runs, not which configuration wins)."""
    device, name = target.get_input_embeddings().weight.device, target.config._name_or_path
    own = configuration(target)
    out = {}
    for config in plain_configurations(device, name):
        if label(config) == own:
            continue
        if limit is not None and len(out) >= limit:
            break
        try:
            out[label(config)], _ = load_model(name, device, **config)
        except (MemoryError, torch.OutOfMemoryError):
            continue
    return out


def fastest(runs: pd.DataFrame) -> str:
    """The candidate row name (``runs.plain``) with the lowest median seconds per token over its prompts."""
    plain = runs[runs["plain"]]
    if plain.empty:
        raise ValueError("no plain decoding was timed in these runs: nothing to measure a speedup against")
    return (plain["seconds"] / plain["new_tokens"]).groupby(plain["method"]).median().idxmin()


def configuration(model) -> str:
    """How a loaded model runs (``configuration_name``)."""
    return configuration_name(model.dtype, has_int4_linears(model), kept_unpacked(model), is_batch_invariant(model))


def over_fastest(runs: pd.DataFrame, own: str = "") -> pd.DataFrame:
    """``runs`` with, per temperature, ``baseline`` (the fastest candidate's name; ``own``, the run's own
    configuration, is added to the names of its rows) and ``speedup`` (the baseline's seconds per token on the
    same prompt over the row's)."""
    runs = runs.copy()
    for _, at in runs.groupby("temperature", sort=False):
        name = fastest(at)
        runs.loc[at.index, "baseline"] = f"{name}, {own}" if own and name in OWN_PLAIN else name
        runs.loc[at.index, "speedup"] = speedup_over(at, name)
    return runs


def add_speedups(runs: pd.DataFrame, own: str) -> pd.DataFrame:
    """``over_fastest``, and ``speedup_same_config``: the same ratio against ours, plain, on the run's own
    configuration (the row named ``SAME_CONFIG``)."""
    runs = over_fastest(runs, own)
    for _, at in runs.groupby("temperature", sort=False):
        runs.loc[at.index, "speedup_same_config"] = speedup_over(at, SAME_CONFIG)
    return runs


def speedup_over(at: pd.DataFrame, method: str) -> pd.Series:
    """Per row of ``at`` (one temperature): ``method``'s seconds per token on the row's prompt over the row's."""
    rows = at[at["method"] == method]
    reference = (rows["seconds"] / rows["new_tokens"]).set_axis(rows["id"])
    return at["id"].map(reference) / (at["seconds"] / at["new_tokens"])
