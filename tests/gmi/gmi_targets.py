"""GMI targets the launcher tests run in child processes (importable by module path)."""

import os
import time

import torch

IMPORTED_BY = os.getpid()
"""the process that imported this module: a fork server that preloaded it, or the GMI itself"""


def allreduce_rank(ctx):
    red = ctx.make_reducer()
    t = torch.full((5,), float(ctx.gmi_id))
    red.allreduce_([t])
    return t.tolist(), os.environ["CUDA_VISIBLE_DEVICES"], sorted(os.sched_getaffinity(0))


def started_with(ctx):
    """What this GMI found at its start: whether its target's module was imported before it
    started (the fork server's preload of the target's module), the variables named in the
    payload, and inductor's compile threads (``None`` where inductor was not imported) beside
    this GMI's core count."""
    import sys

    inductor = sys.modules.get("torch._inductor.config")
    return (IMPORTED_BY != os.getpid(), {k: os.environ.get(k) for k in ctx.payload},
            None if inductor is None else inductor.compile_threads,
            len(os.sched_getaffinity(0)))


def fail_on_one(ctx):
    if ctx.gmi_id == ctx.payload:
        time.sleep(1.0)  # let the others start working
        raise ValueError(f"GMI {ctx.gmi_id} failed on purpose at {time.time()!r}")
    time.sleep(30)


def sleep_long(ctx):
    time.sleep(30)


def probe_that_lingers(argv):
    """A probe (`gmi_drl.tune.run_probe`'s target) that writes its figures at once, then
    lingers with a child of its own, as a probe's teardown and leftover workers would."""
    import json
    import subprocess

    child = subprocess.Popen(["sleep", "60"])
    with open(argv[1] + ".tmp", "w") as f:
        json.dump({"top": 7.0}, f)
    os.replace(argv[1] + ".tmp", argv[1])
    child.wait()
    return 0


def reduce_and_report_wrapper(ctx):
    red = ctx.make_reducer()
    t = torch.full((3,), float(ctx.gmi_id))
    red.allreduce_([t])
    return os.environ.get("FAKE_NSYS"), t.tolist()


def allreduce_on_device(ctx):
    red = ctx.make_reducer()
    t = torch.full((4,), float(ctx.gmi_id), device=ctx.payload)
    red.allreduce_([t])
    return t.device.type, t.tolist()


INTERRUPTED: set[int] = set()


def spin_until_interrupted(ctx):
    """Wait as a GMI at an MPR barrier does (sleeps of 1 ms) until a KeyboardInterrupt."""
    try:
        while True:
            time.sleep(1e-3)
    except KeyboardInterrupt:
        INTERRUPTED.add(ctx.gmi_id)
        raise
