"""Which target a head was trained on: an exact fingerprint of its weights, and a probe that survives a change
of dtype."""
from __future__ import annotations

import hashlib

import numpy as np
import torch


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of a model's configuration-relevant shapes and a strided sample of its weights: equal for
    the same weights, different (with overwhelming probability) for any other model."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        flat = p.detach().flatten()
        sample = flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy().round(4)  # robust to storage dtype
        h.update(f"{name}:{tuple(p.shape)}".encode())
        h.update(sample.tobytes())
    return h.hexdigest()[:16]


def weights_probe(model: torch.nn.Module, tensors: int = 8, values: int = 32) -> list[float]:
    """``values`` strided weights from each of ``tensors`` parameter tensors spread over the model (by name), as
    floats: a record of which weights a head was trained on that survives a change of dtype (``same_weights``)."""
    state = sorted(model.state_dict().items())
    picked = state[:: max(1, len(state) // tensors)][:tensors]
    out = []
    for _, p in picked:
        flat = p.detach().flatten()
        out += flat[:: max(1, flat.numel() // values)][:values].float().cpu().tolist()
    return out


def same_weights(probe: list[float], model: torch.nn.Module) -> bool:
    """Whether ``model`` has the weights ``probe`` was taken from, up to float16/bfloat16 rounding (2%)."""
    now = weights_probe(model)
    return len(now) == len(probe) and bool(np.allclose(now, probe, rtol=0.02, atol=1e-4))
