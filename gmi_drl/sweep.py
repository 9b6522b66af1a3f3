"""Many runs as GMIs: the seeds (and a grid of flag values) of one training command, each run
an independent GMI (no gradient reduction) that the GMI planner packs onto the machine: a set of
CPU cores each on a CPU, MPS or time slicing on a GPU (GMI-DRL §3's multiplexing, applied to
whole runs: one run of a moderate size leaves a device partly idle).

    gmi-drl train ppo --env.task-id Hopper-v5 --seeds 1-5
    gmi-drl train ppo --seeds 1-3 --sweep algo.learning-rate=1e-4,3e-4
    gmi-drl train ppo --seeds 1-8 --budget.threads-pct 12 --placement ray

Each run's GMI has a budget (`gmi_drl.gmi.budget`: MPS active threads and pinned memory, a MIG
instance, or CPU cores), checked against its device before any run starts; ``--placement ray``
starts the runs as Ray actors over a cluster instead of processes here.

Each run has its own run directory under the parent (``PARENT/seed-3``, or
``PARENT/algo.learning-rate=1e-4/seed-3`` in a sweep), its checkpoints and its ``--resume``; a run
that fails is reported and the others go on. The parent's ``summary.md`` gives, per
configuration, the final return's mean, interquartile mean (IQM) and 95% bootstrap confidence
interval over seeds (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice";
SciPy's ``bootstrap``), and the throughput of each run and of the whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from gmi_drl.config import ConfigError, RayConfig, TrainConfig
from gmi_drl.gmi.backends import BackendKind, MPSDaemon
from gmi_drl.gmi.budget import Budget, plan_runs
from gmi_drl.gmi.budget import describe as describe_budget
from gmi_drl.gmi.layout import Layout, Template

log = logging.getLogger(__name__)

TARGET = "gmi_drl.sweep:run_gmi"
PLACEMENTS = ("local", "ray")
"""where a sweep's GMIs run: processes on this machine, or Ray actors over the cluster"""
FINAL_EPISODES = 10
"""episodes whose mean is a run's final return (the iSwitch paper's metric)"""


def parse_seeds(text: str) -> list[int]:
    """``"1-8"``, ``"1,3,5"`` or ``"1-3,7"`` -> the seeds, in order, each once.

    Raises:
        ConfigError: not such a list of ints >= 0.
    """
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high or low)
            if first < 0 or last < first:
                raise ValueError
            seeds += [s for s in range(first, last + 1) if s not in seeds]
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: give seeds as 1-8, 1,3,5 or 1-3,7 (ints >= 0)")
    return seeds


_SET_PER_RUN = {
    "seed": "the seeds are --seeds (for example --seeds 1-5); each run's seed is its own",
    "run-dir": "each run's directory is PARENT/POINT/seed-K: name the parent with --run-dir",
    "resume": "a batch starts fresh runs: resume one run alone, gmi-drl train ALGO --resume "
              "PARENT/RUN",
}
"""flags a sweep sets for each run itself, which a grid must not name (its value would be
overridden without a word), with what to give instead"""


def parse_sweep(texts: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["algo.learning-rate=1e-4,3e-4", ...]`` -> ``[("algo.learning-rate", ["1e-4",
    "3e-4"]), ...]``: each flag with its values (the grid is their product).

    Raises:
        ConfigError: an item without ``=`` or values, a flag given twice, or a flag the sweep
            sets for each run (``seed``, ``run-dir``, ``resume``).
    """
    grid: list[tuple[str, list[str]]] = []
    for text in texts:
        name, _, values = text.partition("=")
        name = name.strip().removeprefix("--")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not name or not vals:
            raise ConfigError(f"--sweep {text!r}: give FLAG=V1,V2 (for example "
                              "algo.learning-rate=1e-4,3e-4)")
        if any(name == n for n, _ in grid):
            raise ConfigError(f"--sweep names {name} twice: give its values in one item")
        why = _SET_PER_RUN.get(name.replace("_", "-"))  # (tyro takes --run_dir too)
        if why is not None:
            raise ConfigError(f"--sweep {name}: {why}")
        grid.append((name, vals))
    return grid


def grid_points(grid: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Every point of ``grid``: ``(name, flags)``, the name ``"a=1,b=2"`` (``""`` for no
    grid) and the flags ``["--a", "1", "--b", "2"]``."""
    points = []
    for values in itertools.product(*(vals for _, vals in grid)):
        pairs = list(zip((n for n, _ in grid), values))
        points.append((",".join(f"{n}={v}" for n, v in pairs),
                       [x for n, v in pairs for x in (f"--{n}", v)]))
    return points


@dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: its configuration's name (``""`` without a grid), seed and
    validated config (``run_dir`` under the parent)."""

    point: str
    seed: int
    cfg: TrainConfig

    @property
    def name(self) -> str:
        return f"{self.point}/seed-{self.seed}" if self.point else f"seed-{self.seed}"


def check_runs(runs: Sequence[PlannedRun]) -> None:
    """Refuse what runs as GMIs cannot be (each run one GMI of its own, started here or, with
    ``--placement ray``, as a Ray actor).

    Raises:
        ConfigError: naming the first run that cannot.
    """
    for r in runs:
        c = r.cfg
        if (c.device, c.placement) != (runs[0].cfg.device, runs[0].cfg.placement):
            raise ConfigError(f"run {r.name}: the runs of one batch share one device and "
                              "placement (the planner packs them onto one backend): sweep "
                              "--device or --placement in separate commands")
        if c.is_async or c.gmi.num_gmis != 1:
            raise ConfigError(f"run {r.name}: --seeds runs each run as one GMI: give runs of "
                              "one holistic GMI (gmi.num_gmis 1, a sync_training algorithm)")
        if c.placement not in PLACEMENTS:
            raise ConfigError(f"run {r.name}: --seeds places its runs with placement local "
                              f"(this machine) or ray (the cluster), not {c.placement!r}")
        if c.placement == "ray" and c.ray.max_restarts:
            raise ConfigError(f"run {r.name}: --seeds does not restart runs on Ray (a run that "
                              "fails is reported while the others go on): drop "
                              "--ray.max-restarts, and resume a failed run alone")


def as_gmi(run: PlannedRun) -> PlannedRun:
    """``run`` as it trains inside its GMI: its one GMI in that process (placement local, no
    Ray settings: the sweep placed it), its run directory absolute (a Ray worker's working
    directory is not the driver's)."""
    cfg = dataclasses.replace(run.cfg, placement="local", ray=RayConfig(),
                              run_dir=str(Path(run.cfg.run_dir).resolve()))
    return dataclasses.replace(run, cfg=cfg)


@dataclass(frozen=True)
class RunOutcome:
    """What one run's GMI returns."""

    name: str
    run_dir: str
    global_step: int = 0
    wall_s: float = 0.0
    steady_sps: float = float("nan")
    final_return: float = float("nan")
    """mean return of its last `FINAL_EPISODES` episodes (nan: none ended)"""
    error: str = ""
    """why the run stopped, or ``""``"""
    curve: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0))
    """``(episode_steps (k,) int64, episode_returns (k,) float64)``: its learning curve"""


@dataclass(frozen=True)
class RunsSpec:
    """The payload of every run's GMI: the runs, by GMI id."""

    runs: tuple[PlannedRun, ...] = field(default_factory=tuple)


def run_gmi(ctx) -> RunOutcome:
    """GMI ``ctx.gmi_id``: train its run (`gmi_drl.train.train`, one GMI in this process).
    A run that stops on an expected failure returns its reason; the others go on."""
    from gmi_drl.checkpoint import CheckpointError
    from gmi_drl.runner.run import RunStopped
    from gmi_drl.train import train

    run = ctx.payload.runs[ctx.gmi_id]
    try:
        r = train(run.cfg)
    except RunStopped as e:
        return RunOutcome(run.name, str(run.cfg.run_dir), error=f"{e.reason} ({e.next_step})")
    except (ConfigError, CheckpointError) as e:
        return RunOutcome(run.name, str(run.cfg.run_dir), error=str(e))
    last = r.episode_returns[-FINAL_EPISODES:]
    return RunOutcome(run.name, str(r.run_dir), r.global_step, r.wall_s, r.steady_sps,
                      float(last.mean()) if len(last) else float("nan"),
                      curve=(r.episode_steps, r.episode_returns))


def train_runs(runs: Sequence[PlannedRun], parent: Path, budget: Budget = Budget()
               ) -> tuple[list[RunOutcome], float]:
    """Every run as a GMI of one launch (blocks), each within ``budget`` (`gmi_drl.gmi.budget`),
    on this machine or (the runs' ``placement`` ray) over the Ray cluster of their ``ray``
    settings; writes ``parent/summary.md``. Returns the outcomes (a run whose GMI died: an
    outcome with its error) and the wall seconds.

    Raises:
        ConfigError: a run that cannot run as a GMI (`check_runs`), a layout this machine
            cannot hold or a budget that does not fit it, before any run starts.
    """
    from gmi_drl.gmi.devices import discover, for_device

    check_runs(runs)
    machine = for_device(discover(), runs[0].cfg.device)
    layout = plan_runs(len(runs), machine, Template.SYNC_TRAINING, budget,
                       _backend(runs[0].cfg))
    if (layout.backend is BackendKind.CUDA_MPS and runs[0].cfg.placement == "local"
            and not MPSDaemon.available()):
        raise ConfigError(f"the runs share each GPU through MPS, but {MPSDaemon.BINARY} is not "
                          "on PATH: install the NVIDIA driver utilities, or give --gmi.backend "
                          "cuda_shared (time slicing, no budgets)")
    check_replays_fit(runs, layout, machine)
    parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    c = runs[0].cfg
    results, where = launch_runs(TARGET, layout, machine, RunsSpec(tuple(map(as_gmi, runs))),
                                 c.placement, c.ray, c.gmi.start_method)
    wall = time.perf_counter() - t0
    outcomes = [r if isinstance(r, RunOutcome) else
                RunOutcome(run.name, str(run.cfg.run_dir), error=r or "its GMI died (see the log)")
                for run, r in zip(runs, results)]
    (parent / "summary.md").write_text(summary(
        runs, outcomes, wall, layout.describe(reduction=False) + describe_budget(layout, machine)
        + where))
    plot_curves(runs, outcomes, parent / "learning_curves.png")
    return outcomes, wall


def check_replays_fit(runs: Sequence[PlannedRun], layout: Layout, machine) -> None:
    """Refuse runs whose replay buffers (``algo.buffer_size`` transitions each) together need
    more than the memory of the device they share: this machine's RAM for runs on the CPU, a
    GPU's free memory (NVML) for the runs the layout put on it; MIG instances are not checked
    (a slice's size is the backend's to know), nor runs on Ray (spread over nodes). Each run's
    own replay was checked against its device alone
    (`gmi_drl.runner.preflight.check_replay_memory`).

    Raises:
        ConfigError: naming the device, the runs' sum and what each needs.
    """
    from gmi_drl import envs
    from gmi_drl.rollout.replay import replay_nbytes

    if layout.backend is BackendKind.MIG or runs[0].cfg.placement == "ray":
        return  # (on Ray the runs spread over nodes whose tasks this process may not build)
    need: dict[int, list[tuple[str, int]]] = {}
    for run, spec in zip(runs, layout.specs):
        c = run.cfg
        size = getattr(c.algo, "buffer_size", None)
        if size is None:
            continue
        task = envs.task_spec(c.env.task_id, engine=c.env.engine)
        device = spec.device if layout.backend is not BackendKind.CPU else -1
        need.setdefault(device, []).append((run.name, replay_nbytes(size, task, c.env.num_envs)))
    for device, members in need.items():
        if device < 0:
            where = "this machine's RAM"
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        else:
            gpu = machine.gpus[device]
            total = gpu.memory_free_bytes or gpu.memory_bytes
            where = f"GPU {gpu.index}'s {'free ' if gpu.memory_free_bytes else ''}memory"
            if not total:
                continue
        if sum(b for _, b in members) > total:
            each = ", ".join(f"{name} {b / 2**30:,.1f}" for name, b in members)
            raise ConfigError(f"the replay buffers of the {len(members)} runs on {where} take "
                              f"{sum(b for _, b in members) / 2**30:,.1f} GiB together, more "
                              f"than its {total / 2**30:,.1f} GiB (GiB per run: {each}): lower "
                              "--algo.buffer-size, or run fewer at once")


def _backend(cfg: TrainConfig) -> str | None:
    return None if cfg.gmi.backend == "auto" else cfg.gmi.backend


def launch_runs(target: str, layout: Layout, machine, payload, placement: str, ray: RayConfig,
                start_method: str = "forkserver") -> tuple[list, str]:
    """Run ``target`` once per GMI of ``layout`` (independent GMIs: no reduction between them)
    with ``placement``: ``local`` processes started by ``start_method`` (a GMI that dies is
    ``None``, the others go on) or ``ray`` actors on ``ray``'s cluster (a GMI actor that dies
    stops the others: each GMI's result is then the error, a string). Returns the results by
    GMI id and markdown lines of where they ran.

    Raises:
        ConfigError: the Ray cluster cannot place the GMIs (too few resources, no cluster).
    """
    if placement == "ray":
        from gmi_drl.cluster.membership import describe
        from gmi_drl.cluster.ray_launcher import PlacementError
        from gmi_drl.cluster.ray_launcher import launch as ray_launch
        from gmi_drl.gmi.launcher import GMIError

        try:
            run = ray_launch(target, layout, payload, address=ray.address,
                             num_cpus_per_gmi=ray.num_cpus_per_gmi,
                             placement_timeout_s=ray.placement_timeout_s, reducer_capacity=1)
        except PlacementError as e:
            raise ConfigError(f"--placement ray: {e.summary}") from None
        except GMIError as e:
            log.warning("%s", e.summary)
            return [f"the Ray launch stopped: {e.summary}"] * layout.num_gmis, ""
        return run.results, describe(run.layout, run.nodes, run.restarts)
    from gmi_drl.gmi.launcher import launch

    results = launch(target, layout, machine, payload=payload, reducer_capacity=1,
                     tolerate=frozenset(range(layout.num_gmis)), start_method=start_method)
    return results, f"- placement: local, one process per GMI ({layout.num_gmis})\n"


def aggregate(returns: Sequence[float], seed: int = 0) -> dict[str, float]:
    """``mean``, ``iqm`` (the mean of the middle 50%) and the 95% percentile-bootstrap
    confidence interval of the IQM (``low``, ``high``; nan with fewer than 2 values) of the
    final returns of one configuration's seeds (Agarwal et al. 2021)."""
    from scipy import stats

    x = np.asarray([v for v in returns if np.isfinite(v)], np.float64)
    if len(x) == 0:
        return {"mean": float("nan"), "iqm": float("nan"), "low": float("nan"),
                "high": float("nan")}
    iqm = float(stats.trim_mean(x, 0.25))
    low = high = float("nan")
    if len(x) >= 2 and np.ptp(x) > 0:
        ci = stats.bootstrap((x,), lambda s, axis: stats.trim_mean(s, 0.25, axis=axis),
                             confidence_level=0.95, n_resamples=2000, method="percentile",
                             random_state=np.random.default_rng(seed)).confidence_interval
        low, high = float(ci.low), float(ci.high)
    return {"mean": float(x.mean()), "iqm": iqm, "low": low, "high": high}


def seed_rows(runs: Sequence[PlannedRun], outcomes: Sequence, value) -> list[str]:
    """A markdown table ``| configuration | seeds | mean | IQM | 95% CI of the IQM |``, a row
    per configuration (in the order of ``runs``), of ``value(outcome)`` over the
    configuration's runs that did not fail (``outcome.error`` empty); `aggregate` gives the
    figures."""
    rows = ["| configuration | seeds | mean | IQM | 95% CI of the IQM |", "|---|---:|---:|---:|---|"]
    for p in dict.fromkeys(r.point for r in runs):
        mine = [o for r, o in zip(runs, outcomes) if r.point == p and not o.error]
        a = aggregate([value(o) for o in mine])
        ci = "n/a" if np.isnan(a["low"]) else f"[{a['low']:.1f}, {a['high']:.1f}]"
        rows.append(f"| {p or 'the command'} | {len(mine)} | {a['mean']:.1f} | {a['iqm']:.1f} "
                    f"| {ci} |")
    return rows


def summary(runs: Sequence[PlannedRun], outcomes: Sequence[RunOutcome], wall_s: float,
            layout_text: str) -> str:
    """The parent's ``summary.md``: per configuration the aggregate over seeds, then every
    run, then how the runs were placed."""
    lines = [f"# {len(runs)} runs as GMIs: {runs[0].cfg.env.task_id}, "
             f"{type(runs[0].cfg.algo).__name__.removesuffix('Config')}", "",
             f"Final return: the mean of each run's last {FINAL_EPISODES} episodes; over seeds "
             "the mean, the interquartile mean (IQM) and its 95% percentile-bootstrap confidence "
             "interval (Agarwal et al. 2021).", ""]
    lines += seed_rows(runs, outcomes, lambda o: o.final_return)
    steps = sum(o.global_step for o in outcomes)
    lines += ["", f"Whole: {steps:,} env steps in {wall_s:.1f} s, {steps / wall_s:,.0f} env "
              "steps/s over every run.", "",
              "| run | final return | env steps | s | steady env steps/s | run dir |",
              "|---|---:|---:|---:|---:|---|"]
    for o in outcomes:
        if o.error:
            lines.append(f"| {o.name} | failed: {o.error} | | | | {o.run_dir} |")
        else:
            lines.append(f"| {o.name} | {o.final_return:.1f} | {o.global_step:,} | "
                         f"{o.wall_s:.1f} | {o.steady_sps:,.0f} | {o.run_dir} |")
    lines += ["", "## Placement", "", "- one GMI per run, no gradient reduction between them",
              layout_text.rstrip()]
    return "\n".join(lines) + "\n"


def plot_curves(runs: Sequence[PlannedRun], outcomes: Sequence[RunOutcome], path: Path,
                points: int = 100) -> None:
    """``path``: per configuration, the mean over seeds of the episode return (each run's
    episodes averaged in windows of ``points`` env-step bins, carried forward) with the band
    from the lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [(r, o) for r, o in zip(runs, outcomes) if not o.error and len(o.curve[0])]
    if not done:
        return
    grid = np.linspace(0, max(o.global_step for _, o in done), points + 1)[1:]
    fig, ax = plt.subplots(figsize=(7, 4))
    for p in dict.fromkeys(r.point for r, _ in done):
        ys = np.stack([_binned(o.curve, grid) for r, o in done if r.point == p])
        with warnings.catch_warnings():  # bins before any run's first episode: all nan, no line
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, low, high = np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
        line, = ax.plot(grid, mean, label=p or "mean over seeds")
        ax.fill_between(grid, low, high, alpha=0.2, color=line.get_color())
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _binned(curve: tuple[np.ndarray, np.ndarray], grid: np.ndarray) -> np.ndarray:
    """The mean return of the episodes that ended in each bin up to ``grid[i]``, the last
    bin's value carried forward where none ended (nan before the first episode)."""
    steps, returns = curve
    out = np.full(len(grid), np.nan)
    bins = np.searchsorted(grid, steps)
    for i in range(len(grid)):
        mine = returns[bins == i]
        out[i] = mine.mean() if len(mine) else (out[i - 1] if i else np.nan)
    return out

