"""Costs measured on this machine, kept: one JSON file per machine and setting under ``paths.cost_profiles_dir()``
(``cost_profiles/`` in the cache, ``$SPECDEC_LITE_CACHE`` or ``~/.cache/specdec_lite``; never tracked), so a later
load reads them instead of timing again.

A profile is keyed by everything that changes what it measures: the processor (the CPU's model name, or the CUDA
device's name), torch's thread count, the device type, the dtype, the torch version, whether the linear layers run
packed (``tuning.packed_linear``) or on 4-bit blocks (``tuning.int4``), the KV cache (dynamic, or static with its
length and compilation), the model's class, size and attention implementation, and whatever the caller adds (the
draft's shape, its settings, how many timings). The file's name holds a digest of the key and the file the key
itself, which must match on reading.

To measure again: delete the file (or the whole folder), or pass ``remeasure=True`` where the caller offers it
(``drafts.trees.measured_dynamic_tree``). A file that cannot be read, or one written in another ``FORMAT``, is
measured again, and the reason printed. A profile keeps how busy the machine was as it was measured (the load
average and the CPU count): costs timed while other work shared the cores are those of a loaded machine, and the
line printed on measuring and on every reading says so.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import torch

from ..paths import cost_profiles_dir
from ..core.lm import model_device, static_state
from ..tuning.int4 import has_int4_linears
from ..tuning.packed_linear import has_packed_linears

FORMAT = 1  # the layout of a profile file and the way it is measured: raise it when either changes
CONTEXT = ("measured_at", "load_average", "cpus")  # kept with every profile: when (UTC), and how busy the machine was


def processor_name(device: torch.device) -> str:
    """The processor that runs ``device``: the CUDA device's name, or the CPU's model name (``/proc/cpuinfo`` on
    Linux; else what ``platform`` knows)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown processor"


def machine_settings(model: torch.nn.Module) -> dict:
    """What, besides the model's shape, changes its measured costs here: the processor, torch's threads, the
    device type, the dtype, the torch version, packed or 4-bit linear layers and the KV cache."""
    device, static = model_device(model), static_state(model)
    cache = "dynamic"
    if static is not None:
        cache = f"static, {static.max_length or 'request-sized'} tokens" + (", compiled" if static.compile else "")
    return {"processor": processor_name(device), "device": device.type, "threads": torch.get_num_threads(),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "torch": torch.__version__,
            "packed_linears": has_packed_linears(model), "int4": has_int4_linears(model), "cache": cache}


def model_shape(model: torch.nn.Module) -> dict:
    """A model's class, parameter count, and, for a Hugging Face model, its depth, width and attention kernel."""
    config = getattr(model, "config", None)
    return {"class": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
            "layers": getattr(config, "num_hidden_layers", None), "hidden_size": getattr(config, "hidden_size", None),
            "attention": getattr(config, "_attn_implementation", None)}


def profile_path(kind: str, key: dict) -> Path:
    """The file of the ``kind`` profile (e.g. "dynamic-tree") measured under ``key``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cost_profiles_dir() / f"{kind}-{digest}.json"


def read_profile(path: Path, key: dict) -> tuple[dict | None, str]:
    """(the costs saved in ``path`` for ``key``, "") or (None, why they cannot be used)."""
    if not path.exists():
        return None, "no profile yet"
    try:
        saved = json.loads(path.read_text())
        found_format, found_key, costs = saved["format"], saved["key"], saved["costs"]
    except (OSError, ValueError, TypeError, KeyError) as e:
        return None, f"{path} is unreadable ({type(e).__name__}: {e})"
    if found_format != FORMAT:
        return None, f"{path} has format {found_format!r}, this version writes {FORMAT}"
    if found_key != key:
        return None, f"{path} was measured under other settings"
    return costs, ""


def write_profile(path: Path, key: dict, costs: dict) -> None:
    """Save ``costs`` (JSON-ready) for ``key`` atomically: a reader finds the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": FORMAT, "key": key, "costs": costs}, indent=1)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_SPREAD = 1.0  # passes that differ by more than their median (another process shared the cores): not kept


def kept_or_measured(kind: str, key: dict, measure, parse, remeasure: bool = False, default: dict | None = None,
                     default_name: str = "") -> dict:
    """The ``kind`` profile for ``key``: read from its file when there is a usable one (and not ``remeasure``),
    else ``measure()`` (a JSON-ready dict) timed now and saved. ``parse`` turns the saved dict into the costs
    (raising ValueError, TypeError or KeyError on a malformed one, which is then measured again). The costs come
    back with ``source`` ("read" or "measured"), ``file`` (the profile's path; None where it could not be saved)
    and ``CONTEXT``: ``measured_at`` (UTC), ``load_average`` (1 minute, as it ended; None where the system does not
    say) and ``cpus``. Prints one line saying which, naming the file, and whether the machine was busy
    (``busy_note``). ``default``: costs (as ``measure`` returns them) to use instead of measuring when no profile
    was kept (shipped defaults for this kind of device, ``default_name``): the same for every run until a
    ``remeasure=True`` call keeps this machine's. A measurement whose passes spread too far (``noise_note``) is
    used but not kept, and the line says so."""
    path = profile_path(kind, key)
    saved, why = (None, "remeasure=True") if remeasure else read_profile(path, key)
    if saved is not None:
        try:
            costs = {**parse(saved), **{name: saved[name] for name in CONTEXT}}
            print(f"{kind} costs read from {path} (measured {saved['measured_at']}{busy_note(saved)}; delete the "
                  "file or pass remeasure=True to measure again)")
            return {**costs, "source": "read", "file": str(path)}
        except (ValueError, TypeError, KeyError) as e:
            why = f"{path} holds malformed costs ({type(e).__name__}: {e})"
    if default is not None and not remeasure:
        where = default.get("processor", "another machine")
        print(f"{kind} costs: the shipped defaults for {default_name}, measured on {where} ({why}; calibrate() "
              "measures this machine's)")
        return {**parse(default), **{name: default.get(name) for name in CONTEXT}, "source": "default",
                "file": None}
    measured = measure()
    measured.update(measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else None, cpus=os.cpu_count())
    noise = noise_note(measured)
    if noise:
        print(f"{kind} costs measured ({why}) but not kept: {noise}; measure again on a quiet machine")
        return {**parse(measured), **{name: measured[name] for name in CONTEXT}, "source": "measured", "file": None}
    try:
        write_profile(path, key, measured)
        print(f"{kind} costs measured ({why}{busy_note(measured)}) and saved as {path.name} in "
              "paths.cost_profiles_dir()")
    except OSError as e:  # a read-only cache: use the costs, measure again next time
        print(f"{kind} costs measured ({why}{busy_note(measured)}) but not saved to {path} ({type(e).__name__}: {e})")
        path = None
    return {**parse(measured), **{name: measured[name] for name in CONTEXT}, "source": "measured",
            "file": None if path is None else str(path)}


def busy_note(profile: dict) -> str:
    """A warning where the machine was busy as the profile was measured (a load average above its CPU count:
    other work shared the cores, so the costs are those of a loaded machine), else ""."""
    load, cpus = profile["load_average"], profile["cpus"]
    if load is None or cpus is None or load <= cpus:
        return ""
    return f"; the machine was busy then, load average {load:.1f} on {cpus} CPUs: measure again when it is idle"


def noise_note(measured: dict) -> str:
    """Why a measurement is too noisy to keep (a quantity whose [min, median, max] over the passes, in
    ``measured["spread"]``, spans more than ``MAX_SPREAD`` of its median), else ""."""
    def triples(spread):
        for name, value in spread.items():
            if isinstance(value, dict):
                yield from ((f"{name}({n})", v) for n, v in value.items())
            else:
                yield name, value

    for name, (low, mid, high) in triples(measured.get("spread", {})):
        if mid > 0 and (high - low) / mid > MAX_SPREAD:
            return (f"{name} ranged from {low:.4g} to {high:.4g} over the passes (more than {MAX_SPREAD:.0%} of its "
                    "median)")
    return ""
