"""One profiled point of `gmi-drl tune`: a short real training run, in a process of its own.

    python -m gmi_drl.tune.probe REQUEST.json RESULT.json

``REQUEST.json``: ``{"config": <to_dict of the run's config, num_envs and GMIs set>,
"warmup": W, "iterations": K, "min_steps": N}``. The run trains ``W + K'`` iterations, ``K'`` the
larger of ``K`` and the iterations that hold ``N`` env steps; throughput and the phase terms come
from the last ``K'`` (the first ``W`` hold start-up: worker threads, torch.compile).
``RESULT.json`` gets `measure`'s figures. `gmi_drl.tune` runs `main` in a process forked from
multiprocessing's fork server, in a session of its own, and stops the whole process group when
it has the figures or when it passes its time limit: SIGTERM, which unwinds
the run here as Ctrl-C would (its GMIs stopped, its scratch run directory, the launcher's
rendezvous directory and shared memory removed; exit status 143), then SIGKILL.
"""

from __future__ import annotations

import csv
import json
import signal
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np


def run(config: dict, warmup: int, iterations: int, min_steps: int = 0) -> dict:
    """Train ``config`` for ``warmup`` iterations (more for an off-policy algorithm, until its
    ``learning_starts`` has passed), then for ``iterations`` or as many as ``min_steps`` env
    steps (over every GMI) take, whichever is more, in a scratch run directory; return
    `measure`'s figures."""
    from gmi_drl.config import from_dict, validate
    from gmi_drl.telemetry.progress import ProgressPrinter
    from gmi_drl.train import train, weight_count

    cfg = from_dict(config)
    iterations = max(iterations, -(-min_steps // max(cfg.batch_size, 1)))
    # off-policy algorithms only act until learning_starts: measure after it
    per_gmi = cfg.algo.steps_per_iteration(cfg.env.num_envs)
    warmup += -(-getattr(cfg.algo, "learning_starts", 0) // per_gmi)
    with tempfile.TemporaryDirectory(prefix="gmi-drl-probe-") as tmp:
        # a probe is a fresh run in its own directory: it never continues the user's
        cfg.run_dir, cfg.resume = tmp, None
        cfg.total_timesteps = (warmup + iterations) * cfg.batch_size
        cfg.log.tensorboard, cfg.log.log_every, cfg.log.cpu_times = False, 1, True
        cfg.log.gpu_util_interval_s, cfg.checkpoint.every = 0.0, 0
        validate(cfg)
        # a progress line per update: what `tune` quotes when this probe runs past its limit
        result = train(cfg, on_progress=ProgressPrinter(interval_s=0.0))
        rows = _metric_rows(Path(tmp) / "metrics.csv")
    figures = measure(rows, warmup, cfg.batch_size, cfg.num_trainers)
    figures["mem"] = float(max(result.peak_memory_bytes))
    figures["model_bytes"] = 4.0 * weight_count(cfg)
    figures.update(_sizes(cfg))
    return figures


def measure(rows: list[dict[str, float]], warmup: int, batch_size: int, num_gmis: int) -> dict:
    """Throughput and Table 3's time and resource terms from GMI 0's per-iteration metrics.

    Args:
        rows: one dict per iteration (``global_step``, ``wall_s`` and the ``perf/*`` metrics).
        warmup: leading iterations left out.
        batch_size: env steps per iteration over every GMI.
        num_gmis: GMIs of the run that train (``samples`` is per GMI that trains).

    Returns:
        ``top`` (env steps per second over every GMI, from the measured iterations' wall time),
        ``t_s``/``t_a``/``t_t``/``t_comm`` (seconds per iteration: env stepping, the rest of the
        rollout, the rest of the iteration less gradient reduction, reduction) and
        ``r_s``/``r_a``/``r_t`` (the process's CPU seconds per wall second of that phase, in
        cores; the trainer's from its timed phases), and ``samples`` (env steps per GMI per
        iteration).

    Raises:
        ValueError: fewer than ``warmup + 1`` iterations in ``rows``.
    """
    if len(rows) < warmup + 1:
        raise ValueError(f"{len(rows)} iterations logged, need more than the {warmup} warm-up")
    start = rows[warmup - 1] if warmup else {"global_step": 0.0, "wall_s": 0.0}
    measured = rows[warmup:]
    wall = measured[-1]["wall_s"] - start["wall_s"]
    steps = measured[-1]["global_step"] - start["global_step"]

    def mean(key: str) -> float:
        return float(np.mean([r.get(key, 0.0) for r in measured]))

    def ends(suffix: str, cpu: bool = False) -> float:
        tail = "_cpu_s" if cpu else "_s"
        return float(np.mean([sum(v for k, v in r.items() if k.startswith("perf/")
                                  and k.endswith(f"{suffix}{tail}")
                                  and (cpu or not k.endswith("_cpu_s"))) for r in measured]))

    top_level = {k[:-2] for r in measured for k in r if k.startswith("perf/")
                 and k.endswith("_s") and not k.endswith("_cpu_s") and k.count("/") == 1
                 and k != "perf/rollout_s"}
    wall_of = {"s": mean("perf/rollout/env_step_s"),
               "a": mean("perf/rollout_s") - mean("perf/rollout/env_step_s"),
               "comm": ends("/allreduce")}
    # the trainer's time is the rest of the iteration: advantages, update and what the runner
    # does between iterations (logging, checkpoints), all of which a holistic GMI runs in turn
    wall_of["t"] = wall / len(measured) - mean("perf/rollout_s") - wall_of["comm"]
    timed = {"s": wall_of["s"], "a": wall_of["a"],
             "t": sum(mean(f"{k}_s") for k in top_level) - wall_of["comm"]}
    cpu_of = {"s": mean("perf/rollout/env_step_cpu_s"),
              "a": mean("perf/rollout_cpu_s") - mean("perf/rollout/env_step_cpu_s"),
              "t": sum(mean(f"{k}_cpu_s") for k in top_level) - ends("/allreduce", cpu=True)}
    out = {"top": steps / wall if wall > 0 else 0.0, "samples": batch_size / num_gmis,
           "t_comm": wall_of["comm"]}
    for role in "sat":
        out[f"t_{role}"] = max(wall_of[role], 0.0)
        out[f"r_{role}"] = cpu_of[role] / timed[role] if timed[role] > 0 else 0.0
    return out


def _metric_rows(path: Path) -> list[dict[str, float]]:
    """metrics.csv (long format) as one dict per logged global_step, in order."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(row["global_step"])
            by_step[step]["global_step"] = float(step)
            by_step[step]["wall_s"] = float(row["wall_s"])
            by_step[step][row["name"]] = float(row["value"])
    return [by_step[s] for s in sorted(by_step)]


def _sizes(cfg) -> dict:
    """S, A, W of Table 3 for ``cfg``'s task, bytes."""
    from gmi_drl import envs

    spec = envs.task_spec(cfg.env.task_id, engine=cfg.env.engine)
    obs, act = spec.observation_space, spec.action_space
    return {"state_bytes": float(np.prod(obs.shape or (1,)) * np.dtype(obs.dtype).itemsize),
            "action_bytes": float(np.prod(act.shape or (1,)) * np.dtype(act.dtype).itemsize),
            "reward_bytes": 4.0}


_stopped: list[int] = []


def _terminated(signum, frame) -> None:
    _stopped.append(signum)
    raise KeyboardInterrupt  # the run unwinds: every clean-up of Ctrl-C runs


def main(argv: list[str]) -> int:
    from gmi_drl.runner.run import RunStopped

    signal.signal(signal.SIGTERM, _terminated)
    request = json.loads(Path(argv[0]).read_text())
    try:
        figures = run(request["config"], request["warmup"], request["iterations"],
                      request.get("min_steps", 0))
    except (KeyboardInterrupt, RunStopped):
        if not _stopped:  # a failure of the run itself: its traceback is the probe's reason
            raise
        # the GMIs got the same SIGTERM, so the run may have stopped on one of them first
        print("probe: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    from gmi_drl.files import write_text_atomically

    write_text_atomically(argv[1], json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
