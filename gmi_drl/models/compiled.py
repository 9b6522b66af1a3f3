"""`compile_graph`: the one way gmi-drl hands a function to ``torch.compile``, with the costs
that do not depend on the function paid once per machine instead of once per process.

torch's own persistent caches keep what inductor generated and built (the FX graph and AOT
autograd caches, on by default, under ``TORCHINDUCTOR_CACHE_DIR``), so a second run of the same
graph skips code generation and the C++ compiler. What every process still paid on a CPU was
inductor's check of the machine's vector instruction sets: it builds a test program for each
set the CPU reports and loads it in a Python subprocess, six subprocesses here, 1.1-1.3 s per
process before the first graph runs. `compile_graph` records the check's outcome next to
inductor's cache; where a record made on this machine with this torch says that every set the
CPU reports passed, inductor is told so (``cpp.vec_isa_ok``) and skips the subprocesses, picking
the same set it would have picked. Where any set failed, or nothing is recorded, inductor checks
as usual (and the record is written once it has).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Callable

import torch

log = logging.getLogger(__name__)

RECORD = "gmi-drl-vec-isa.json"
"""the record's file name in inductor's cache directory"""


def compile_graph(fn: Callable, device_type: str, **options) -> Callable:
    """``torch.compile(fn, dynamic=False)`` with inductor's options for ``device_type``
    (``cpp_wrapper`` on a CPU: one C++ call per graph instead of a Python wrapper) and
    ``options`` on top; the machine's instruction-set check skipped where this machine's record
    allows (module docstring)."""
    if device_type == "cpu":
        options = {"cpp_wrapper": True, **options}
        _vec_isa_from_record()
    return torch.compile(fn, dynamic=False, options=options or None)


def _cpu_sets() -> tuple[list[str], str]:
    """The vector instruction sets inductor considers for this CPU (its flags permitting),
    strongest first, and a digest of what the check depends on (torch, the CPU's flags, the
    C++ compiler inductor calls)."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.cpp_builder import get_cpp_compiler

    flags = cpu_vec_isa.x86_isa_checker() if hasattr(cpu_vec_isa, "x86_isa_checker") else []
    sets = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
            if all(f in flags for f in str(isa).split())]
    key = json.dumps([torch.__version__, sorted(flags), get_cpp_compiler(), sets])
    return sets, hashlib.sha256(key.encode()).hexdigest()


def _vec_isa_from_record() -> None:
    """Tell inductor the check's outcome where this machine's record holds it; else let
    inductor check now and record what it found."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if inductor_config.cpp.vec_isa_ok is not None:  # the user's (TORCHINDUCTOR_VEC_ISA_OK)
        return
    try:
        sets, digest = _cpu_sets()
    except Exception as e:  # noqa: BLE001 - another architecture or torch: inductor checks
        log.debug("no vector instruction-set record: %s", e)
        return
    path = os.path.join(cache_dir(), RECORD)
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {}
    if record.get(digest) == sets and sets:
        inductor_config.cpp.vec_isa_ok = True  # every set passed here before: skip the check
        return
    passed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]  # inductor's own check
    if passed != sets:
        return  # a set failed to build or load here: inductor keeps checking in every process
    record[digest] = sets
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: inductor checks again next time
        log.debug("could not record the vector instruction sets in %s: %s", path, e)
