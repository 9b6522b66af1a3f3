"""Env engine throughput: gmi-drl vs EnvPool vs Gymnasium's AsyncVectorEnv vs the raw physics,
in one invocation.

Every engine runs the same task, ``num_envs``, ``env_batch_size`` and thread/worker count with
random actions (drawn before timing); each figure is the median of ``--repeats`` runs of
``--seconds`` each, for each thread count of ``--threads``. Ratios are gmi-drl / peer within this
run (the only comparison that holds on a noisy machine).

The raw physics bound (``physics`` column) is the simulator alone on the same number of threads,
with no env logic: MuJoCo tasks step ``num_envs`` open-loop rollouts from the task's reset states
in ``mujoco.rollout`` (``mj_step`` ``frame_skip`` times per env step, in C++ on ``threads``
threads, random controls held for each env step, no observation, reward or reset); Atari steps
``num_envs`` games in ale_py's C++ vector interface on ``threads`` threads with its
preprocessing off (ALE's step with ``frame_skip=4`` and one grayscale screen per env step, a
reset at game over; no resize, frame stack or max-pool). ``vs physics`` is the share of that
bound the engine reaches.

    python benchmarks/env_throughput.py                      # all tasks, both modes
    python benchmarks/env_throughput.py --tasks Hopper-v5 Ant-v5 Pong-v5 --threads 1 2
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import gymnasium as gym
import numpy as np

import gmi_drl.envs as gmi_envs


class RandomWalkEnv(gym.Env):
    """A pure-Python env (no NumPy in `step`): a 1-d random walk on [-10, 10], 200-step limit."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.x, self.t = 0.0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0.0, 0
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        self.x = min(10.0, max(-10.0, self.x + (int(action) - 1) * 0.5))
        self.t += 1
        done = abs(self.x) >= 10.0
        return np.array([self.x, self.t / 200.0], np.float32), -abs(self.x) / 10.0, done, \
            self.t >= 200, {}


CUSTOM = "RandomWalk-custom"
gmi_envs.register(CUSTOM, RandomWalkEnv)
GYM_IDS = {"Pong-v5": None}  # Gymnasium's Atari needs a wrapper stack of its own: EnvPool only


def random_actions(space: gym.spaces.Space, n: int, rounds: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, (rounds, n)).astype(np.int64)
    return rng.uniform(space.low, space.high, (rounds, n, *space.shape)).astype(space.dtype)


def run_gmi(task: str, num_envs: int, batch: int, threads: int, seconds: float) -> float:
    with gmi_envs.make(task, num_envs=num_envs, env_batch_size=batch, num_workers=threads) as p:
        acts = random_actions(p.action_space, batch, 256, 0)
        p.reset()
        if batch == num_envs:
            return _timed(lambda k: p.step(acts[k & 255]), batch, seconds)
        p.send(random_actions(p.action_space, num_envs, 1, 1)[0], np.arange(num_envs))

        def one(k: int) -> None:
            info = p.recv()[4]
            p.send(acts[k & 255], info["env_id"])
        return _timed(one, batch, seconds)


def run_envpool(task: str, num_envs: int, batch: int, threads: int, seconds: float) -> float:
    import envpool

    p = envpool.make(task, env_type="gymnasium", num_envs=num_envs, batch_size=batch,
                     num_threads=threads, seed=0)
    acts = random_actions(p.action_space, batch, 256, 0)
    if batch == num_envs:
        p.reset()
        rate = _timed(lambda k: p.step(acts[k & 255]), batch, seconds)
    else:
        p.async_reset()

        def one(k: int) -> None:
            info = p.recv()[4]
            p.send(acts[k & 255], info["env_id"])
        rate = _timed(one, batch, seconds)
    p.close()
    return rate


def run_gym_async(task: str, num_envs: int, batch: int, threads: int, seconds: float) -> float:
    if batch != num_envs or task in GYM_IDS:
        return float("nan")  # AsyncVectorEnv has no partial batches; no Atari stack here
    fn = RandomWalkEnv if task == CUSTOM else (lambda: gym.make(task))
    # one process per env is AsyncVectorEnv's design; it cannot share a process among envs
    v = gym.vector.AsyncVectorEnv([fn] * num_envs, shared_memory=True)
    acts = random_actions(v.single_action_space, num_envs, 256, 0)
    v.reset(seed=0)
    rate = _timed(lambda k: v.step(acts[k & 255]), num_envs, seconds)
    v.close()
    return rate


def run_physics(task: str, num_envs: int, batch: int, threads: int, seconds: float) -> float:
    """Env steps/s of the raw simulator on ``threads`` threads (module docstring)."""
    if task == "Pong-v5":
        return _ale_bound(threads, num_envs, seconds)
    from gmi_drl.envs import mujoco_locomotion as ml

    if task not in ml.TASKS:
        return float("nan")
    import mujoco
    from mujoco import rollout

    probe = ml.TASKS[task][0](num_envs=1, num_threads=1)
    m, skip = probe.model, probe.frame_skip
    rng = np.random.default_rng(0)
    data = [mujoco.MjData(m) for _ in range(threads)]
    states = np.empty((num_envs, mujoco.mj_stateSize(m, mujoco.mjtState.mjSTATE_FULLPHYSICS)))
    for i in range(num_envs):
        d = data[0]
        mujoco.mj_resetData(m, d)
        d.qpos[:], d.qvel[:] = probe._reset_state(rng)
        mujoco.mj_getState(m, d, states[i], mujoco.mjtState.mjSTATE_FULLPHYSICS)
    env_steps = 50
    space = probe.action_space
    ctrl = np.repeat(rng.uniform(space.low, space.high, (num_envs, env_steps, m.nu)), skip, axis=1)
    out = np.empty((num_envs, env_steps * skip, states.shape[1]))
    sens = np.empty((num_envs, env_steps * skip, m.nsensordata))

    def one(k: int) -> None:
        rollout.rollout(m, data, states, ctrl, state=out, sensordata=sens, nstep=env_steps * skip,
                        persistent_pool=True)
    return _timed(one, num_envs * env_steps, seconds, warmup=2)


def _ale_bound(threads: int, num_envs: int, seconds: float) -> float:
    """ALE's step (frame skip 4) and its grayscale screen, ``num_envs`` games on ``threads``
    C++ threads: ale_py's own vector interface with its preprocessing off (no resize, frame
    stack, max-pool, no-op starts or reward clipping), a C++ loop without the GIL, so an upper
    bound on an engine that also preprocesses."""
    import ale_py
    from ale_py import roms

    vec = ale_py.ALEVectorInterface(
        roms.get_rom_path("pong"), num_envs, frame_skip=4, stack_num=1, img_height=210,
        img_width=160, grayscale=True, maxpool=False, noop_max=0, use_fire_reset=False,
        reward_clipping=False, batch_size=num_envs, num_threads=threads)
    vec.reset(list(range(num_envs)), list(range(num_envs)))
    picks = np.random.default_rng(0).integers(0, len(vec.get_action_set()),
                                              (256, num_envs)).tolist()
    strength = [1.0] * num_envs

    def one(k: int) -> None:
        vec.send(picks[k & 255], strength)
        vec.recv()
    return _timed(one, num_envs, seconds)


def _timed(one_step, batch: int, seconds: float, warmup: int = 20) -> float:
    for k in range(warmup):
        one_step(k)
    chunk = 50 if warmup >= 20 else 1
    n, k, t0 = 0, 0, time.perf_counter()
    while True:
        for _ in range(chunk):
            one_step(k)
            k += 1
        n += chunk * batch
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return n / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--tasks", nargs="+",
                    default=["Hopper-v5", "Pong-v5", "CartPole-v1", CUSTOM],
                    help="task ids, each in both modes (partial batch: 16 envs, batches of 8; "
                         f"full batch: 8 envs); {CUSTOM} is this script's pure-Python env (no "
                         "EnvPool run), Pong-v5 has no AsyncVectorEnv run")
    ap.add_argument("--threads", type=int, nargs="+", default=[2],
                    help="worker threads of gmi-drl's pool, EnvPool's and the physics bound, "
                         "one table per count (>= 1; AsyncVectorEnv runs one process per env)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per engine, interleaved; the median is reported (>= 1)")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="length of each timed run, seconds (> 0)")
    args = ap.parse_args()
    for flag, value in [("--threads", t) for t in args.threads] + [("--repeats", args.repeats)]:
        if value < 1:
            ap.error(f"{flag} {value}: must be >= 1")
    if args.seconds <= 0:
        ap.error(f"--seconds {args.seconds:g}: must be > 0")
    if not _has_envpool():
        print("envpool is not installed here: its column is n/a (pip install -e '.[bench]')")
    for threads in args.threads:
        table(args.tasks, threads, args.repeats, args.seconds)


def _has_envpool() -> bool:
    return importlib.util.find_spec("envpool") is not None


ENGINES = {"gmi-drl": run_gmi, "envpool": run_envpool, "gym-async": run_gym_async,
           "physics": run_physics}


def table(tasks: list[str], threads: int, repeats: int, seconds: float) -> None:
    """Measure every task in both modes on ``threads`` threads and print the table."""
    modes = [("partial batch", 16, 8), ("full batch", 8, 8)]
    rows = []
    for task in tasks:
        for mode, n, b in modes:
            runs = {k: [] for k in ENGINES}
            for _ in range(repeats):  # interleaved, so drift hits every engine alike
                for name, run in ENGINES.items():
                    if name == "envpool" and (task == CUSTOM or not _has_envpool()):
                        continue
                    runs[name].append(run(task, n, b, threads, seconds))
            med = {k: statistics.median(v) if v else float("nan") for k, v in runs.items()}
            rows.append((task, mode, n, b, med))
            print(f"{task} {mode} ({threads} threads): "
                  + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()), flush=True)
    print(f"\nsteps/s, median of {repeats} x {seconds:g} s, {threads} threads/workers, random "
          "actions\n")
    print("| task | mode | num_envs | env_batch_size | gmi-drl | EnvPool | gym AsyncVectorEnv |"
          " physics | vs EnvPool | vs gym | vs physics |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for task, mode, n, b, m in rows:
        def fmt(x: float) -> str:
            return "n/a" if np.isnan(x) else f"{x:,.0f}"

        def ratio(x: float) -> str:
            return "n/a" if np.isnan(x) else f"{m['gmi-drl'] / x:.2f}x"
        print(f"| {task} | {mode} | {n} | {b} | {fmt(m['gmi-drl'])} | {fmt(m['envpool'])} | "
              f"{fmt(m['gym-async'])} | {fmt(m['physics'])} | {ratio(m['envpool'])} | "
              f"{ratio(m['gym-async'])} | {ratio(m['physics'])} |")


if __name__ == "__main__":
    main()
