"""GMI targets the Ray launcher tests run inside Ray actors (importable by module path)."""

import os
import time
from pathlib import Path

import torch

import gmi_drl
import gmi_drl.envs


def reduce_and_report(ctx):
    """Allreduce the GMI id; report the mean, the actor's environment, its gmi_drl and its
    niceness."""
    red = ctx.make_reducer()
    t = torch.full((5,), float(ctx.gmi_id))
    red.allreduce_([t])
    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "GMI_TAG",
                                          "GMI_NUM_CPUS")}
    return t.tolist(), env, gmi_drl.__file__, ctx.layout.reduction.value, os.nice(0)


def fail_on_one(ctx):
    """Every GMI makes an env pool with a worker process (a shared-memory block it never
    closes), joins the reduction group and writes its pid; GMI 1 then exits abruptly
    (``payload[0] == "exit"``) or raises; the others wait to be stopped."""
    how, pid_dir = ctx.payload
    pool = gmi_drl.envs.make("CartPole-v1", num_envs=2, num_workers=1, engine="gymnasium")
    pool.reset()
    Path(pid_dir, f"gmi-{ctx.gmi_id}.pid").write_text(str(os.getpid()))
    ctx.make_reducer()
    if ctx.gmi_id == 1:
        time.sleep(1.0)
        if how == "exit":
            os._exit(3)
        raise ValueError("GMI 1 failed on purpose")
    time.sleep(60)
