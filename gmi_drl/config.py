"""Typed run configuration (parsed by tyro), presets per task family, and one `validate`.

Every field has a docstring (it becomes the ``--help`` text). Derived values (`batch_size`,
`minibatch_size`, `num_iterations`) are properties, never fields patched after parsing.
Presets reproduce CleanRL's hyper-parameters: ``classic`` = ``ppo.py``, ``mujoco`` =
``ppo_continuous_action.py``, ``atari`` = ``ppo_atari.py``; ``cartpole-zoo`` = RL-Zoo's
``CartPole-v1`` PPO entry (the Stable-Baselines3 comparison); ``demo`` = a short Hopper run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Callable, Literal

import gymnasium as gym

from gmi_drl.algos.ppo import PPOConfig
from gmi_drl.models.mlp import ACTIVATIONS, parse_layers
from gmi_drl.telemetry.profiler import ROLES, ProfilerConfig


@dataclass
class EnvConfig:
    """Which environments to run, and how many."""

    task_id: str = "CartPole-v1"
    """registered task or Gymnasium id, e.g. Hopper-v5 (EnvPool's term)"""
    num_envs: int = 4
    """sub-environments stepped together (B)"""
    num_workers: int | None = None
    """env worker processes/threads (None: the CPU cores this process may use, at most num_envs)"""


@dataclass
class ModelConfig:
    """Network shapes; input and output sizes come from the task's spaces."""

    encoder: Literal["mlp", "nature_cnn"] = "mlp"
    """separate actor/critic MLPs (flat obs) or a shared Nature CNN (84x84 frames)"""
    actor_hidden: str = "64:64"
    """hidden sizes of the actor MLP, ':'-joined (paper Table 6 notation)"""
    critic_hidden: str = "64:64"
    """hidden sizes of the critic MLP, ':'-joined"""
    activation: str = "tanh"
    """MLP activation: tanh, relu or elu"""


@dataclass
class LogConfig:
    """What a run writes, and how often."""

    log_every: int = 1
    """updates between metric rows and progress lines"""
    checkpoint_every: int = 10
    """updates between checkpoints (0: only at the end)"""
    tensorboard: bool = True
    """also write TensorBoard event files"""
    timeline_detail_events: int = 20_000
    """budget of nested (per-step) events in timeline.json; top-level phases are always kept"""
    gpu_util_interval_s: float = 1.0
    """seconds between GPU-utilisation samples (NVML, into gpu_util.csv) where NVML sees a GPU;
    0: off"""


@dataclass
class GMIConfig:
    """GPU multiplexing instances (GMI-DRL §3-§5): holistic training processes and their layout."""

    num_gmis: int = 1
    """holistic GMIs (simulator + agent + trainer each) reducing gradients every minibatch;
    1 trains in this process"""
    num_devices: int | None = None
    """devices the GMIs are spread over (None: every GPU, or one CPU device); on CPU a larger
    value emulates devices as groups of processes"""
    backend: Literal["auto", "cpu", "cuda_shared", "cuda_mps", "mig"] = "auto"
    """GMI backend (auto: GMI-DRL §3's rule: MPS for training, CPU core sets without a GPU)"""
    reducer: Literal["auto", "ring", "switch"] = "auto"
    """gradient reduction: auto (Algorithm 1: mpr / mrr / har), ring (one gloo/NCCL ring over
    all GMIs: the iSwitch paper's AllReduce baseline) or switch (iSwitch aggregation switch at
    gmi.switch_addr, started with `gmi-drl switch serve`)"""
    switch_addr: str | None = None
    """HOST:PORT of the aggregation switch (gmi.reducer switch), or one per GMI joined by ','
    (each GMI's own switch port, as in a rack)"""
    staleness: int = 0
    """staleness bound S of asynchronous training through the switch (iSwitch §4.1): a
    minibatch gradient may be computed on weights that miss the last S aggregated updates, so
    aggregation overlaps computation; 0 is synchronous; needs gmi.reducer switch"""
    netns: str | None = None
    """network namespaces, one per GMI joined by ',' (root): GMI k opens its sockets in the
    k-th, e.g. a worker host of an emulated rack (`gmi_drl.comm.switch.netns.Rack`); None: this
    process's"""

    @property
    def switch_addrs(self) -> tuple[str, ...]:
        """``switch_addr`` for each GMI (one address given: the same for all)."""
        addrs = tuple(a.strip() for a in (self.switch_addr or "").split(",") if a.strip())
        return addrs * self.num_gmis if len(addrs) == 1 else addrs

    @property
    def netns_list(self) -> tuple[str, ...] | None:
        """``netns`` split per GMI, or None."""
        return None if self.netns is None else tuple(n.strip() for n in self.netns.split(","))


@dataclass
class RayConfig:
    """The Ray cluster a `--launcher ray` run uses (one Ray actor per GMI)."""

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
    """A training run: `gmi-drl train ppo [--flags]`."""

    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    log: LogConfig = field(default_factory=LogConfig)
    gmi: GMIConfig = field(default_factory=GMIConfig)
    profile: ProfilerConfig = field(default_factory=ProfilerConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    launcher: Literal["local", "ray"] = "local"
    """where the GMIs run: local (one process each on this machine) or ray (one Ray actor each,
    on the cluster of ray.address)"""
    algo: Literal["ppo"] = "ppo"
    """the algorithm"""
    total_timesteps: int = 500_000
    """env steps over all envs (global_step at the end; rounded down to whole updates)"""
    seed: int = 1
    """seed of torch (weights, actions, minibatches) and of the envs (env i gets seed + i)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where the learner's update runs; rollouts and inference stay on the CPU next to the envs
    (cuda: the GMI's GPU, as its backend made it visible)"""
    torch_threads: int = 1
    """learner compute threads: torch intra-op and NumPy's BLAS (1 is fastest for small MLPs on a
    few cores, where more threads only compete with the env engine's)"""
    serial: bool = False
    """run every role in one process: generic Gymnasium tasks step in-process, not in workers"""
    run_dir: str | None = None
    """run directory (None: runs/<task>-<algo>-<YYYYmmdd-HHMMSS>)"""
    preset: str = "auto"
    """preset the defaults came from (auto: by task family); set on the command line only"""
    resume: str | None = None
    """run directory (or checkpoint file) to continue from; its config is the default"""

    @property
    def gmi_batch_size(self) -> int:
        """Samples one GMI's learner updates on: ``env.num_envs * ppo.num_steps``."""
        return self.env.num_envs * self.ppo.num_steps

    @property
    def batch_size(self) -> int:
        """Samples per update over all GMIs: ``gmi_batch_size * gmi.num_gmis``."""
        return self.gmi_batch_size * self.gmi.num_gmis

    @property
    def minibatch_size(self) -> int:
        """Samples per gradient step over all GMIs (each GMI holds ``1 / num_gmis`` of them)."""
        return self.batch_size // max(self.ppo.num_minibatches, 1)

    @property
    def num_iterations(self) -> int:
        """Updates in the run: ``total_timesteps // batch_size``."""
        return self.total_timesteps // max(self.batch_size, 1)


class ConfigError(ValueError):
    """One or more invalid fields; the message names every one of them."""


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


def _classic() -> TrainConfig:
    return TrainConfig()


def _mujoco() -> TrainConfig:
    return TrainConfig(
        env=EnvConfig(task_id="Hopper-v5", num_envs=1),
        ppo=PPOConfig(num_steps=2048, learning_rate=3e-4, num_minibatches=32, update_epochs=10,
                      ent_coef=0.0, norm_obs=True, norm_reward=True),
        total_timesteps=1_000_000)


def _atari() -> TrainConfig:
    return TrainConfig(
        env=EnvConfig(task_id="Breakout-v5", num_envs=8),
        ppo=PPOConfig(num_steps=128, learning_rate=2.5e-4, num_minibatches=4, update_epochs=4,
                      clip_coef=0.1, ent_coef=0.01),
        model=ModelConfig(encoder="nature_cnn"), total_timesteps=10_000_000,
        torch_threads=os.cpu_count() or 1)


def _cartpole_zoo() -> TrainConfig:
    return TrainConfig(
        env=EnvConfig(task_id="CartPole-v1", num_envs=8),
        ppo=PPOConfig(num_steps=32, learning_rate=1e-3, gamma=0.98, gae_lambda=0.8,
                      num_minibatches=1, update_epochs=20, ent_coef=0.0, clip_vloss=False),
        total_timesteps=100_000)


def _demo() -> TrainConfig:
    cfg = _mujoco()
    cfg.env = EnvConfig(task_id="Hopper-v5", num_envs=8)
    cfg.ppo.num_steps = 256
    cfg.total_timesteps = 300_000
    return cfg


PRESETS = {"classic": _classic, "mujoco": _mujoco, "atari": _atari,
           "cartpole-zoo": _cartpole_zoo, "demo": _demo}


def preset(name: str, task_id: str | None = None) -> TrainConfig:
    """A fresh `TrainConfig` of preset ``name`` (``"auto"``: the family of ``task_id``).

    ``task_id``, when given, replaces the preset's task.

    Raises:
        ConfigError: unknown preset name.
    """
    if name == "auto":
        name = task_family(task_id) if task_id else "classic"
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} must be one of {['auto', *PRESETS]}")
    cfg = PRESETS[name]()
    cfg.preset = name
    if task_id is not None:
        cfg.env.task_id = task_id
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Check every field and cross-field rule at once, before anything starts.

    Raises:
        ConfigError: listing every invalid field, one per line.
    """
    from gmi_drl.envs import list_tasks

    e, p, m, lg = cfg.env, cfg.ppo, cfg.model, cfg.log
    errors = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    need(e.task_id in list_tasks() or e.task_id in gym.registry,
         f"env.task_id={e.task_id!r} is neither a gmi-drl task nor a Gymnasium id")
    need(e.num_envs >= 1, f"env.num_envs={e.num_envs} must be >= 1")
    need(e.num_workers is None or 1 <= e.num_workers <= e.num_envs,
         f"env.num_workers={e.num_workers} must be in [1, env.num_envs={e.num_envs}] or None")
    need(p.num_steps >= 1, f"ppo.num_steps={p.num_steps} must be >= 1")
    need(p.num_minibatches >= 1, f"ppo.num_minibatches={p.num_minibatches} must be >= 1")
    if p.num_minibatches >= 1 and cfg.gmi_batch_size >= 1:
        need(cfg.gmi_batch_size % p.num_minibatches == 0,
             f"env.num_envs * ppo.num_steps={cfg.gmi_batch_size} must be a multiple of "
             f"ppo.num_minibatches={p.num_minibatches}")
    g = cfg.gmi
    need(g.num_gmis >= 1, f"gmi.num_gmis={g.num_gmis} must be >= 1")
    need(g.num_devices is None or 1 <= g.num_devices <= max(g.num_gmis, 1),
         f"gmi.num_devices={g.num_devices} must be in [1, gmi.num_gmis={g.num_gmis}] or None")
    if g.reducer == "switch":
        addrs = g.switch_addrs
        need(len(addrs) == max(g.num_gmis, 1) and all(":" in a for a in addrs),
             f"gmi.switch_addr={g.switch_addr!r} must be HOST:PORT, or one HOST:PORT per GMI "
             f"joined by ',' ({g.num_gmis}), when gmi.reducer is switch")
    if g.netns is not None:
        names = g.netns_list
        need(len(names) == g.num_gmis, f"gmi.netns={g.netns!r} must name one network namespace "
             f"per GMI ({g.num_gmis}), joined by ','")
        missing = [n for n in names if not os.path.exists(os.path.join("/var/run/netns", n))]
        need(not missing, f"gmi.netns: no network namespace {missing} (make them with "
             "`ip netns add`, or `gmi_drl.comm.switch.netns.Rack`)")
        need(os.geteuid() == 0, "gmi.netns needs root (joining a network namespace)")
    need(g.reducer == "auto" or g.num_gmis >= 2,
         f"gmi.reducer={g.reducer!r} reduces between GMIs: needs gmi.num_gmis >= 2, "
         f"not {g.num_gmis}")
    need(g.staleness >= 0, f"gmi.staleness={g.staleness} must be >= 0")
    need(g.staleness == 0 or g.reducer == "switch",
         f"gmi.staleness={g.staleness} needs gmi.reducer switch, not {g.reducer!r} (asynchronous "
         "training keeps aggregation rounds in flight at the switch; other reducers are "
         "synchronous collectives)")
    need(g.num_gmis == 1 or p.target_kl is None,
         f"ppo.target_kl={p.target_kl} with gmi.num_gmis={g.num_gmis}: GMIs would stop their "
         "epochs at different points and break the gradient collective; use target_kl None")
    _validate_ray(cfg, need)
    need(cfg.total_timesteps >= cfg.batch_size,
         f"total_timesteps={cfg.total_timesteps} must be >= batch_size={cfg.batch_size} "
         "(at least one update)")
    need(p.learning_rate > 0, f"ppo.learning_rate={p.learning_rate} must be > 0")
    need(0 <= p.gamma <= 1, f"ppo.gamma={p.gamma} must be in [0, 1]")
    need(0 <= p.gae_lambda <= 1, f"ppo.gae_lambda={p.gae_lambda} must be in [0, 1]")
    need(p.update_epochs >= 1, f"ppo.update_epochs={p.update_epochs} must be >= 1")
    need(p.clip_coef > 0, f"ppo.clip_coef={p.clip_coef} must be > 0")
    need(p.ent_coef >= 0, f"ppo.ent_coef={p.ent_coef} must be >= 0")
    need(p.vf_coef >= 0, f"ppo.vf_coef={p.vf_coef} must be >= 0")
    need(p.max_grad_norm > 0, f"ppo.max_grad_norm={p.max_grad_norm} must be > 0")
    need(p.target_kl is None or p.target_kl > 0, f"ppo.target_kl={p.target_kl} must be > 0 or None")
    need(p.adam_eps > 0, f"ppo.adam_eps={p.adam_eps} must be > 0")
    need(p.obs_clip > 0, f"ppo.obs_clip={p.obs_clip} must be > 0")
    need(p.reward_clip > 0, f"ppo.reward_clip={p.reward_clip} must be > 0")
    for name in ("actor_hidden", "critic_hidden"):
        value = getattr(m, name)
        try:
            parse_layers(value)
        except ValueError:
            errors.append(f"model.{name}={value!r} must be positive ints joined by ':' (e.g. '64:64')")
    need(m.activation in ACTIVATIONS,
         f"model.activation={m.activation!r} must be one of {sorted(ACTIVATIONS)}")
    need(lg.log_every >= 1, f"log.log_every={lg.log_every} must be >= 1")
    need(lg.checkpoint_every >= 0, f"log.checkpoint_every={lg.checkpoint_every} must be >= 0")
    need(lg.timeline_detail_events >= 0,
         f"log.timeline_detail_events={lg.timeline_detail_events} must be >= 0")
    need(lg.gpu_util_interval_s >= 0,
         f"log.gpu_util_interval_s={lg.gpu_util_interval_s} must be >= 0 (0: off)")
    _validate_profile(cfg, need)
    need(cfg.torch_threads >= 1, f"torch_threads={cfg.torch_threads} must be >= 1")
    if cfg.device == "cuda":
        import torch

        need(torch.cuda.is_available(),
             "device='cuda' but torch sees no CUDA device (CPU build of torch, or no driver); "
             "use --device cpu")
    need(cfg.preset == "auto" or cfg.preset in PRESETS,
         f"preset={cfg.preset!r} must be one of {['auto', *PRESETS]}")
    if cfg.resume is not None:
        need(os.path.exists(cfg.resume), f"resume={cfg.resume!r} does not exist")
    elif cfg.run_dir is not None:
        need(not os.path.exists(os.path.join(cfg.run_dir, "config.json")),
             f"run_dir={cfg.run_dir!r} already holds a run; pass --resume {cfg.run_dir} to "
             "continue it, or choose another --run-dir")
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def _validate_profile(cfg: TrainConfig, need) -> None:
    pr = cfg.profile
    need(pr.tool in ("none", "nsys", "torch"),
         f"profile.tool={pr.tool!r} must be one of ['none', 'nsys', 'torch']")
    if pr.tool == "none":
        return
    n_iter, n_gmis = cfg.num_iterations, cfg.gmi.num_gmis
    need(len(pr.steps) > 0, "profile.steps is empty: name the PPO iterations to capture, "
         "e.g. --profile.steps 3 4")
    bad = [s for s in pr.steps if not 0 <= s < n_iter]
    need(not bad, f"profile.steps={pr.steps}: {bad} outside the run's iterations "
         f"[0, num_iterations={n_iter})")
    need(pr.all_ranks or len(pr.ranks) > 0,
         "profile.ranks is empty: name GMI ids (e.g. --profile.ranks 0) or pass --profile.all-ranks")
    bad = [r for r in pr.ranks if not 0 <= r < n_gmis]
    need(pr.all_ranks or not bad,
         f"profile.ranks={pr.ranks}: {bad} outside the GMI ids [0, gmi.num_gmis={n_gmis})")
    need(len(pr.roles) > 0 and set(pr.roles) <= set(ROLES),
         f"profile.roles={pr.roles} must be a non-empty subset of {list(ROLES)}")


def _validate_ray(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    r = cfg.ray
    if cfg.launcher == "local":
        changed = [f"ray.{f.name}" for f in dataclasses.fields(RayConfig)
                   if getattr(r, f.name) != f.default]
        need(not changed, f"{', '.join(changed)} set but launcher='local'; add --launcher ray")
        return
    need(importlib.util.find_spec("ray") is not None,
         "launcher='ray' needs the ray package: pip install 'gmi-drl[ray]'")
    g = cfg.gmi
    need(g.reducer != "ring", "gmi.reducer ring is for the local launcher; on Ray the reduction "
         "follows the nodes (HAR across nodes, MPR within one): use gmi.reducer auto or switch")
    need(g.netns is None, "gmi.netns is for the local launcher (namespaces of this machine)")
    need(len(set(g.switch_addrs)) <= 1, f"gmi.switch_addr={g.switch_addr!r}: with launcher='ray' "
         "give one switch address for all GMIs")
    need(r.address is None or r.address == "auto" or _is_host_port(r.address),
         f"ray.address={r.address!r} must be auto or HOST:PORT (the head node's address)")
    need(r.max_restarts >= 0, f"ray.max_restarts={r.max_restarts} must be >= 0")
    need(r.num_cpus_per_gmi > 0, f"ray.num_cpus_per_gmi={r.num_cpus_per_gmi} must be > 0")
    need(r.placement_timeout_s > 0,
         f"ray.placement_timeout_s={r.placement_timeout_s} must be > 0")


def _is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def to_dict(cfg: TrainConfig) -> dict:
    """The config as plain JSON-able data (what config.json and checkpoints hold)."""
    return dataclasses.asdict(cfg)


def from_dict(data: dict) -> TrainConfig:
    """Inverse of `to_dict`.

    Raises:
        ConfigError: unknown or missing fields.
    """
    try:
        nested = {"env": EnvConfig, "ppo": PPOConfig, "model": ModelConfig, "log": LogConfig,
                  "gmi": GMIConfig, "profile": ProfilerConfig, "ray": RayConfig}
        return TrainConfig(**{k: nested[k](**v) if k in nested else v for k, v in data.items()})
    except (TypeError, KeyError) as e:
        raise ConfigError(f"stored config does not match this gmi-drl version: {e}") from None
