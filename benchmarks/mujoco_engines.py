"""MuJoCo v5 tasks per engine: the C++ core (``native``) vs the NumPy engine vs Gymnasium.

Each engine steps the same task with the same ``num_envs`` and random actions (drawn before
timing), full batches; figures are medians of ``--repeats`` windows of ``--seconds``. Gymnasium
runs its envs one after another in this process (``SyncVectorEnv``: what a single-env user
has), EnvPool its own version of the task where it has one (``-v4``: other physics parameters,
so a reference, not a match).

    python benchmarks/mujoco_engines.py
    python benchmarks/mujoco_engines.py --tasks Humanoid-v5 --num-envs 1 8 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np

import gmi_drl.envs as gmi_envs


def _timed(step, num_envs: int, seconds: float) -> float:
    for k in range(20):
        step(k)
    n, k, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            step(k)
            k += 1
        n += 20 * num_envs
    return n / (time.perf_counter() - t0)


def _actions(space, num_envs: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.uniform(space.low, space.high, (256, num_envs, *space.shape)).astype(space.dtype)


def run_gmi(task: str, num_envs: int, engine: str, threads: int, seconds: float) -> float:
    workers = min(threads, num_envs)
    with gmi_envs.make(task, num_envs, num_workers=workers, engine=engine) as pool:
        acts = _actions(pool.action_space, num_envs)
        pool.reset()
        return _timed(lambda k: pool.step(acts[k & 255]), num_envs, seconds)


def run_gym(task: str, num_envs: int, seconds: float) -> float:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(task)] * num_envs)
    acts = _actions(envs.single_action_space, num_envs)
    envs.reset(seed=0)
    rate = _timed(lambda k: envs.step(acts[k & 255]), num_envs, seconds)
    envs.close()
    return rate


def run_envpool(task: str, num_envs: int, threads: int, seconds: float) -> float:
    import envpool

    v4 = task.replace("-v5", "-v4")
    if v4 not in envpool.list_all_envs():
        return float("nan")
    pool = envpool.make(v4, env_type="gymnasium", num_envs=num_envs, num_threads=threads,
                        seed=0)
    acts = _actions(pool.action_space, num_envs)
    pool.reset()
    rate = _timed(lambda k: pool.step(acts[k & 255]), num_envs, seconds)
    pool.close()
    return rate


def _check(ap: argparse.ArgumentParser, args) -> None:
    """Refuse, as usage errors and before any measurement, what the benchmark cannot run."""
    for flag, value in (("--num-envs", min(args.num_envs)), ("--threads", args.threads),
                        ("--repeats", args.repeats)):
        if value < 1:
            ap.error(f"{flag} {value}: must be >= 1")
    if args.seconds <= 0:
        ap.error(f"--seconds {args.seconds:g}: must be > 0")
    for task in args.tasks:
        try:
            has = gmi_envs.engines(task)
        except ValueError as e:
            ap.error(f"--tasks {task}: {e}")
        if not {"native", "numpy"} <= set(has):
            ap.error(f"--tasks {task}: has the engines {has}; this benchmark compares the MuJoCo "
                     "engines (native, numpy) of a MuJoCo task, e.g. Hopper-v5")
        space = gmi_envs.task_spec(task, "native").action_space
        if not isinstance(space, gym.spaces.Box):
            ap.error(f"--tasks {task}: its actions are {space}; this benchmark steps MuJoCo tasks "
                     "with continuous (Box) actions, e.g. Hopper-v5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=["Ant-v5", "Humanoid-v5", "Hopper-v5"],
                    help="MuJoCo task ids with gmi-drl's native and numpy engines (continuous "
                         "actions)")
    ap.add_argument("--num-envs", type=int, nargs="+", default=[1, 8],
                    help="envs per engine, one row each (>= 1)")
    ap.add_argument("--threads", type=int, default=2,
                    help="worker threads of gmi-drl's pools (at most num_envs) and EnvPool's "
                         "(>= 1)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed windows per engine, interleaved; the median is reported (>= 1)")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="length of each timed window, seconds (> 0)")
    args = ap.parse_args()
    _check(ap, args)
    names = ("native", "numpy", "gymnasium", "envpool-v4")
    rows = []
    for task in args.tasks:
        for n in args.num_envs:
            runs = {k: [] for k in names}
            for _ in range(args.repeats):  # interleaved: drift hits every engine alike
                runs["native"].append(run_gmi(task, n, "native", args.threads, args.seconds))
                runs["numpy"].append(run_gmi(task, n, "numpy", args.threads, args.seconds))
                runs["gymnasium"].append(run_gym(task, n, args.seconds))
                runs["envpool-v4"].append(run_envpool(task, n, args.threads, args.seconds))
            med = {k: statistics.median(v) for k, v in runs.items()}
            rows.append((task, n, med))
            print(f"{task} x{n}: " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()),
                  flush=True)
    print(f"\nenv steps/s, median of {args.repeats} x {args.seconds:g} s, {args.threads} "
          "threads, random actions, full batches\n")
    print("| task | num_envs | native (C++) | numpy | Gymnasium | EnvPool -v4 | native / numpy |"
          " native / Gymnasium | native / EnvPool |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for task, n, m in rows:
        def fmt(x: float) -> str:
            return "n/a" if np.isnan(x) else f"{x:,.0f}"

        def ratio(x: float) -> str:
            return "n/a" if np.isnan(x) else f"{m['native'] / x:.2f}x"
        print(f"| {task} | {n} | {fmt(m['native'])} | {fmt(m['numpy'])} | "
              f"{fmt(m['gymnasium'])} | {fmt(m['envpool-v4'])} | {ratio(m['numpy'])} | "
              f"{ratio(m['gymnasium'])} | {ratio(m['envpool-v4'])} |")


if __name__ == "__main__":
    main()
