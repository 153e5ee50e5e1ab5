"""Loading a model (``load_model``) by package name, Hugging Face id or local path (``names.py``), in the dtype
and on the device asked for (``tuning/devices.py``), with the tuning it may get (packed linear layers, batch
invariance, a static cache, compiled forwards), after checking that it fits in memory.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..names import resolve_name
from ..paths import cache_dir, is_head_dir
from ..tuning.batch_invariance import make_batch_invariant
from ..tuning.devices import resolve_device, resolve_dtype
from ..tuning.int4 import int4_linears, int4_source, read_q4_1
from ..tuning.memory import check_fits, free_bytes, placement_devices
from ..tuning.packed_linear import can_pack, check_packable, pack_linears, packed_bytes
from ..tokenizers import register_tokenizer
from .lm import check_static_placement, use_static_cache

NOMINAL_STATIC = 2048  # tokens per row a request-sized static cache is checked against free memory for


def load_model(name_or_path: str, device: str | torch.device = "auto", dtype: str | torch.dtype | None = "auto",
               *, device_map=None, cache: str = "dynamic", max_cache_len: int | None = None, compile: bool = False,
               batch_invariant: bool = False, packed_linears: bool | None = None, int4: bool = False):
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
    (``tuning/compiled.py``: inductor with freezing and its C++ wrapper on a CPU, CUDA graphs on a GPU; each new
    shape compiles once, about a minute on a small CPU, and is kept on disk). ``packed_linears`` (None: on for
    float32 on a CPU, and for bfloat16 where oneDNN computes it, where the copies take under half the free memory,
    unless ``compile=True``) runs the linear layers on weights packed for oneDNN (``tuning/packed_linear.py``: the
    same product, cheaper); False keeps them as transformers loads them, which is what compiled forwards run.
    ``int4=True`` (the embedded target, on a CPU) runs its linear layers on the 4-bit blocks its GGUF stores
    (``tuning/int4.py``). The weights and cache are checked against free memory before loading. The model is in
    eval mode and its tokenizer is registered, so ``speculative_generate`` can refuse a draft whose tokenizer
    differs.
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
    gguf = int4_source(name_or_path, device, dtype, device_map, batch_invariant) if int4 else None
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
    if gguf:
        int4_linears(model, read_q4_1(gguf))
    if packed_linears is None:
        packed_linears = (not compile and device_map is None and not batch_invariant and can_pack(device, dtype)
                          and packed_bytes(model) < free_bytes(device) / 2)
    if packed_linears:
        pack_linears(model)
    if cache == "static":
        use_static_cache(model, max_length=max_cache_len, compile=compile)
    register_tokenizer(model, tokenizer)
    return model, tokenizer

