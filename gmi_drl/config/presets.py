"""Presets: a starting `TrainConfig` per algorithm and task family, by name.

PPO presets reproduce CleanRL's hyper-parameters: ``classic`` = ``ppo.py``, ``mujoco`` =
``ppo_continuous_action.py``, ``atari`` = ``ppo_atari.py``; ``cartpole-zoo`` = RL-Zoo's
``CartPole-v1`` PPO entry (the Stable-Baselines3 comparison); ``demo`` = a short Hopper run.
A2C, DDPG, TD3 and SAC presets are RL-Zoo's entries (the Stable-Baselines3 references; SAC's
``cleanrl`` is CleanRL's ``sac_continuous_action.py``); DQN's follow CleanRL and RL-Zoo, except ``cartpole`` and ``pong``, gmi-drl's settings that reach each issue
target's return. Every algorithm of the iSwitch paper (§5.1) has an ``iswitch`` preset: its
workload and a network of its model size (DQN Pong, A2C Qbert, PPO Hopper, DDPG HalfCheetah).
``gmi-ant`` and ``gmi-humanoid``, ``gmi-anymal``, ``gmi-ballbalance``, ``gmi-frankacabinet``,
``gmi-shadowhand`` are rl_games' IsaacGymEnvs settings for GMI-DRL's six Table 6 tasks (warp
engine); TD3's and SAC's ``gmi-ant`` and ``gmi-humanoid`` are FastTD3's GPU-scale recipe on two
of them (``gmi-drl train td3 --preset gmi-humanoid``).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Callable

import gymnasium as gym

from gmi_drl.algos import (A2CConfig, A3CConfig, APPOConfig, DDPGConfig, DQNConfig, ModelConfig,
                           PPOConfig, SACConfig, TD3Config)
from gmi_drl.algos.ddpg import DeterministicPGConfig, OffPolicyConfig
from gmi_drl.config.schema import (CheckpointConfig, ConfigError, EnvConfig, LogConfig,
                                   NormConfig, TrainConfig)


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


# SAC: RL-Zoo's sac.yml (learning_starts at least the minibatch: OffPolicyConfig's rule) and CleanRL's
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


def _offpolicy_gmi(cls: type[OffPolicyConfig], task_id: str,
                   num_envs: int = 4096) -> Callable[[], TrainConfig]:
    """TD3 or SAC at GPU scale on a warp task, FastTD3's recipe (Seo et al. 2025; FastSAC its
    SAC twin): ``num_envs`` worlds feeding a replay on the device that keeps 1,024 steps of
    each, 10 steps of every world before the first update, two gradient steps per env step of
    the batch with minibatches of 32,768, 3-step returns, clipped double Q, soft targets with
    tau 0.1, AdamW (3e-4, weight decay 0.1), critics of 1024:512:256 and actors of 512:256:128
    (ReLU), normalised observations; TD3 with mixed exploration noise (each world's std in
    [0.001, 0.4]) and target smoothing noise 0.001. FastTD3's distributional critic and bf16
    autocast are not part of it (gmi-drl's critics regress the n-step target directly)."""
    def factory() -> TrainConfig:
        common = dict(learning_rate=3e-4, buffer_size=num_envs * 1024,
                      learning_starts=num_envs * 10, minibatch_size=32768, tau=0.1, gamma=0.99,
                      n_step=3, gradient_steps=2, weight_decay=0.1)
        if cls is SACConfig:
            algo = SACConfig(policy_delay=2, **common)
        else:
            algo = cls(policy_delay=2, exploration_noise=0.001, exploration_noise_max=0.4,
                       target_policy_noise=0.001, target_noise_clip=0.5, **common)
        return TrainConfig(env=EnvConfig(task_id=task_id, num_envs=num_envs, engine="warp"),
                           algo=algo,
                           model=ModelConfig(actor_hidden="512:256:128",
                                             critic_hidden="1024:512:256", activation="relu"),
                           norm=NormConfig(obs=True), total_timesteps=50_000_000,
                           **_few_steps_per_iteration())
    return factory


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
    "td3": {"classic": _pendulum(TD3Config), "mujoco": _halfcheetah(TD3Config),
            "gmi-ant": _offpolicy_gmi(TD3Config, "Ant-gmi-v0"),
            "gmi-humanoid": _offpolicy_gmi(TD3Config, "Humanoid-gmi-v0")},
    "appo": {"classic": _appo_classic, "mujoco": _appo_mujoco, "atari": _appo_atari},
    "a3c": {"classic": _a3c_classic, "atari": _a3c_atari},
    "sac": {"classic": _sac_classic, "mujoco": _sac_mujoco, "cleanrl": _sac_cleanrl,
            "gmi-ant": _offpolicy_gmi(SACConfig, "Ant-gmi-v0"),
            "gmi-humanoid": _offpolicy_gmi(SACConfig, "Humanoid-gmi-v0")}}
"""``{algorithm: {preset name: factory}}``; ``classic``, ``mujoco`` and ``atari`` are the
defaults of each task family (``--preset auto``)"""


def _without_algo_suffix(name: str, algo: str) -> str:
    """``NAME-ALGO`` (``gmi-humanoid-sac``, as the preset is often named outside a command that
    names its algorithm) -> ``NAME``.

    Raises:
        ConfigError: ``name`` ends in another algorithm's name and is that algorithm's preset.
    """
    if name in PRESETS[algo]:
        return name
    for other in PRESETS:
        base = name.removesuffix(f"-{other}")
        if base != name and base in PRESETS[other]:
            if other != algo:
                raise ConfigError(f"preset={name!r} is {other}'s: gmi-drl train {other} "
                                  f"--preset {name}")
            return base
    return name


def preset(name: str, task_id: str | None = None, algo: str = "ppo") -> TrainConfig:
    """A fresh `TrainConfig` of preset ``name`` of algorithm ``algo`` (``"auto"``: a warp task's
    own ``gmi-*`` preset where ``algo`` has one, else the family of ``task_id``, or
    ``"classic"`` where ``algo`` has no preset of that family).

    ``task_id``, when given, replaces the preset's task.

    ``name`` may end in ``-ALGO`` (``gmi-humanoid-sac`` is SAC's ``gmi-humanoid``).

    Raises:
        ConfigError: unknown algorithm or preset name, or another algorithm's preset.
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
    name = _without_algo_suffix(name, algo)
    if name not in PRESETS[algo]:
        raise ConfigError(f"preset={name!r} must be one of {['auto', *PRESETS[algo]]} "
                          f"for {algo}")
    cfg = PRESETS[algo][name]()
    cfg.preset = name
    if task_id is not None:
        cfg.env.task_id = task_id
    return cfg
