"""The compiled forward: ``torch.compile`` set up as the fast path of each device, its graphs kept on disk.

- CUDA: CUDA graphs (``mode="reduce-overhead"``): at batch 1 a step is bound by kernel launches, which a replay
  removes.
- CPU: inductor with freezing (the weights become constants, and the compiler packs the linear layers' weights
  for oneDNN itself) and its C++ wrapper (the graph runs from C++, with no Python between its kernels). A decode
  step is then faster than the eager model with packed linear layers (docs/COMPILED.md has the measurements).

Compiling a model's forward for one input shape takes about a minute on a small CPU. The graphs are kept in the
cache folder (``<cache>/inductor``, unless ``TORCHINDUCTOR_CACHE_DIR`` is set), so a later process compiles only
what the disk does not hold. Two details of torch's inductor keep a frozen CPU graph from being reused there,
and ``keep_graphs_on_disk`` adjusts both, once per process:

1. The C++ source names each constant with its Python ``id``, which changes in every process, so the C++ compile
   (about half of the minute) never hits its cache. The name is only a comment: the values are handed to the
   compiled code at every call, from the Python module inductor loads afresh for each graph. It is written
   without the id.
2. The graph cache refuses graphs holding oneDNN-packed weights, which it cannot pickle. It never needs to: it
   keys frozen parameters by their shape and reads their values from the graph being compiled (torch's own
   handling of frozen parameters), so a frozen packed weight is keyed like any other frozen parameter.

The first compile of each shape says what it is compiling and how long it took (``CompileLog``).

A model on 4-bit blocks (``tuning.int4``) compiles with inductor's autotuning of matrix products too
(``INT4_SETTINGS``): only then may inductor run a 4-bit product on its C++ template, which on an AMX CPU
multiplies several rows (a verification or tree forward) several times faster than torch's eager 4-bit kernel;
without it the graph calls that eager kernel. Autotuning times each candidate once per shape while
compiling, and the graph kept on disk holds the choice (docs/INT4.md has the measurements).
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch._dynamo.config as dynamo_config
import torch._inductor.config as inductor_config

from ..paths import cache_dir
from .int4 import has_int4_linears

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
CPU_SETTINGS = {"freezing": True, "cpp_wrapper": True, "size_asserts": False}
INT4_SETTINGS = {**CPU_SETTINGS, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
# graphs one forward may hold: a shape and cache size each, for every model of one architecture in the process (a
# model's graphs are its own: its weights are frozen into them); dynamo's default, 8, would run the rest eagerly
RECOMPILE_LIMIT = 64
_adjusted = False


class CompiledForward:
    """``model``'s forward (or any function of tensors) compiled as the fast path of ``device`` (the module's
    text), shapes fixed unless ``dynamic``. The settings are inductor's configuration while this forward runs, not
    the process's: torch decides whether to freeze while it traces a call, and other compiled code in the process
    keeps its own settings."""

    def __init__(self, model, device: torch.device, dynamic: bool = False):
        keep_graphs_on_disk()
        cuda = device.type == "cuda"
        self.forward = torch.compile(model, mode="reduce-overhead" if cuda else None, dynamic=dynamic)
        self.settings = {} if device.type != "cpu" else INT4_SETTINGS if has_int4_linears(model) else CPU_SETTINGS

    def __call__(self, **inputs):
        with inductor_config.patch(self.settings), dynamo_config.patch(recompile_limit=RECOMPILE_LIMIT):
            return self.forward(**inputs)


def inductor_cache() -> str:
    """Where compiled graphs are kept: ``$TORCHINDUCTOR_CACHE_DIR`` when it names a folder of its own, else
    ``<cache>/inductor`` (torch writes its default, a temporary folder, into the variable once it has used it)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    given = os.environ.get(INDUCTOR_CACHE_ENV)
    if given and os.path.abspath(given) != os.path.abspath(default_cache_dir()):
        return given
    return str(cache_dir() / "inductor")


def keep_graphs_on_disk() -> None:
    """Point inductor's caches at ``inductor_cache()`` and make frozen CPU graphs reusable from it (the module's
    text), once per process."""
    global _adjusted
    os.environ[INDUCTOR_CACHE_ENV] = inductor_cache()
    if _adjusted:
        return
    from torch._inductor import codecache
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.freezing_utils import is_frozen_param

    def write_constant(self, name: str, hashed: str) -> None:
        self.header.writeline(f"// {name} {hashed.rsplit(' ', 1)[0]}")  # the description without the id

    keyed = codecache.FxGraphCachePickler._reduce_tensor
    checked = codecache.CacheabilityValidator.check_tensor

    def reduce_tensor(self, t: torch.Tensor):
        if t.is_mkldnn and is_frozen_param(t):
            return codecache._ident, (("frozen oneDNN tensor", tuple(t.shape), str(t.dtype), str(t.device)),)
        return keyed(self, t)

    def check_tensor(t: torch.Tensor) -> None:
        if not (t.is_mkldnn and is_frozen_param(t)):
            checked(t)

    CppWrapperCpu.write_constant = write_constant
    codecache.FxGraphCachePickler._reduce_tensor = reduce_tensor
    codecache.CacheabilityValidator.check_tensor = staticmethod(check_tensor)
    _adjusted = True


class CompileLog:
    """Says, on stderr, when a compiled forward meets an input shape for the first time in this process (it
    compiles, or reads the graph from disk) and how long that call took."""

    def __init__(self, name: str):
        self.name = name
        self.seen: set = set()

    def call(self, forward, shape: tuple, what: str, **inputs):
        """``forward(**inputs)``, announced and timed when ``shape`` is new."""
        if shape in self.seen:
            return forward(**inputs)
        print(f"specdec_lite: compiling {self.name}'s forward for {what} (a minute or so the first time; later "
              f"processes read it from {inductor_cache()})...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        out = forward(**inputs)
        self.seen.add(shape)
        print(f"specdec_lite: {what} ready in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        return out
