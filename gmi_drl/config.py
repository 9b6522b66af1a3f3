"""Typed run configuration (parsed by tyro), presets per algorithm and task family, one `validate`.

Every field has a docstring (it becomes the ``--help`` text). Derived values (`batch_size`,
`num_iterations`) are properties, never fields patched after parsing; an algorithm's own derived
sizes and rules live in its config (`gmi_drl.algos.base.AlgoConfig`). PPO presets reproduce
CleanRL's hyper-parameters: ``classic`` = ``ppo.py``, ``mujoco`` = ``ppo_continuous_action.py``,
``atari`` = ``ppo_atari.py``; ``cartpole-zoo`` = RL-Zoo's ``CartPole-v1`` PPO entry (the
Stable-Baselines3 comparison); ``demo`` = a short Hopper run. A2C, DDPG, TD3 and SAC presets are
RL-Zoo's entries (the Stable-Baselines3 references; SAC's ``cleanrl`` is CleanRL's
``sac_continuous_action.py``); DQN's follow CleanRL and RL-Zoo, except
``cartpole`` and ``pong``, gmi-drl's settings that reach each issue target's return. Every
algorithm of the iSwitch paper (§5.1) has an ``iswitch`` preset: its workload and a
network of its model size (DQN Pong, A2C Qbert, PPO Hopper, DDPG HalfCheetah). ``gmi-ant`` and
``gmi-humanoid``, ``gmi-anymal``, ``gmi-ballbalance``, ``gmi-frankacabinet``, ``gmi-shadowhand``
are rl_games' IsaacGymEnvs settings for GMI-DRL's six Table 6 tasks (warp engine).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import logging
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Callable, Literal, Union

import gymnasium as gym
import tyro

from gmi_drl.algos import (ALGORITHMS, A2CConfig, A3CConfig, APPOConfig, DDPGConfig, DQNConfig,
                           ModelConfig, PPOConfig, SACConfig, TD3Config, algo_name, is_async)
from gmi_drl.algos.ddpg import DeterministicPGConfig, OffPolicyConfig
from gmi_drl.models.mlp import ACTIVATIONS, parse_layers
from gmi_drl.telemetry.profiler import ROLES, ProfilerConfig

AlgoUnion = Union[tuple(Annotated[cls, tyro.conf.subcommand(name, prefix_name=False)]
                        for name, (cls, _) in ALGORITHMS.items())]
"""the algorithm configs, one tyro subcommand each (``gmi-drl train ppo|...``)"""


@dataclass
class EnvConfig:
    """Which environments to run, and how many."""

    task_id: str = "CartPole-v1"
    """registered task or Gymnasium id, e.g. Hopper-v5 (EnvPool's term)"""
    num_envs: int = 4
    """sub-environments of each GMI's pool (B)"""
    num_workers: int | None = None
    """env worker processes/threads (None: the CPU cores this process may use, at most num_envs)"""
    engine: str = "auto"
    """the task's engine (auto: its fastest here; gmi_drl.envs.engines(task_id) lists a task's:
    native (C++), warp (the *-gmi-v0 tasks, whose worlds run on --device), numpy, ale (Atari),
    gymnasium (any Gymnasium id, in worker processes)"""


@dataclass
class NormConfig:
    """Running normalisation of what the envs return (the runner's, for every algorithm)."""

    obs: bool = False
    """normalise observations with running statistics (Gymnasium's NormalizeObservation, as
    CleanRL uses it; SB3's VecNormalize)"""
    reward: bool = False
    """scale rewards by the running std of the discounted return, zeroed at episode ends (SB3's
    VecNormalize; discounted with the algorithm's gamma)"""
    obs_clip: float = 10.0
    """clip normalised observations to [-obs_clip, obs_clip]"""
    reward_clip: float = 10.0
    """clip normalised rewards to [-reward_clip, reward_clip]"""


@dataclass
class CheckpointConfig:
    """When a run saves its state, and how many saves it keeps (``RUN_DIR/checkpoints/``)."""

    every: int = 10
    """iterations between checkpoints (0: only at the end)"""
    keep: int = 3
    """checkpoints kept, newest first (resuming falls back to an older one if the newest is
    corrupt)"""


@dataclass
class LogConfig:
    """What a run writes, and how often."""

    log_every: int = 1
    """iterations between metric rows and progress lines"""
    tensorboard: bool = True
    """also write TensorBoard event files"""
    timeline_detail_events: int = 20_000
    """budget of nested (per-step) events in timeline.json; top-level phases are always kept"""
    cpu_times: bool = False
    """also count the process's CPU seconds per phase (metrics ``perf/PHASE_cpu_s``): the
    resource share of simulator, agent and trainer that `gmi-drl tune`'s cost model needs"""
    gpu_util_interval_s: float = 1.0
    """seconds between GPU-utilisation samples (NVML, into gpu_util.csv) where NVML sees a GPU;
    0: off"""


@dataclass
class GMIConfig:
    """GPU multiplexing instances (GMI-DRL §3-§5): holistic training GMIs and their layout."""

    num_gmis: int = 1
    """holistic GMIs (simulator + agent + trainer each) reducing gradients every minibatch"""
    num_devices: int | None = None
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
    staleness: int = 0
    """staleness bound S of stale-sync training through the switch (iSwitch §4.1): a
    minibatch gradient may be computed on weights that miss the last S aggregated steps, so
    aggregation overlaps computation; 0 is synchronous; needs gmi.reduction switch"""
    netns: str | None = None
    """network namespaces, one per GMI joined by ',' (root): GMI k opens its sockets in the
    k-th, e.g. a worker host of an emulated rack (`gmi_drl.comm.switch.netns.Rack`); None: this
    process's"""
    serving_gmis: int = 1
    """async_training: serving GMIs (simulator + agent), each with env.num_envs envs"""
    trainer_gmis: int = 1
    """async_training: trainer GMIs; several reduce gradients among themselves (gmi.reduction)"""
    trainer_share: float | None = None
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
    fragments_per_transfer: int = 1
    """fragments the compressor joins into one transfer (multi)"""
    channel_slots: int = 4
    """transfers each channel holds before back-pressure"""
    backpressure: Literal["block", "drop_oldest"] = "block"
    """what a serving GMI does when a channel is full: wait (counted as blocked seconds) or
    overwrite the oldest transfer (counted as dropped)"""
    max_policy_lag: int | None = None
    """drop (and count) fragments whose policy_version is more than this many versions behind
    the trainer's; None: keep every fragment"""
    timeout_s: float = 120.0
    """a trainer that receives no experience for this long stops the run (trainers wait for
    each other inside a gradient reduction this long plus a minute)"""
    tolerate_serving_failures: bool = False
    """a serving GMI that dies, raises or hangs is logged and the run goes on with the others
    (local placement); False: any GMI failure stops the run"""
    env_splits: int = 1
    """double-buffered sampling (Sample Factory's worker_num_splits): each serving GMI steps
    env.num_envs / env_splits envs per pool in this many pools, and acts on one split while the
    pools' threads step the others (send/recv); 1: one pool, stepped in turn with acting"""


@dataclass
class RayConfig:
    """The Ray cluster a `--placement ray` run uses (one Ray actor per GMI)."""

    address: str | None = None
    """cluster to join: auto (the one `ray start --head` runs on this machine) or HOST:PORT of its
    head node; None starts a local Ray instance for the run"""
    max_restarts: int = 0
    """times every GMI is restarted from the last checkpoint after a GMI actor died or raised
    (0: the run stops with the error)"""
    num_cpus_per_gmi: float = 1.0
    """logical CPUs each GMI's placement bundle reserves"""
    placement_timeout_s: float = 120.0
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
    torch_threads: int = 1
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


def task_family(task_id: str) -> str:
    """``"mujoco"``, ``"atari"`` or ``"classic"`` (anything else), from the Gymnasium entry point
    of ``task_id`` or of ``ALE/<task_id>`` (gmi-drl's Atari ids drop the ``ALE/`` prefix)."""
    spec = gym.registry.get(task_id)
    if spec is None:
        import ale_py

        gym.register_envs(ale_py)
        spec = gym.registry.get(task_id) or gym.registry.get(f"ALE/{task_id}")
    entry = str(spec.entry_point) if spec is not None else ""
    if "mujoco" in entry:
        return "mujoco"
    if "ale_py" in entry:
        return "atari"
    return "classic"


def _ppo_classic() -> TrainConfig:
    return TrainConfig()


def _ppo_mujoco() -> TrainConfig:
    return TrainConfig(
        env=EnvConfig(task_id="Hopper-v5", num_envs=1),
        algo=PPOConfig(num_steps=2048, learning_rate=3e-4, num_minibatches=32, update_epochs=10,
                       ent_coef=0.0),
        norm=NormConfig(obs=True, reward=True), total_timesteps=1_000_000)


def _ppo_atari() -> TrainConfig:
    return TrainConfig(
        env=EnvConfig(task_id="Breakout-v5", num_envs=8),
        algo=PPOConfig(num_steps=128, learning_rate=2.5e-4, num_minibatches=4, update_epochs=4,
                       clip_coef=0.1, ent_coef=0.01),
        model=ModelConfig(encoder="nature_cnn"), total_timesteps=10_000_000,
        torch_threads=os.cpu_count() or 1)


def _ppo_cartpole_zoo() -> TrainConfig:
    return TrainConfig(
        env=EnvConfig(task_id="CartPole-v1", num_envs=8),
        algo=PPOConfig(num_steps=32, learning_rate=1e-3, gamma=0.98, gae_lambda=0.8,
                       num_minibatches=1, update_epochs=20, ent_coef=0.0, clip_vloss=False),
        total_timesteps=100_000)


def _ppo_demo() -> TrainConfig:
    cfg = _ppo_mujoco()
    cfg.env = EnvConfig(task_id="Hopper-v5", num_envs=8)
    cfg.algo.num_steps = 256
    cfg.total_timesteps = 300_000
    return cfg


def _ppo_gmi(task_id: str, num_steps: int, epochs: int, lr: float, hidden: str,
             norm_reward: bool = False):
    """rl_games' PPO settings of IsaacGymEnvs for a GMI-DRL Table 6 task on the warp engine:
    4,096 worlds, short rollouts, minibatches of 32,768, ELU networks of Table 6, observation
    normalisation (on the device with ``--device cuda``). ``norm_reward`` scales the rewards
    (`NormConfig.reward`), our stand-in for rl_games' value normalisation: on Ant (returns in
    the thousands) it doubled the return on an H200 (6,536 at 60M env steps, against 3,175 at
    57M without it; docs/benchmarks.md)."""
    def factory() -> TrainConfig:
        num_envs = 4096
        return TrainConfig(
            env=EnvConfig(task_id=task_id, num_envs=num_envs, engine="warp"),
            algo=PPOConfig(num_steps=num_steps, learning_rate=lr, gamma=0.99, gae_lambda=0.95,
                           num_minibatches=num_envs * num_steps // 32768,
                           update_epochs=epochs, ent_coef=0.0, max_grad_norm=1.0),
            model=ModelConfig(actor_hidden=hidden, critic_hidden=hidden, activation="elu"),
            norm=NormConfig(obs=True, reward=norm_reward), total_timesteps=50_000_000)
    return factory


def _few_steps_per_iteration() -> dict:
    """Metrics every 100 iterations and a checkpoint every 10,000: for off-policy presets whose
    iterations are a few env steps (a metrics row or a checkpoint per iteration would cost more
    than the iteration)."""
    return {"log": LogConfig(log_every=100), "checkpoint": CheckpointConfig(every=10_000)}


def _dqn_classic() -> TrainConfig:
    """CleanRL's ``dqn.py`` on CartPole-v1: its squared-error loss without gradient clipping
    (with DQNConfig's Huber loss and norm bound of 10 instead, Q diverged in a run of these
    settings: 1e5 at 100k steps, the policy stuck at a return of 10)."""
    return TrainConfig(env=EnvConfig(task_id="CartPole-v1", num_envs=1),
                       algo=DQNConfig(loss="mse", max_grad_norm=math.inf),
                       model=ModelConfig(critic_hidden="120:84", activation="relu"),
                       total_timesteps=500_000, **_few_steps_per_iteration())


def _dqn_cartpole() -> TrainConfig:
    """CartPole-v1 within 100k steps: DQN with a Polyak-averaged target (tau 0.02 every 4
    steps), 4 gradient steps of 64 every 4 env steps, Adam 5e-4, epsilon to 0.01 over the first
    10k steps, 256:256 ReLU. Measured: mean(last 20) >= 475 by 31.7k-71.0k steps on each of
    seeds 1-6 (docs/benchmarks.md); RL-Zoo's entry (``cartpole-zoo``) is tuned for 50k steps and
    is unstable after them."""
    return TrainConfig(
        env=EnvConfig(task_id="CartPole-v1", num_envs=1),
        algo=DQNConfig(learning_rate=5e-4, minibatch_size=64, buffer_size=50_000,
                       learning_starts=1000, train_frequency=4, gradient_steps=4,
                       target_network_frequency=4, tau=0.02, exploration_fraction=0.1,
                       end_e=0.01),
        model=ModelConfig(critic_hidden="256:256", activation="relu"), total_timesteps=100_000,
        **_few_steps_per_iteration())


def _dqn_cartpole_zoo() -> TrainConfig:
    """RL-Zoo's ``dqn.yml`` CartPole-v1 entry."""
    return TrainConfig(
        env=EnvConfig(task_id="CartPole-v1", num_envs=1),
        algo=DQNConfig(learning_rate=2.3e-3, minibatch_size=64, buffer_size=100_000,
                       learning_starts=1000, target_network_frequency=10, train_frequency=256,
                       gradient_steps=128, exploration_fraction=0.16, end_e=0.04),
        model=ModelConfig(critic_hidden="256:256", activation="relu"), total_timesteps=50_000)


def _dqn_atari() -> TrainConfig:
    """CleanRL's ``dqn_atari.py`` (Nature DQN), with a replay of 100k transitions per GMI (its
    1M would hold 56 GB of frames stored twice), and Nature DQN's Huber loss (its error
    clipping) with SB3's gradient-norm bound of 10 where CleanRL has squared error."""
    return TrainConfig(
        env=EnvConfig(task_id="Pong-v5", num_envs=1),
        algo=DQNConfig(learning_rate=1e-4, buffer_size=100_000, minibatch_size=32, end_e=0.01,
                       exploration_fraction=0.10, learning_starts=80_000, train_frequency=4,
                       target_network_frequency=1000),
        model=ModelConfig(encoder="nature_cnn"), total_timesteps=10_000_000,
        torch_threads=os.cpu_count() or 1, **_few_steps_per_iteration())


def _dqn_pong() -> TrainConfig:
    """Pong-v5 within 2M frames (500k env steps): the ``atari`` preset with 3-step returns,
    Adam 2.5e-4, learning from 20k steps and epsilon down to 0.01 over the first 20% of the run
    (100k steps). Measured on machine A (docs/benchmarks.md), seed 1: the mean of 20 games
    first reached 0 at 324k env steps (1.3M frames). The ``atari`` preset over 500k steps ended
    at -12.3. At 150k steps this preset was at -8.3; with Adam 1e-4 it was at -19.4, and with
    one-step targets at -16.8."""
    cfg = _dqn_atari()
    a = cfg.algo
    a.learning_rate, a.n_step, a.learning_starts, a.exploration_fraction = 2.5e-4, 3, 20_000, 0.2
    cfg.total_timesteps = 500_000
    return cfg


def _dqn_iswitch() -> TrainConfig:
    """iSwitch's DQN workload: Pong with the Nature DQN network (6.4 MiB of float32)."""
    return _dqn_atari()


def _ppo_iswitch() -> TrainConfig:
    """iSwitch's PPO workload: Hopper with 64:64 actor and critic (40 KB)."""
    cfg = _ppo_mujoco()
    cfg.env.num_envs = 8
    cfg.algo.num_steps = 256
    return cfg


def _a2c_classic() -> TrainConfig:
    """RL-Zoo's ``a2c.yml`` CartPole-v1 entry."""
    return TrainConfig(env=EnvConfig(task_id="CartPole-v1", num_envs=8),
                       algo=A2CConfig(ent_coef=0.0), total_timesteps=500_000,
                       **_few_steps_per_iteration())


def _a2c_atari() -> TrainConfig:
    """RL-Zoo's ``a2c.yml`` Atari entry (16 envs, 4 stacked frames, ``RMSpropTFLike`` with eps
    1e-5)."""
    return TrainConfig(
        env=EnvConfig(task_id="Breakout-v5", num_envs=16),
        algo=A2CConfig(ent_coef=0.01, vf_coef=0.25, optimizer="rmsprop_tf"),
        model=ModelConfig(encoder="nature_cnn"),
        total_timesteps=10_000_000, torch_threads=os.cpu_count() or 1,
        **_few_steps_per_iteration())


def _a2c_iswitch() -> TrainConfig:
    """iSwitch's A2C workload: Qbert, the Nature CNN with a 256-unit layer (3.4 MiB)."""
    cfg = _a2c_atari()
    cfg.env.task_id, cfg.model.cnn_features = "Qbert-v5", 256
    return cfg


def _continuous(algo: OffPolicyConfig, task_id: str, hidden: str, total: int) -> TrainConfig:
    return TrainConfig(env=EnvConfig(task_id=task_id, num_envs=1), algo=algo,
                       model=ModelConfig(actor_hidden=hidden, critic_hidden=hidden,
                                         activation="relu"),
                       total_timesteps=total, log=LogConfig(log_every=1000),
                       checkpoint=CheckpointConfig(every=min(50_000, total // 4)))


def _pendulum(cls: type[DeterministicPGConfig]) -> Callable[[], TrainConfig]:
    """RL-Zoo's ``ddpg.yml`` / ``td3.yml`` Pendulum-v1 entry."""
    return lambda: _continuous(cls(gamma=0.98, buffer_size=200_000, learning_starts=10_000),
                               "Pendulum-v1", "400:300", 20_000)


def _halfcheetah(cls: type[DeterministicPGConfig]) -> Callable[[], TrainConfig]:
    """RL-Zoo's ``ddpg.yml`` / ``td3.yml`` MuJoCo entry (HalfCheetah)."""
    return lambda: _continuous(cls(learning_starts=10_000), "HalfCheetah-v5", "400:300",
                               1_000_000)


def _ddpg_iswitch() -> TrainConfig:
    """iSwitch's DDPG workload: HalfCheetah, 128:128 actor and critic (157 KB together)."""
    cfg = _halfcheetah(DDPGConfig)()
    cfg.model.actor_hidden = cfg.model.critic_hidden = "128:128"
    return cfg


# SAC: RL-Zoo's sac.yml (learning_starts at least the minibatch: SACConfig's rule) and CleanRL's
# sac_continuous_action.py, 256:256 ReLU networks throughout
def _sac_classic() -> TrainConfig:
    """RL-Zoo's ``sac.yml`` Pendulum-v1 entry (lr 1e-3, 20k steps)."""
    return _continuous(SACConfig(learning_rate=1e-3), "Pendulum-v1", "256:256", 20_000)


def _sac_mujoco() -> TrainConfig:
    """RL-Zoo's ``sac.yml`` MuJoCo entry (HalfCheetah: learning_starts 10,000, 1M steps)."""
    return _continuous(SACConfig(learning_starts=10_000), "HalfCheetah-v5", "256:256",
                       1_000_000)


def _sac_cleanrl() -> TrainConfig:
    """CleanRL's ``sac_continuous_action.py`` (Hopper): actor 3e-4, critics and alpha 1e-3,
    two actor steps every second critic step, log std in [-5, 2] through tanh, 5,000 random
    steps, 1M steps."""
    return _continuous(SACConfig(learning_rate=1e-3, policy_learning_rate=3e-4,
                                 learning_starts=5_000, policy_delay=2, log_std_min=-5.0,
                                 log_std_tanh=True), "Hopper-v5", "256:256", 1_000_000)


def _appo_classic() -> TrainConfig:
    """CartPole-v1: 8 envs per serving GMI, fragments of 32 steps, 2 per batch."""
    return TrainConfig(env=EnvConfig(task_id="CartPole-v1", num_envs=8),
                       algo=APPOConfig(num_steps=32, fragments_per_batch=2, learning_rate=1e-3,
                                       gamma=0.98, num_minibatches=2, update_epochs=4),
                       total_timesteps=200_000, log=LogConfig(log_every=10))


def _appo_mujoco() -> TrainConfig:
    """Hopper-v5 with Sample Factory's MuJoCo choices (64:64 tanh, normalised observations and
    returns, Adam 3e-4, clip 0.2), batches of 4 fragments of 8 envs x 64 steps."""
    return TrainConfig(env=EnvConfig(task_id="Hopper-v5", num_envs=8),
                       algo=APPOConfig(num_steps=64, fragments_per_batch=4, num_minibatches=4,
                                       update_epochs=4, ent_coef=0.0),
                       norm=NormConfig(obs=True, reward=True), total_timesteps=1_000_000,
                       log=LogConfig(log_every=5))


def _appo_atari() -> TrainConfig:
    """Atari with the Nature CNN: 8 envs per serving GMI, fragments of 32 steps."""
    return TrainConfig(env=EnvConfig(task_id="Breakout-v5", num_envs=8),
                       algo=APPOConfig(num_steps=32, fragments_per_batch=2, learning_rate=2.5e-4,
                                       clip_coef=0.1, ent_coef=0.01, num_minibatches=2,
                                       update_epochs=2),
                       model=ModelConfig(encoder="nature_cnn"), total_timesteps=10_000_000,
                       torch_threads=os.cpu_count() or 1)


def _a3c_classic() -> TrainConfig:
    """CartPole-v1 with A2C's RL-Zoo settings (8 envs x 5 steps, RMSprop 7e-4, no entropy
    bonus), one fragment per update."""
    return TrainConfig(env=EnvConfig(task_id="CartPole-v1", num_envs=8),
                       algo=A3CConfig(num_steps=5, fragments_per_batch=1, ent_coef=0.0),
                       total_timesteps=500_000, **_few_steps_per_iteration())


def _a3c_atari() -> TrainConfig:
    """Atari with the Nature CNN and RL-Zoo's A2C Atari values (16 envs x 5 steps,
    ``RMSpropTFLike`` with eps 1e-5)."""
    return TrainConfig(env=EnvConfig(task_id="Breakout-v5", num_envs=16),
                       algo=A3CConfig(num_steps=5, fragments_per_batch=1, ent_coef=0.01,
                                      vf_coef=0.25, optimizer="rmsprop_tf"),
                       model=ModelConfig(encoder="nature_cnn"), total_timesteps=10_000_000,
                       torch_threads=os.cpu_count() or 1, **_few_steps_per_iteration())


PRESETS: dict[str, dict[str, Callable[[], TrainConfig]]] = {
    "ppo": {"classic": _ppo_classic, "mujoco": _ppo_mujoco, "atari": _ppo_atari,
            "cartpole-zoo": _ppo_cartpole_zoo, "demo": _ppo_demo, "iswitch": _ppo_iswitch,
            "gmi-ant": _ppo_gmi("Ant-gmi-v0", 16, 4, 3e-4, "256:128:64", norm_reward=True),
            "gmi-humanoid": _ppo_gmi("Humanoid-gmi-v0", 32, 5, 5e-4, "200:400:100"),
            "gmi-anymal": _ppo_gmi("Anymal-gmi-v0", 24, 5, 3e-4, "256:128:64"),
            "gmi-ballbalance": _ppo_gmi("BallBalance-gmi-v0", 16, 8, 3e-4, "256:128:64"),
            "gmi-shadowhand": _ppo_gmi("ShadowHand-gmi-v0", 8, 5, 5e-4, "512:512:512:256"),
            "gmi-frankacabinet": _ppo_gmi("FrankaCabinet-gmi-v0", 16, 8, 5e-4, "256:128:64")},
    "a2c": {"classic": _a2c_classic, "atari": _a2c_atari, "iswitch": _a2c_iswitch},
    "dqn": {"classic": _dqn_classic, "atari": _dqn_atari, "cartpole": _dqn_cartpole,
            "cartpole-zoo": _dqn_cartpole_zoo, "pong": _dqn_pong, "iswitch": _dqn_iswitch},
    "ddpg": {"classic": _pendulum(DDPGConfig), "mujoco": _halfcheetah(DDPGConfig),
             "iswitch": _ddpg_iswitch},
    "td3": {"classic": _pendulum(TD3Config), "mujoco": _halfcheetah(TD3Config)},
    "appo": {"classic": _appo_classic, "mujoco": _appo_mujoco, "atari": _appo_atari},
    "a3c": {"classic": _a3c_classic, "atari": _a3c_atari},
    "sac": {"classic": _sac_classic, "mujoco": _sac_mujoco, "cleanrl": _sac_cleanrl}}
"""``{algorithm: {preset name: factory}}``; ``classic``, ``mujoco`` and ``atari`` are the
defaults of each task family (``--preset auto``)"""


def preset(name: str, task_id: str | None = None, algo: str = "ppo") -> TrainConfig:
    """A fresh `TrainConfig` of preset ``name`` of algorithm ``algo`` (``"auto"``: a warp task's
    own ``gmi-*`` preset where ``algo`` has one, else the family of ``task_id``, or
    ``"classic"`` where ``algo`` has no preset of that family).

    ``task_id``, when given, replaces the preset's task.

    Raises:
        ConfigError: unknown algorithm or preset name.
    """
    if algo not in PRESETS:
        raise ConfigError(f"algo={algo!r} must be one of {list(PRESETS)}")
    if task_id is not None and not isinstance(task_id, str):
        raise ConfigError(f"task_id={task_id!r} must be a string, e.g. 'Hopper-v5'")
    if name == "auto":  # an algorithm without a preset of the task's family: its general one
        own = f"gmi-{task_id.split('-gmi-')[0].lower()}" if task_id and "-gmi-" in task_id else ""
        family = task_family(task_id) if task_id else "classic"
        name = own if own in PRESETS[algo] else family
        if name not in PRESETS[algo] or (own and name != own):  # (a warp task is "classic")
            made_for = PRESETS[algo]["classic"]().env.task_id
            logging.getLogger(__name__).warning(
                "%s has no preset for %s: %s starts from its 'classic' preset (settings made "
                "for %s); give flags or another --preset for what it needs", algo,
                task_id if own else f"{family} tasks", task_id, made_for)
            name = "classic"
    if name not in PRESETS[algo]:
        raise ConfigError(f"preset={name!r} must be one of {['auto', *PRESETS[algo]]} "
                          f"for {algo}")
    cfg = PRESETS[algo][name]()
    cfg.preset = name
    if task_id is not None:
        cfg.env.task_id = task_id
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Check every field and cross-field rule at once, before anything starts.

    Raises:
        InvalidConfig: listing every invalid field, one per line.
    """
    from gmi_drl.checkpoint import list_checkpoints
    from gmi_drl.envs import engines, list_tasks
    from gmi_drl.envs.builtin_tasks import mujoco_unavailable

    if not isinstance(cfg, TrainConfig):
        raise InvalidConfig(f"invalid config: {cfg!r} is no TrainConfig (gmi_drl.config.preset "
                          "makes one)")
    errors = field_type_errors(cfg)
    if any(not err.endswith("must be a finite number") for err in errors):
        # (the rules below compare values: they need the right types; NaN and inf compare)
        raise InvalidConfig("invalid config:\n  " + "\n  ".join(errors))
    non_finite = {err.split("=", 1)[0] for err in errors}
    e, m, lg, n = cfg.env, cfg.model, cfg.log, cfg.norm

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    known = e.task_id in list_tasks() or e.task_id in gym.registry
    no_mujoco = mujoco_unavailable()
    if not known:
        errors.append(f"env.task_id={e.task_id!r} is neither a gmi-drl task nor a Gymnasium id"
                      + (f" (or a MuJoCo task: {no_mujoco})" if no_mujoco else "")
                      + _nearest_task(e.task_id))
    try:
        names = engines(e.task_id) if known else []
    except ValueError as err:  # a MuJoCo task where MuJoCo does not import
        errors.append(f"env.{err}")
        names = []
    if names:
        need(e.engine == "auto" or e.engine in names,
             f"env.engine={e.engine!r} must be one of {['auto', *names]} for {e.task_id}")
    need(e.num_envs >= 1, f"env.num_envs={e.num_envs} must be >= 1")
    need(e.num_workers is None or 1 <= e.num_workers <= e.num_envs,
         f"env.num_workers={e.num_workers} must be in [1, env.num_envs={e.num_envs}] or None")
    errors += cfg.algo.validate(e.num_envs, cfg.gmi.num_gmis)
    starts = getattr(cfg.algo, "learning_starts", None)
    if starts is not None and e.num_envs >= 1 and cfg.total_timesteps >= cfg.batch_size:
        per_gmi = cfg.num_iterations * cfg.algo.steps_per_iteration(e.num_envs)
        need(starts <= per_gmi, f"algo.learning_starts={starts:,} env steps, but each GMI "
             f"takes {per_gmi:,}: nothing would be trained; lower --algo.learning-starts or "
             "raise --total-timesteps")
    _validate_gmi(cfg, need)
    _validate_placement(cfg, need)
    need(cfg.total_timesteps >= cfg.batch_size,
         f"total_timesteps={cfg.total_timesteps} must be >= batch_size={cfg.batch_size} "
         "(at least one iteration)")
    need(n.obs_clip > 0, f"norm.obs_clip={n.obs_clip} must be > 0")
    need(n.reward_clip > 0, f"norm.reward_clip={n.reward_clip} must be > 0")
    for name in ("actor_hidden", "critic_hidden"):
        value = getattr(m, name)
        try:
            parse_layers(f"1:{value}:1")  # the hidden sizes between the task's in and out
        except ValueError:
            errors.append(f"model.{name}={value!r} must be positive ints joined by ':' (e.g. '64:64')")
    need(m.activation in ACTIVATIONS,
         f"model.activation={m.activation!r} must be one of {sorted(ACTIVATIONS)}")
    need(m.cnn_features >= 1, f"model.cnn_features={m.cnn_features} must be >= 1")
    need(lg.log_every >= 1, f"log.log_every={lg.log_every} must be >= 1")
    ck = cfg.checkpoint
    need(ck.every >= 0, f"checkpoint.every={ck.every} must be >= 0 (0: only at the end)")
    need(ck.keep >= 1, f"checkpoint.keep={ck.keep} must be >= 1")
    need(lg.timeline_detail_events >= 0,
         f"log.timeline_detail_events={lg.timeline_detail_events} must be >= 0")
    need(lg.gpu_util_interval_s >= 0,
         f"log.gpu_util_interval_s={lg.gpu_util_interval_s} must be >= 0 (0: off)")
    _validate_profile(cfg, need)
    need(cfg.torch_threads >= 1, f"torch_threads={cfg.torch_threads} must be >= 1")
    # env i of the run (over its GMIs) is seeded seed + i: ALE's and the warp engine's seeds are
    # 31-bit, the other engines' 64-bit (and Gymnasium takes no negative ones)
    bits = 31 if known and (task_family(e.task_id) == "atari" or "warp" in (
        names[:1] if e.engine == "auto" else [e.engine])) else 62
    g = cfg.gmi
    envs = e.num_envs * (g.trainer_gmis + g.serving_gmis if cfg.is_async else g.num_gmis)
    need(0 <= cfg.seed <= 2**bits - envs,
         f"seed={cfg.seed} must be in [0, 2**{bits} - {envs}] (env i of the run's {envs} is "
         f"seeded seed + i, and {e.task_id}'s engine takes seeds below 2**{bits})")
    if cfg.device == "cuda":
        import torch

        need(torch.cuda.is_available(),
             "device='cuda' but torch sees no CUDA device (CPU build of torch, or no driver); "
             "use --device cpu")
    algo = algo_name(cfg.algo)
    need(cfg.preset == "auto" or cfg.preset in PRESETS.get(algo, {}),
         f"preset={cfg.preset!r} must be one of {['auto', *PRESETS.get(algo, {})]}")
    if cfg.resume is not None:  # (a run made from --config keeps that path in its config)
        need(os.path.exists(cfg.resume), f"resume={cfg.resume!r} does not exist")
    elif cfg.run_dir is not None and not cfg.run_dir.strip():
        errors.append(f"run_dir={cfg.run_dir!r} is empty: give a directory (or leave "
                      "--run-dir out for a new one under runs/)")
    elif cfg.run_dir is not None:
        # a run stopped before its first checkpoint holds nothing to continue: it starts over
        need(not list_checkpoints(cfg.run_dir),
             f"run_dir={cfg.run_dir!r} already holds a run with checkpoints; pass --resume "
             f"{cfg.run_dir} to continue it, or choose another --run-dir")
        dirs = [cfg.run_dir, os.path.join(cfg.run_dir, "checkpoints")]
        if cfg.profile.tool != "none":
            dirs.append(os.path.join(cfg.run_dir, "profile"))
        files = [d for d in dirs if os.path.exists(d) and not os.path.isdir(d)]
        need(not files, f"{files[0] if files else ''} is a file where the run writes a "
             "directory: move it, or choose another --run-dir")
    # a NaN or infinite field is named once, as such, not again by a rule it also breaks
    errors = [err for i, err in enumerate(errors)
              if i < len(non_finite) or err.split("=", 1)[0] not in non_finite]
    if errors:
        raise InvalidConfig("invalid config:\n  " + "\n  ".join(errors))


def _nearest_task(task_id: str) -> str:
    """`` (did you mean 'X'?)`` for the registered task nearest ``task_id``, else how to list
    them."""
    from gmi_drl.envs import list_tasks

    names = {name.lower(): name for name in [*gym.registry, *list_tasks()]}
    near = difflib.get_close_matches(task_id.lower(), names, n=1, cutoff=0.85)
    return (f" (did you mean {names[near[0]]!r}?)" if near else
            "; python -c 'import gmi_drl.envs as e; print(e.list_tasks())' lists gmi-drl's own")


_INF_MEANS_OFF = {"max_grad_norm"}
"""float fields that take ``inf`` for "no bound", whatever their default (so do those whose
default is ``inf``)"""


def field_type_errors(obj, prefix: str = "") -> list[str]:
    """Every field of the config dataclass ``obj`` (nested ones too) whose value does not fit
    its annotation (int, float, bool, str, a Literal's choices, ``X | None``), and every float
    that is NaN or infinite (``+inf`` only where it means "off": `_INF_MEANS_OFF`, and
    fields whose default is ``inf``);
    what a config file or the Python API can get wrong and the command line cannot."""
    errors = []
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, name = getattr(obj, f.name), prefix + f.name.rstrip("_")
        if dataclasses.is_dataclass(value):
            errors += field_type_errors(value, f"{name}.")
        elif _fits(value, hints.get(f.name)) is False:
            errors.append(f"{name}={value!r} must be {_describe(hints[f.name])}")
        elif isinstance(value, float) and not math.isfinite(value) and not (
                value > 0 and (f.name in _INF_MEANS_OFF or (
                    isinstance(f.default, float) and math.isinf(f.default)))):
            errors.append(f"{name}={value!r} must be a finite number")
    return errors


def _fits(value, hint) -> bool | None:
    """Whether ``value`` fits the annotation ``hint``; None where it is not checked."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a section: env, algo, ...
        return isinstance(value, hint)
    if origin is Literal:
        return value in args
    if origin in (Union, types.UnionType):
        fits = [_fits(value, a) for a in args]
        return True if True in fits else (False if all(x is False for x in fits) else None)
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        item = args[0] if len(args) == 1 or (len(args) == 2 and args[1] is ...) else None
        if item is None:
            return None
        fits = [_fits(v, item) for v in value]
        return False if False in fits else (None if None in fits else True)
    return None


def _describe(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin in (tuple, list) and args:
        plain = {bool: "booleans", int: "ints", float: "numbers", str: "strings"}
        return (f"a list of {plain[args[0]]}" if args[0] in plain
                else f"a list, each {_describe(args[0])}")
    return {bool: "true or false", int: "an int", float: "a number", str: "a string",
            type(None): "null"}.get(hint, getattr(hint, "__name__", str(hint)))


def _validate_gmi(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    g = cfg.gmi
    need(g.num_gmis >= 1, f"gmi.num_gmis={g.num_gmis} must be >= 1")
    spread, name = ((g.trainer_gmis, "gmi.trainer_gmis") if cfg.is_async
                    else (g.num_gmis, "gmi.num_gmis"))  # the GMIs num_devices lays out
    need(g.num_devices is None or 1 <= g.num_devices <= max(spread, 1),
         f"gmi.num_devices={g.num_devices} must be in [1, {name}={spread}] or None")
    if g.reduction == "switch":
        addrs = g.switch_addrs
        need(len(addrs) == max(g.num_gmis, 1) and all(_is_host_port(a) for a in addrs),
             f"gmi.switch_addr={g.switch_addr!r} must be HOST:PORT, or one HOST:PORT per GMI "
             f"joined by ',' ({g.num_gmis}), when gmi.reduction is switch")
        if cfg.placement != "ray":  # (a Ray cluster's GMIs resolve it on their own nodes)
            lost = sorted({a.rpartition(":")[0] for a in addrs if _is_host_port(a)
                           and not _resolves(a.rpartition(":")[0])})
            need(not lost, f"gmi.switch_addr={g.switch_addr!r}: {', '.join(lost)} does not "
                 "resolve here (a typo, or a name this host's DNS does not know?)")
    need(g.reduction == "switch" or (g.switch_job is None and not g.switch_token),
         f"gmi.switch_job / gmi.switch_token set, but gmi.reduction={g.reduction!r}; they are "
         "the run's credentials at the aggregation switch (gmi.reduction switch)")
    flags = _from_flags(cfg)
    need(not flags or g.reduction == "switch" or g.switch_addr is None,
         f"gmi.switch_addr set, but gmi.reduction={g.reduction!r}: add --gmi.reduction switch")
    need(not flags or g.reduction == "ps" or g.ps_addr is None,
         f"gmi.ps_addr set, but gmi.reduction={g.reduction!r}: add --gmi.reduction ps")
    if g.reduction == "ps":
        need(_is_host_port(g.ps_addr or ""), f"gmi.ps_addr={g.ps_addr!r} must be HOST:PORT when "
             "gmi.reduction is ps (start the server with `python -m gmi_drl.comm.ps --bind "
             "HOST:PORT --workers N`)")
    if g.netns is not None:
        names = g.netns_list
        need(len(names) == g.num_gmis, f"gmi.netns={g.netns!r} must name one network namespace "
             f"per GMI ({g.num_gmis}), joined by ','")
        missing = [n for n in names if not os.path.exists(os.path.join("/var/run/netns", n))]
        need(not missing, f"gmi.netns: no network namespace {missing} (make them with "
             "`ip netns add`, or `gmi_drl.comm.switch.netns.Rack`)")
        need(os.geteuid() == 0, "gmi.netns needs root (joining a network namespace)")
    need(g.reduction == "auto" or cfg.num_trainers >= 2,
         f"gmi.reduction={g.reduction!r} reduces between GMIs: needs "
         f"{'gmi.trainer_gmis' if cfg.is_async else 'gmi.num_gmis'} >= 2, not {cfg.num_trainers}")
    _validate_template(cfg, need)
    need(g.staleness >= 0, f"gmi.staleness={g.staleness} must be >= 0")
    need(g.staleness == 0 or g.reduction == "switch",
         f"gmi.staleness={g.staleness} needs gmi.reduction switch, not {g.reduction!r} "
         "(stale-sync training keeps aggregation rounds in flight at the switch; other "
         "reductions are synchronous collectives)")


def _validate_template(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    g, a, name = cfg.gmi, cfg.async_, algo_name(cfg.algo)
    if not cfg.is_async:
        changed = [f"async.{f.name}" for f in dataclasses.fields(AsyncConfig)
                   if getattr(a, f.name) != f.default]
        changed += [f"gmi.{n}" for n in ("serving_gmis", "trainer_gmis") if getattr(g, n) != 1]
        changed += ["gmi.trainer_share"] if g.trainer_share is not None else []
        need(not changed, f"{', '.join(changed)} set, but {name} runs in the sync_training "
             "template; use appo or a3c")
        return
    need(g.num_gmis == 1, f"gmi.num_gmis={g.num_gmis} is the holistic GMIs of sync_training; "
         "an async_training run has gmi.serving_gmis and gmi.trainer_gmis")
    need(g.serving_gmis >= 1, f"gmi.serving_gmis={g.serving_gmis} must be >= 1")
    need(g.trainer_gmis >= 1, f"gmi.trainer_gmis={g.trainer_gmis} must be >= 1")
    need(g.trainer_share is None or 0 < g.trainer_share < 1,
         f"gmi.trainer_share={g.trainer_share} must be in (0, 1) or None")
    need(g.reduction in ("auto", "mpr", "mrr", "har", "ring"),
         f"gmi.reduction={g.reduction!r}: trainer GMIs of an async_training run reduce with "
         "auto, mpr, mrr, har or ring")
    need(cfg.placement != "serial" or g.serving_gmis == g.trainer_gmis == 1,
         f"placement='serial' runs one serving and one trainer role in one process, not "
         f"gmi.serving_gmis={g.serving_gmis} and gmi.trainer_gmis={g.trainer_gmis}")
    need(cfg.profile.tool == "none", f"profile.tool={cfg.profile.tool!r}: capture ranges are "
         "per sync_training iteration; an async_training run writes its timeline.json only")
    from gmi_drl.comm.channels.fabric import channel_rules

    for rule in channel_rules(a.channel, a.fragments_per_transfer, a.channel_slots,
                              a.backpressure):
        need(False, rule)
    need(a.max_policy_lag is None or a.max_policy_lag >= 0,
         f"async.max_policy_lag={a.max_policy_lag} must be >= 0 or None")
    need(a.timeout_s > 0, f"async.timeout_s={a.timeout_s} must be > 0")
    need(a.env_splits >= 1 and cfg.env.num_envs % a.env_splits == 0,
         f"async.env_splits={a.env_splits} must be >= 1 and divide env.num_envs="
         f"{cfg.env.num_envs}")
    need(not a.tolerate_serving_failures or cfg.placement == "local",
         "async.tolerate_serving_failures needs a process per GMI (--placement local)")


def _validate_placement(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    g, r = cfg.gmi, cfg.ray
    if cfg.placement != "ray" and _from_flags(cfg):  # (a resumed Ray run keeps its ray.*)
        changed = [f"ray.{f.name}" for f in dataclasses.fields(RayConfig)
                   if getattr(r, f.name) != f.default]
        need(not changed, f"{', '.join(changed)} set but placement={cfg.placement!r}; add "
             "--placement ray")
    if cfg.placement == "serial":
        need(g.reduction in ("auto", "mpr", "switch", "ps"),
             f"gmi.reduction={g.reduction!r} with placement='serial': GMIs in one process "
             "reduce through shared memory (auto, mpr), the switch or a parameter server; the "
             "others need a process per GMI (--placement local)")
        need(g.netns is None, "gmi.netns needs a process per GMI (--placement local)")
        need(cfg.profile.tool == "none" or cfg.profile.all_ranks is False
             and len(cfg.profile.ranks) == 1,
             "placement='serial' profiles one GMI (the profilers are per process): give one "
             "--profile.ranks id")
    if cfg.placement != "ray":
        return
    need(importlib.util.find_spec("ray") is not None,
         "placement='ray' needs the ray package: pip install -e '.[ray]' in the checkout")
    if cfg.is_async:
        need(g.reduction == "auto", f"gmi.reduction={g.reduction!r} is for the local "
             "placement; on Ray the trainer GMIs of an async_training run reduce through a "
             "gloo ring wherever Ray placed them: use gmi.reduction auto")
    else:
        need(g.reduction in ("auto", "switch"), f"gmi.reduction={g.reduction!r} is for the "
             "local placement; on Ray the reduction follows the nodes (HAR across nodes, MPR "
             "within one): use gmi.reduction auto or switch")
    need(g.netns is None, "gmi.netns is for the local placement (namespaces of this machine)")
    need(len(set(g.switch_addrs)) <= 1, f"gmi.switch_addr={g.switch_addr!r}: with "
         "placement='ray' give one switch address for all GMIs")
    need(r.address is None or r.address == "auto" or _is_host_port(r.address),
         f"ray.address={r.address!r} must be auto or HOST:PORT (the head node's address)")
    need(r.max_restarts >= 0, f"ray.max_restarts={r.max_restarts} must be >= 0")
    need(r.num_cpus_per_gmi > 0, f"ray.num_cpus_per_gmi={r.num_cpus_per_gmi} must be > 0")
    need(r.placement_timeout_s > 0,
         f"ray.placement_timeout_s={r.placement_timeout_s} must be > 0")


def _validate_profile(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    pr = cfg.profile
    need(pr.tool in ("none", "nsys", "torch"),
         f"profile.tool={pr.tool!r} must be one of ['none', 'nsys', 'torch']")
    if pr.tool == "none":
        if _from_flags(cfg):
            default = ProfilerConfig()
            changed = [f"profile.{f.name}" for f in dataclasses.fields(pr)
                       if getattr(pr, f.name) != getattr(default, f.name)]
            need(not changed, f"{', '.join(changed)} set but profile.tool='none': add "
                 "--profile.tool torch (or nsys)")
        return
    need(pr.nvtx or pr.tool == "nsys" or not _from_flags(cfg),
         "profile.nvtx=False with profile.tool='torch': NVTX ranges are for nsys; drop "
         "--profile.no-nvtx")
    n_iter, n_gmis = cfg.num_iterations, cfg.gmi.num_gmis
    need(len(pr.iterations) > 0, "profile.iterations is empty: name the iterations to capture, "
         "e.g. --profile.iterations 3 4")
    bad = [s for s in pr.iterations if not 0 <= s < n_iter]
    need(not bad, f"profile.iterations={pr.iterations}: {bad} outside the run's iterations "
         f"[0, num_iterations={n_iter})")
    need(pr.all_ranks or len(pr.ranks) > 0,
         "profile.ranks is empty: name GMI ids (e.g. --profile.ranks 0) or pass --profile.all-ranks")
    bad = [r for r in pr.ranks if not 0 <= r < n_gmis]
    need(pr.all_ranks or not bad,
         f"profile.ranks={pr.ranks}: {bad} outside the GMI ids [0, gmi.num_gmis={n_gmis})")
    need(len(pr.roles) > 0 and set(pr.roles) <= set(ROLES),
         f"profile.roles={pr.roles} must be a non-empty subset of {list(ROLES)}")


def _from_flags(cfg: TrainConfig) -> bool:
    """Whether the config's fields are the user's flags over a preset: not a resumed run's or a
    ``--config`` file's, which carry fields the user did not give (checks that a field is set
    to no effect apply to flags only)."""
    return cfg.resume is None and cfg.config is None


def _resolves(host: str) -> bool:
    import socket

    try:
        socket.getaddrinfo(host, None)
        return True
    except (OSError, UnicodeError):
        return False


def _is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return (bool(host) and "/" not in host and port.isdigit()  # ("ray://h:p" is no HOST:PORT)
            and 0 < int(port) < 65536)


_NESTED = {"env": EnvConfig, "model": ModelConfig, "norm": NormConfig, "log": LogConfig,
           "checkpoint": CheckpointConfig, "gmi": GMIConfig, "profile": ProfilerConfig,
           "ray": RayConfig, "async_": AsyncConfig}


def to_dict(cfg: TrainConfig) -> dict:
    """The config as plain, strict-JSON data (what config.json and checkpoints hold); the
    algorithm's fields sit under its name: ``{"algo": {"ppo": {...}}, ...}``. An infinite
    float ("no bound", `_INF_MEANS_OFF`) is the string ``"inf"``: JSON has no infinity, and
    Python's ``Infinity`` token is refused by jq and most other readers."""
    data = dataclasses.asdict(cfg)
    data["algo"] = {algo_name(cfg.algo): data["algo"]}
    return _inf_as_text(data)


def _inf_as_text(data: dict) -> dict:
    return {k: _inf_as_text(v) if isinstance(v, dict)
            else ("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v)
            else v for k, v in data.items()}


def _inf_from_text(cls, fields: dict) -> dict:
    """``fields`` of dataclass ``cls`` with ``"inf"`` read back as a float where the field is one
    (`to_dict` writes it so); every other value as given, for `field_type_errors` to judge."""
    hints = typing.get_type_hints(cls)
    return {k: float(v) if hints.get(k) is float and v in ("inf", "-inf") else v
            for k, v in fields.items()}


def load_config_file(path: str) -> TrainConfig:
    """The config in JSON file ``path``: a run's ``config.json`` (`to_dict`) or a file with it
    under ``"config"`` (``tuned.json`` of `gmi-drl tune`); ``config`` is set to ``path``.

    Raises:
        ConfigError: a file that is missing, not JSON, or holds no config of this version.
    """
    import json

    try:
        data = json.loads(open(path).read())
    except OSError as e:
        raise ConfigError(f"--config {path}: {e.strerror}") from None
    except ValueError as e:
        raise ConfigError(f"--config {path} is not JSON ({e}); pass a run's config.json or "
                          "tuned.json from gmi-drl tune") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} holds no config object")
    # tuned.json holds the config under "config"; a run's config.json has a "config" field of
    # its own (the --config it was made from: a path or null)
    inner = data.get("config")
    try:
        cfg = from_dict(inner if isinstance(inner, dict) and "algo" in inner else data)
    except ConfigError as e:
        raise ConfigError(f"--config {path}: {str(e).removeprefix('config file: ')}") from None
    cfg.config, cfg.resume, cfg.run_dir = path, None, None
    return cfg


def overlay(base: dict, top: dict) -> dict:
    """``top``'s fields over ``base``'s, section by section (`to_dict` dicts; an ``algo``
    section that names another algorithm replaces the whole section): a resumed run's
    config.json over its checkpoint's config, so a field the file leaves out keeps the run's
    value."""
    out = dict(base)
    for key, value in top.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        if nested and key == "algo" and value.keys() != base[key].keys():
            nested = False
        out[key] = overlay(base[key], value) if nested else value
    return out


def from_dict(data: dict) -> TrainConfig:
    """Inverse of `to_dict`, with the field types checked (`field_type_errors`).

    Raises:
        ConfigError: unknown fields (with the nearest known name), a field of the wrong type,
            no or an unknown algorithm, or a section that is no object.
    """
    algo = data.get("algo") if isinstance(data, dict) else None
    if isinstance(algo, dict) and len(algo) > 1:
        raise ConfigError(f"the config's \"algo\" section names {len(algo)} algorithms "
                          f"({', '.join(map(repr, algo))}): it holds one, "
                          "{\"<name>\": {...fields}}")
    if not (isinstance(algo, dict) and len(algo) == 1):
        raise ConfigError("the config has no \"algo\": {\"<name>\": {...}} section: a config file "
                          "is a whole run config (a run's config.json, or tuned.json from "
                          "gmi-drl tune), not a few fields; give single fields as flags")
    (name, fields), = algo.items()
    if name not in ALGORITHMS:
        raise ConfigError(f"algo {name!r} is none of {list(ALGORITHMS)}")
    if not isinstance(fields, dict):
        raise ConfigError(f"algo.{name} must be an object of fields, not {fields!r}")
    errors = _unknown_fields(ALGORITHMS[name][0], fields, f"algo.{name}")
    errors += _unknown_fields(TrainConfig, {k: v for k, v in data.items() if k != "algo"}, "")
    for key, cls in _NESTED.items():
        if key in data:
            if not isinstance(data[key], dict):
                errors.append(f"{key} must be an object of fields, not {data[key]!r}")
            else:
                errors += _unknown_fields(cls, data[key], key)
    if errors:
        raise ConfigError("config file: " + "; ".join(errors))
    rest = {k: _NESTED[k](**_inf_from_text(_NESTED[k], v)) if k in _NESTED else v
            for k, v in data.items() if k != "algo"}
    algo_cls = ALGORITHMS[name][0]
    cfg = TrainConfig(algo=algo_cls(**_inf_from_text(algo_cls, fields)),
                      **_inf_from_text(TrainConfig, rest))
    # checked here too, not only in validate: a config becomes the CLI parser's defaults,
    # which warns about a mistyped default before validate could say what is wrong
    errors = field_type_errors(cfg)
    if errors:
        raise ConfigError("config file: " + "; ".join(errors))
    return cfg


def _unknown_fields(cls, given: dict, where: str) -> list[str]:
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    out = []
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(known)})"
            out.append(f"unknown field {where + '.' if where else ''}{key}{hint}")
    return out
