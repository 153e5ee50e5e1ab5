"""Counting host reads: the calls that bring a tensor's value into Python.

On a GPU every such read is a synchronization: the host waits while the device drains its queue, and nothing new
is queued meanwhile. The loop is written to read little per round (``decode.py``); this module counts, so that a
test can hold it to that.

- ``count_host_reads()``, on any machine: while open, the ``torch.Tensor`` methods that hand a value to Python
  (``item``, ``tolist``, ``numpy``, ``cpu``, and ``bool(t)``, ``int(t)``, ``float(t)``, a tensor used as an index)
  are wrapped and every call made from Python is counted, on any tensor. On a CPU run that counts every read a
  GPU run would turn into a synchronization, and also reads of tensors that would stay on the host there (so it
  errs high). Calls made inside torch's own C++ code are not seen.
- ``count_cuda_syncs()``, on CUDA: ``torch.cuda.set_sync_debug_mode("warn")`` while open; every synchronizing
  call the CUDA runtime makes (a copy to the host, ``.item()``, a blocking copy from pageable memory, ...) warns
  once, and the warnings are counted.

Both yield a ``HostReads`` whose ``count`` is the number seen so far (``calls`` names the CPU counter's).
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")


@dataclass
class HostReads:
    """How many host reads (or synchronizations) were seen, and of which kind."""

    calls: Counter = field(default_factory=Counter)
    warnings: list = field(default_factory=list)  # on CUDA: the warnings recorded so far

    @property
    def count(self) -> int:
        syncs = sum("synchroniz" in str(w.message) for w in self.warnings)
        return sum(self.calls.values()) + syncs


@contextlib.contextmanager
def count_host_reads():
    """Count calls of the reading ``torch.Tensor`` methods (``READS``) made while the block runs (any thread)."""
    reads = HostReads()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name, method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            reads.calls[name] += 1
            return method(self, *args, **kwargs)
        return wrapper

    for name, method in originals.items():
        setattr(torch.Tensor, name, counting(name, method))
    try:
        yield reads
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


@contextlib.contextmanager
def count_cuda_syncs():
    """Count the synchronizations the CUDA runtime reports while the block runs (``set_sync_debug_mode``)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield HostReads(warnings=seen)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
