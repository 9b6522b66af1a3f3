"""The run configuration's schema: one dataclass per section, parsed by tyro.

Every field has a docstring (it becomes the ``--help`` text) and its single-field bounds beside
its type (``Annotated[int, Ge(1)]``, `annotated_types`), which `gmi_drl.config.bounds` checks;
relations between fields are `gmi_drl.config.rules`'. Derived values (`batch_size`,
`num_iterations`) are properties, never fields patched after parsing; an algorithm's own
derived sizes and rules live in its config (`gmi_drl.algos.base.AlgoConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, Union

import tyro
from annotated_types import Ge, Gt, Interval

from gmi_drl.algos import ALGORITHMS, ModelConfig, PPOConfig, algo_name, is_async
from gmi_drl.telemetry.profiler import ProfilerConfig

AlgoUnion = Union[tuple(Annotated[cls, tyro.conf.subcommand(name, prefix_name=False)]
                        for name, (cls, _) in ALGORITHMS.items())]
"""the algorithm configs, one tyro subcommand each (``gmi-drl train ppo|...``)"""


@dataclass
class EnvConfig:
    """Which environments to run, and how many."""

    task_id: str = "CartPole-v1"
    """registered task or Gymnasium id, e.g. Hopper-v5 (EnvPool's term)"""
    num_envs: Annotated[int, Ge(1)] = 4
    """sub-environments of each GMI's pool (B)"""
    num_workers: Annotated[int, Ge(1)] | None = None
    """env worker processes/threads (None: the CPU cores this process may use, at most num_envs)"""
    engine: str = "auto"
    """the task's engine (auto: its fastest here; gmi_drl.envs.engines(task_id) lists a task's:
    native (C++), warp (the *-gmi-v0 tasks, whose worlds run on --device), numpy, ale (Atari),
    gymnasium (any Gymnasium id, in worker processes)"""
    max_episode_steps: Annotated[int, Ge(1)] | None = None
    """time limit of an episode, env steps (Gymnasium's max_episode_steps: an episode cut there
    is truncated, not terminated); None: the task's own"""

    def pool_kwargs(self) -> dict:
        """What `gmi_drl.envs.make` takes from these settings besides ``num_envs``: the engine
        and, where one is set, the time limit."""
        extra = {} if self.max_episode_steps is None else {
            "max_episode_steps": self.max_episode_steps}
        return {"engine": self.engine, **extra}


@dataclass
class NormConfig:
    """Running normalisation of what the envs return (the runner's, for every algorithm)."""

    obs: bool = False
    """normalise observations with running statistics (Gymnasium's NormalizeObservation, as
    CleanRL uses it; SB3's VecNormalize)"""
    reward: bool = False
    """scale rewards by the running std of the discounted return, zeroed at episode ends (SB3's
    VecNormalize; discounted with the algorithm's gamma)"""
    obs_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalised observations to [-obs_clip, obs_clip]"""
    reward_clip: Annotated[float, Gt(0)] = 10.0
    """clip normalised rewards to [-reward_clip, reward_clip]"""


@dataclass
class CheckpointConfig:
    """When a run saves its state, and how many saves it keeps (``RUN_DIR/checkpoints/``)."""

    every: Annotated[int, Ge(0)] = 10
    """iterations between checkpoints (0: only at the end)"""
    keep: Annotated[int, Ge(1)] = 3
    """checkpoints kept, newest first (resuming falls back to an older one if the newest is
    corrupt)"""


@dataclass
class LogConfig:
    """What a run writes, and how often."""

    log_every: Annotated[int, Ge(1)] = 1
    """iterations between metric rows and progress lines"""
    tensorboard: bool = True
    """also write TensorBoard event files"""
    timeline_detail_events: Annotated[int, Ge(0)] = 20_000
    """budget of nested (per-step) events in timeline.json; top-level phases are always kept"""
    cpu_times: bool = False
    """also count the process's CPU seconds per phase (metrics ``perf/PHASE_cpu_s``): the
    resource share of simulator, agent and trainer that `gmi-drl tune`'s cost model needs"""
    gpu_util_interval_s: Annotated[float, Ge(0)] = 1.0
    """seconds between GPU-utilisation samples (NVML, into gpu_util.csv) where NVML sees a GPU;
    0: off"""


@dataclass
class GMIConfig:
    """GPU multiplexing instances (GMI-DRL §3-§5): holistic training GMIs and their layout."""

    num_gmis: Annotated[int, Ge(1)] = 1
    """holistic GMIs (simulator + agent + trainer each) reducing gradients every minibatch"""
    num_devices: Annotated[int, Ge(1)] | None = None
    """devices the GMIs are spread over (None: every GPU, or one CPU device); on CPU a larger
    value emulates devices as groups of processes"""
    backend: Literal["auto", "cpu", "cuda_shared", "cuda_mps", "mig"] = "auto"
    """GMI backend (auto: GMI-DRL §3's rule: MPS for training, CPU core sets without a GPU)"""
    reduction: Literal["auto", "mpr", "mrr", "har", "ring", "switch", "ps"] = "auto"
    """how GMIs average gradients: auto (GMI-DRL Algorithm 1 picks mpr, mrr or har from the
    layout), one of those three forced, ring (one gloo/NCCL ring over all GMIs: the iSwitch
    paper's AllReduce baseline), switch (the iSwitch aggregation switch at gmi.switch_addr,
    started with `gmi-drl switch serve`) or ps (a parameter server at gmi.ps_addr, started with
    `python -m gmi_drl.comm.ps`: the iSwitch paper's PS baseline)"""
    switch_addr: str | None = None
    """HOST:PORT of the aggregation switch (gmi.reduction switch), or one per GMI joined by ','
    (each GMI's own switch port, as in a rack)"""
    switch_job: str | None = None
    """the run's job id at the switch (None: a new one per launch); a switch started with
    --job-id serves only that job"""
    switch_token: str = ""
    """the shared secret of a switch started with --token"""
    ps_addr: str | None = None
    """HOST:PORT of the parameter server (gmi.reduction ps)"""
    staleness: Annotated[int, Ge(0)] = 0
    """staleness bound S of asynchronous training; 0 is synchronous. With gmi.reduction switch,
    stale-sync training (iSwitch §4.1): a minibatch gradient may be computed on weights that
    miss the last S aggregated steps, so aggregation overlaps computation. With gmi.reduction
    ps, Async PS (iSwitch §2.2, §6.2): the parameter server applies each GMI's update as it
    arrives unless the weights it was computed on are more than S versions old (then it drops
    and counts it). Other reductions: must be 0"""
    threshold: Annotated[int, Ge(1)] | None = None
    """aggregation threshold H of Async iSwitch (iSwitch §3.2 SetH, §4.1 Fig. 11): the switch
    broadcasts once H gradients of any GMIs arrived (a fast GMI may give several), and drops a
    gradient older than gmi.staleness aggregates; 1 <= H <= the trainer GMIs; H < their number
    needs gmi.staleness >= 1. None: every aggregate holds one gradient of every GMI (H = N,
    stale-sync). Needs gmi.reduction switch"""
    netns: str | None = None
    """network namespaces, one per GMI joined by ',' (root): GMI k opens its sockets in the
    k-th, e.g. a worker host of an emulated rack (`gmi_drl.comm.switch.netns.Rack`); None: this
    process's"""
    serving_gmis: Annotated[int, Ge(1)] = 1
    """async_training: serving GMIs (simulator + agent), each with env.num_envs envs"""
    trainer_gmis: Annotated[int, Ge(1)] = 1
    """async_training: trainer GMIs; several reduce gradients among themselves (gmi.reduction)"""
    trainer_share: Annotated[float, Interval(gt=0, lt=1)] | None = None
    """async_training: the share of the GPUs (with two or more) or CPU cores the trainer GMIs
    get, the serving GMIs the rest; None: GPUs in proportion to the GMI counts, CPU cores shared
    by every GMI"""
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    """how the local placement starts GMI processes: forkserver (forked from a server that
    imported torch and the GMI loops once per gmi-drl process, so a GMI does not import them
    itself) or spawn (a fresh interpreter per GMI); a GMI under a profiler is always spawned"""

    @property
    def switch_addrs(self) -> tuple[str, ...]:
        """``switch_addr`` for each GMI (one address given: the same for all)."""
        addrs = tuple(a.strip() for a in (self.switch_addr or "").split(",") if a.strip())
        return addrs * self.num_gmis if len(addrs) == 1 else addrs

    @property
    def service_addrs(self) -> tuple[str, ...]:
        """The ``HOST:PORT`` each GMI aggregates through: its switch (``switch``), the
        parameter server (``ps``); none for the other reductions."""
        if self.reduction == "switch":
            return self.switch_addrs
        if self.reduction == "ps":
            return (self.ps_addr or "",) * self.num_gmis
        return ()

    @property
    def netns_list(self) -> tuple[str, ...] | None:
        """``netns`` split per GMI, or None."""
        return None if self.netns is None else tuple(n.strip() for n in self.netns.split(","))


@dataclass
class AsyncConfig:
    """Experience sharing of the async_training template (GMI-DRL §4.2)."""

    channel: Literal["multi", "uni"] = "multi"
    """multi: one channel per field (MCC, the paper's design); uni: each env step's whole
    experience tuple as one message (UCC, the paper's Fig. 5(b) baseline)"""
    fragments_per_transfer: Annotated[int, Ge(1)] = 1
    """fragments the compressor joins into one transfer (multi)"""
    channel_slots: Annotated[int, Ge(1)] = 4
    """transfers each channel holds before back-pressure"""
    backpressure: Literal["block", "drop_oldest"] = "block"
    """what a serving GMI does when a channel is full: wait (counted as blocked seconds) or
    overwrite the oldest transfer (counted as dropped)"""
    max_policy_lag: Annotated[int, Ge(0)] | None = None
    """drop (and count) fragments whose policy_version is more than this many versions behind
    the trainer's; None: keep every fragment"""
    timeout_s: Annotated[float, Gt(0)] = 120.0
    """a trainer that receives no experience for this long stops the run (trainers wait for
    each other inside a gradient reduction this long plus a minute)"""
    tolerate_serving_failures: bool = False
    """a serving GMI that dies, raises or hangs is logged and the run goes on with the others
    (local placement); False: any GMI failure stops the run"""
    env_splits: Annotated[int, Ge(1)] = 1
    """double-buffered sampling (Sample Factory's worker_num_splits): each serving GMI steps
    env.num_envs / env_splits envs per pool in this many pools, and acts on one split while the
    pools' threads step the others (send/recv); 1: one pool, stepped in turn with acting"""
    lockstep: bool = False
    """serving fragment f is acted with the weights of update f // fragments_per_batch exactly
    (the serving GMI waits for them), so that a run of processes acts and learns as the serial
    placement does, which always runs in lock-step (one serving and one trainer GMI; for
    debugging and tests: the serving GMI waits for every update)"""


@dataclass
class RayConfig:
    """The Ray cluster a `--placement ray` run uses (one Ray actor per GMI)."""

    address: str | None = None
    """cluster to join: auto (the one `ray start --head` runs on this machine) or HOST:PORT of its
    head node; None starts a local Ray instance for the run"""
    max_restarts: Annotated[int, Ge(0)] = 0
    """times every GMI is restarted from the last checkpoint after a GMI actor died or raised
    (0: the run stops with the error)"""
    num_cpus_per_gmi: Annotated[float, Gt(0)] = 1.0
    """logical CPUs each GMI's placement bundle reserves"""
    placement_timeout_s: Annotated[float, Gt(0)] = 120.0
    """seconds Ray may take to place and start the GMIs before the run is refused"""


@dataclass
class TrainConfig:
    """A training run: `gmi-drl train ALGO [--flags]`."""

    algo: AlgoUnion = field(default_factory=PPOConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    gmi: GMIConfig = field(default_factory=GMIConfig)
    profile: ProfilerConfig = field(default_factory=ProfilerConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    async_: Annotated[AsyncConfig, tyro.conf.arg(name="async")] = field(
        default_factory=AsyncConfig)
    placement: Literal["serial", "local", "ray"] = "local"
    """where the GMIs run: serial (all in this process, one thread each, env workers in-process
    too: for debugging), local (one process per GMI on this machine; a lone sync_training GMI
    runs in this process) or ray (one Ray actor per GMI, on the cluster of ray.address)"""
    total_timesteps: int = 500_000
    """env steps over all envs and GMIs (global_step at the end; rounded down to iterations;
    async: samples the trainer GMIs train on)"""
    seed: int = 1
    """seed of torch (weights, actions, minibatches) and of the envs (env i gets seed + i), in
    [0, 2**31)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where each GMI's learner, rollout storage and normalisers live; the envs step on the CPU,
    except the warp engine's, which step there too (cuda: the GMI's GPU, as its backend made it
    visible)"""
    compile: bool = True
    """compile gradient steps (and acting without a NumPy path) with torch.compile; a few
    seconds at start, then faster steps"""
    cuda_graphs: bool = True
    """with compile and device cuda: replay each gradient step as one CUDA graph (one launch
    instead of dozens for a small network); ignored elsewhere"""
    precision: Literal["fp32", "bf16-mixed"] = "fp32"
    """what gradient steps compute in: fp32, or bf16-mixed (forward and backward under autocast
    to bfloat16, weights and optimizer in float32: about 1.4x faster steps of 256-wide networks
    on a CPU with AVX512-BF16 or AMX, and on GPUs from Ampere on)"""
    torch_threads: Annotated[int, Ge(1)] = 1
    """learner compute threads: torch intra-op and NumPy's BLAS (1 is fastest for small MLPs on a
    few cores, where more threads only compete with the env engine's)"""
    run_dir: str | None = None
    """run directory (None: runs/<task>-<algo>-<YYYYmmdd-HHMMSS>)"""
    preset: str = "auto"
    """preset the defaults came from (auto: a warp task's gmi-* preset, else by task family);
    set on the command line only"""
    resume: str | None = None
    """run directory (or checkpoint file) to continue from; its config is the default"""
    config: str | None = None
    """JSON file whose config is the default (a run's config.json, or tuned.json from
    `gmi-drl tune`); flags after it override it; set on the command line only"""

    @property
    def algo_name(self) -> str:
        """The algorithm's subcommand name, e.g. ``"ppo"``."""
        return algo_name(self.algo)

    @property
    def is_async(self) -> bool:
        """Whether the run uses the async_training template (GMI-DRL §5.1: decoupled serving
        and trainer GMIs, experience through channels: APPO, A3C) rather than sync_training
        (holistic GMIs: PPO, A2C, DQN, DDPG, TD3, SAC): its algorithm's."""
        return is_async(self.algo)

    @property
    def num_trainers(self) -> int:
        """GMIs that update weights: every GMI (sync), the trainer GMIs (async)."""
        return self.gmi.trainer_gmis if self.is_async else self.gmi.num_gmis

    @property
    def batch_size(self) -> int:
        """Env steps (samples) per iteration over all GMIs (async: trained on, over every
        trainer GMI)."""
        return self.algo.steps_per_iteration(self.env.num_envs) * self.num_trainers

    @property
    def num_iterations(self) -> int:
        """Iterations in the run: ``total_timesteps // batch_size``."""
        return self.total_timesteps // max(self.batch_size, 1)


class ConfigError(ValueError):
    """One or more invalid fields; the message names every one of them."""


class InvalidConfig(ConfigError):
    """What `validate` raises: fields that cannot hold whatever the task or the machine."""
