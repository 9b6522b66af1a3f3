"""GMI targets the launcher tests run in child processes (importable by module path)."""

import os
import time

import torch


def allreduce_rank(ctx):
    red = ctx.make_reducer()
    t = torch.full((5,), float(ctx.gmi_id))
    red.allreduce_([t])
    return t.tolist(), os.environ["CUDA_VISIBLE_DEVICES"], sorted(os.sched_getaffinity(0))


def fail_on_one(ctx):
    if ctx.gmi_id == ctx.payload:
        time.sleep(1.0)  # let the others start working
        raise ValueError(f"GMI {ctx.gmi_id} failed on purpose at {time.time()!r}")
    time.sleep(30)


def sleep_long(ctx):
    time.sleep(30)
