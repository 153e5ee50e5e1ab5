"""Will a model fit? Its weights and KV cache, estimated from its config before anything is loaded, against the
free memory of the devices it would go to."""
from __future__ import annotations

import os

import torch


def parameter_count(config) -> int:
    """Parameters of the model a config describes, counted on the meta device (nothing is allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(config, tokens: int, dtype: torch.dtype, batch_size: int = 1) -> int:
    """Keys and values for ``tokens`` positions in every layer."""
    text = config.get_text_config(decoder=True)
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * heads * head_dim * tokens * batch_size * dtype.itemsize


def free_bytes(device: torch.device) -> int:
    """Free memory where ``device`` allocates: the GPU's free memory, or the machine's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def placement_devices(device: torch.device, device_map) -> list[torch.device]:
    """The devices a model would be spread over: ``device`` alone, or those of a ``device_map`` ("auto": every
    GPU, then the CPU)."""
    if device_map is None:
        return [device]
    if device_map == "auto":
        gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        return gpus + [torch.device("cpu")]
    if isinstance(device_map, dict):
        return sorted({torch.device(f"cuda:{v}" if isinstance(v, int) else v) for v in device_map.values()
                       if v != "disk"}, key=str)
    return [torch.device(device_map)]


def check_fits(name: str, config, dtype: torch.dtype, devices: list[torch.device], kv_tokens: int) -> None:
    """Refuse, before loading, a model whose weights plus a ``kv_tokens``-long KV cache exceed the free memory
    of ``devices`` together, saying what would fit."""
    GB = 1024 ** 3
    weights = parameter_count(config) * dtype.itemsize
    kv = kv_cache_bytes(config, kv_tokens, dtype)
    free = {str(d): free_bytes(d) for d in devices}
    if weights + kv <= sum(free.values()):
        return
    hints = []
    if dtype.itemsize > 2:
        hints.append(f"dtype='bfloat16' (weights {weights / dtype.itemsize * 2 / GB:.1f} GB)")
    if len(devices) == 1 and torch.cuda.is_available():
        hints.append("device_map='auto' (spread over every GPU, then the CPU)")
    hints.append("a shorter cache (max_cache_len)" if kv > GB / 10 else "a smaller model")
    raise MemoryError(f"{name} needs about {weights / GB:.1f} GB of weights in {str(dtype).removeprefix('torch.')} "
                      f"+ {kv / GB:.2f} GB of KV cache for {kv_tokens} tokens, but "
                      + ", ".join(f"{d} has {b / GB:.1f} GB free" for d, b in free.items())
                      + f"; try {' or '.join(hints)}")
