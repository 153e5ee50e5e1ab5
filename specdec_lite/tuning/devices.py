"""Devices and the number formats they compute in: which device ``"auto"`` means, which dtype runs fastest there
(``auto_dtype``), which dtypes a baseline times (``plain_dtypes``), and refusing a device or dtype that cannot run,
before a model loads."""
from __future__ import annotations

from pathlib import Path

import torch


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
    """The dtype ``"auto"`` means on ``device``: the one speculative decoding of the target runs fastest in.

    - CUDA: bfloat16 where supported, else float16. MPS: float16.
    - CPU with native bfloat16 (``native_bfloat16``, by default ``cpu_has_native_bfloat16()``): bfloat16, as it is
      (not batch-invariant): a decode step reads half the bytes of float32, and a verification forward over several
      tokens stays cheap.
    - other CPUs: float32. Half precision is emulated there: plain decoding can still be faster in it (a decode step
      reads every weight once, and half precision reads half the bytes), but a forward over several tokens costs
      several decode steps, which speculative decoding pays every round. The baseline still times those half
      precisions (``plain_dtypes``). docs/SPEED.md has the measurements behind both choices.
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
