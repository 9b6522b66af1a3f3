"""One file per algorithm (its config, loss and schedule) behind one protocol (`base`).

`ALGORITHMS` maps each subcommand name of ``gmi-drl train`` to its config class and learner;
`build_algorithm` is the runner's only way to make one.
"""

from __future__ import annotations

from gmi_drl.algos.a2c import A2C, A2CConfig
from gmi_drl.algos.a3c import A3C, A3CConfig
from gmi_drl.algos.appo import APPO, APPOConfig
from gmi_drl.algos.base import AlgoConfig, AlgoContext, Algorithm, AsyncAlgorithm, ModelConfig
from gmi_drl.algos.ddpg import DDPG, DDPGConfig
from gmi_drl.algos.dqn import DQN, DQNConfig
from gmi_drl.algos.ppo import PPO, PPOConfig
from gmi_drl.algos.sac import SAC, SACConfig
from gmi_drl.algos.td3 import TD3, TD3Config

ALGORITHMS: dict[str, tuple[type, type]] = {
    "ppo": (PPOConfig, PPO), "a2c": (A2CConfig, A2C), "dqn": (DQNConfig, DQN),
    "ddpg": (DDPGConfig, DDPG), "td3": (TD3Config, TD3), "appo": (APPOConfig, APPO),
    "a3c": (A3CConfig, A3C), "sac": (SACConfig, SAC)}
"""``{name: (config class, learner class)}``; the learner is built as ``cls(config, ctx)``"""


def is_async(cfg: AlgoConfig) -> bool:
    """Whether the algorithm learns in the ``async_training`` template (APPO, A3C: trainer
    GMIs learn from what serving GMIs send) rather than in holistic GMIs."""
    return getattr(cfg, "template", "sync_training") == "async_training"


def algo_name(cfg: AlgoConfig) -> str:
    """The subcommand name of an algorithm config (``"ppo"`` for a `PPOConfig`).

    Raises:
        TypeError: not the config of a registered algorithm.
    """
    for name, (config_cls, _) in ALGORITHMS.items():
        if type(cfg) is config_cls:
            return name
    raise TypeError(f"{type(cfg).__name__} is not the config of an algorithm in ALGORITHMS")


def build_algorithm(cfg: AlgoConfig, ctx: AlgoContext) -> Algorithm | AsyncAlgorithm:
    """The learner of ``cfg`` built in ``ctx`` (see `gmi_drl.algos.base`)."""
    return ALGORITHMS[algo_name(cfg)][1](cfg, ctx)


def build_acting_model(cfg: AlgoConfig, spec, model: ModelConfig):
    """The network a serving GMI of ``cfg``'s async algorithm acts with
    (`AsyncAlgorithm.acting_model`), for task ``spec`` and ``model``.

    Raises:
        TypeError: ``cfg`` is not an async algorithm's (`is_async`).
    """
    if not is_async(cfg):
        raise TypeError(f"{algo_name(cfg)} learns in holistic GMIs: no serving GMI acts for it")
    return ALGORITHMS[algo_name(cfg)][1].acting_model(spec, model)


__all__ = ["A2C", "A2CConfig", "A3C", "A3CConfig", "ALGORITHMS", "APPO", "APPOConfig", "AlgoConfig", "AlgoContext", "Algorithm", "DDPG",
           "DDPGConfig", "DQN", "DQNConfig", "ModelConfig", "PPO", "PPOConfig", "SAC",
           "SACConfig", "TD3", "TD3Config",
           "algo_name", "build_acting_model", "build_algorithm", "is_async", "AsyncAlgorithm"]
