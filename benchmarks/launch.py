"""How long a multi-GMI run takes to start: GMIs forked from the fork server against spawned.

Each repeat is a fresh Python process that runs the same short PPO training twice with the
local placement: the first run is what a ``gmi-drl train`` user waits for (the fork server
starts and imports its modules inside it), the second what a process that launches runs one
after another sees (a sweep, ``tune`` in-process, the test suite), the server already up. The
training is 2 iterations of CartPole-v1 with 4 envs per GMI, so its wall time is mostly
start-up: the GMI processes, their imports, the envs and, with ``--compile``, torch.compile.
Printed: the median wall time of each (start method, GMIs, first / later run) and the ratio
spawn / forkserver, with the methods alternating between repeats.

    python benchmarks/launch.py                     # 2 and 4 GMIs, 3 repeats, no compile
    python benchmarks/launch.py --gmis 2 --compile  # with the compiled gradient step
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

METHODS = ("forkserver", "spawn")


def one_process(method: str, gmis: int, compile_: bool) -> list[float]:
    """Wall seconds of two consecutive `train` calls in this process."""
    from gmi_drl.config import preset, validate
    from gmi_drl.train import train

    walls = []
    for _ in range(2):
        cfg = preset("classic", "CartPole-v1", "ppo")
        cfg.env.num_envs, cfg.gmi.num_gmis, cfg.gmi.start_method = 4, gmis, method
        cfg.compile, cfg.log.tensorboard, cfg.checkpoint.every = compile_, False, 0
        cfg.total_timesteps = 2 * gmis * cfg.env.num_envs * cfg.algo.num_steps
        with tempfile.TemporaryDirectory() as tmp:
            cfg.run_dir = tmp
            validate(cfg)
            start = time.perf_counter()
            train(cfg)
            walls.append(time.perf_counter() - start)
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gmis", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true",
                        help="compile the gradient step (the default of a training run)")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one[0], int(args.one[1]), args.compile)))
        return
    print(f"PPO CartPole-v1, 4 envs per GMI, 2 iterations per run, compile "
          f"{'on' if args.compile else 'off'}; median of {args.repeats} fresh processes "
          f"(wall seconds of the whole run)\n")
    print("| GMIs | run | forkserver | spawn | spawn / forkserver |\n|---:|---|---:|---:|---:|")
    for gmis in args.gmis:
        walls: dict[str, list[list[float]]] = {m: [] for m in METHODS}
        for _ in range(args.repeats):
            for method in METHODS:
                cmd = [sys.executable, __file__, "--one", method, str(gmis)]
                out = subprocess.run(cmd + (["--compile"] if args.compile else []),
                                     capture_output=True, text=True, check=True)
                walls[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for i, label in enumerate(("first (server starts)", "later (server up)")):
            med = {m: statistics.median(w[i] for w in walls[m]) for m in METHODS}
            print(f"| {gmis} | {label} | {med['forkserver']:.2f} | {med['spawn']:.2f} | "
                  f"{med['spawn'] / med['forkserver']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
