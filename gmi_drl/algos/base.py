"""The algorithm protocol: what the runner calls, and what an algorithm is built from.

Every algorithm is the same verbs (docs/algorithms.md): ``collect(pool)`` runs the algorithm's own
schedule of env steps and the work that follows from them (PPO: a rollout, then GAE; an
off-policy method: env steps, replay, gradient steps), ``update()`` learns from what was
collected, and ``state_dict`` / ``load_state_dict`` checkpoint it. The runner sees nothing else:
no algorithm is named there. An algorithm never opens a socket or a process: its gradients leave
through the `GradStep` s its context makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Callable, ContextManager, Literal, Protocol

import numpy as np
import torch
from annotated_types import Ge

from gmi_drl.envs.spec import EnvSpec
from gmi_drl.optim.grad_step import GradStep
from gmi_drl.rollout.acting import Acting
from gmi_drl.rollout.arrays import Arrays, arrays_for
from gmi_drl.rollout.episodes import DeviceEpisodes, Episodes
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.telemetry.timer import timer

Phase = Callable[[str], ContextManager]
"""``phase(name)``: a top-level phase of an iteration (a timer section of that name, and a
profiler capture range where one is selected); the runner passes the profiler's."""


@dataclass
class ModelConfig:
    """Network shapes; input and output sizes come from the task's spaces."""

    encoder: Literal["mlp", "nature_cnn"] = "mlp"
    """mlp: separate actor/critic MLPs (flat obs); nature_cnn: a shared Nature CNN (84x84 frames)"""
    actor_hidden: str = "64:64"
    """hidden sizes of the actor MLP, ':'-joined (paper Table 6 notation)"""
    critic_hidden: str = "64:64"
    """hidden sizes of the critic MLP, ':'-joined"""
    activation: str = "tanh"
    """MLP activation: tanh, relu or elu"""
    cnn_features: Annotated[int, Ge(1)] = 512
    """width of the Nature CNN's last (fully connected) layer"""


@dataclass(frozen=True)
class AlgoContext:
    """What an algorithm is built from besides its own config: the task, its trainer's place in
    the run, and the runner-owned parts it uses.

    Attributes:
        spec: the task's single-env spaces. num_envs: envs of this GMI's pool.
        model: network shapes.
        num_iterations: iterations (collect + update) of the whole run, for schedules.
        seed: the run's torch seed (the same on every GMI: minibatch order, initial weights).
        device: where the learner, its storage and normalisers live.
        make_grad_step: ``(module, loss, lr, max_grad_norm, eps, optimizer="adam",
            weight_decay=0.0) -> GradStep`` with the run's reducer, staleness bound and compile
            setting bound (`gmi_drl.optim.grad_step`); one per optimised module.
        action_generator: the RNG acting samples with (this GMI's own; the runner saves it).
        obs_norm, reward_norm: the runner's normalisers, or ``None``.
        compile: compile acting where that helps (`gmi_drl.rollout.acting.make_acting`).
        phase: see `Phase`.
    """

    spec: EnvSpec
    num_envs: int
    model: ModelConfig
    num_iterations: int
    seed: int
    make_grad_step: Callable[..., GradStep]
    action_generator: torch.Generator
    device: torch.device = torch.device("cpu")
    obs_norm: ObsNormalizer | None = None
    reward_norm: RewardNormalizer | None = None
    compile: bool = False
    phase: Phase = field(default=timer)

    @property
    def arrays(self) -> Arrays:
        """Where rollouts live: `gmi_drl.rollout.arrays.arrays_for` of `device`."""
        return arrays_for(self.device)


class Algorithm(Protocol):
    """One learner in one trainer; the runner's only view of an algorithm.

    Attributes:
        steps_per_iteration: env steps of this GMI's pool one `collect` takes.
        acting: the policy as it acts (``gmi-drl eval`` uses it, deterministic).
    """

    steps_per_iteration: int
    acting: Acting

    def collect(self, pool) -> Episodes | DeviceEpisodes:
        """Run this algorithm's collection schedule on ``pool`` (blocks); returns the episodes
        that finished (on a pool of device tensors still on the device: `DeviceEpisodes`).
        Opens its own phases through the context's ``phase``."""

    def update(self) -> dict[str, float | torch.Tensor]:
        """Learn from what `collect` gathered; returns metrics (``losses/...``, ``comm/...``):
        numbers, or 0-d tensors the runner reads to the host only at the iterations it logs.
        The runner wraps it in the ``update`` phase."""

    def state_dict(self) -> dict:
        """Everything to continue bit for bit, with the network weights under ``"modules"``:
        ``{name: module.state_dict()}`` (what the runner's weight digest hashes), and each
        optimizer's state under ``"optimizers"``, named as the module it trains (target
        networks have none: `gmi_drl.train.weight_count` counts the trained modules)."""

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output. Raises ``ValueError`` when it does not fit."""

    def close(self) -> None:
        """Stop any thread the algorithm's gradient steps run (idempotent)."""

    # optional: ``drain() -> dict[str, float]``, for an algorithm whose `update` leaves
    # stale-sync steps in flight (the replay actor-critics): the runner calls it on every GMI at
    # the iterations whose weights it digests or saves (`gmi_drl.runner.shell`)


class AsyncAlgorithm(Protocol):
    """The learner of a trainer GMI in the ``async_training`` template (GMI-DRL §5.1), the
    runner's only view of it; serving GMIs act with a copy of its model.

    Attributes:
        steps_per_iteration: samples one `update` learns from.
        policy_version: updates made so far: the version of the weights `weights` returns.
        acting: the policy as the trainer's weights act (``gmi-drl eval``).
    """

    steps_per_iteration: int
    policy_version: int
    acting: Acting

    @staticmethod
    def acting_model(spec, model: "ModelConfig") -> torch.nn.Module:
        """The network serving GMIs act with, for task ``spec`` (`EnvSpec`) and ``model``,
        untrained (built after ``torch.manual_seed(seed)`` it equals the learner's first)."""

    def learn(self, batch: dict[str, torch.Tensor],
              update_obs_stats: bool = True) -> dict[str, float]:
        """Learn from one batch of fragments (``(T, M, ...)`` tensors and ``last_obs (M,
        *obs_shape)``); the next `weights` are ``policy_version + 1``. Returns metrics."""

    def weights(self) -> list[np.ndarray]:
        """What serving GMIs act with, in a fixed order: the acting model's state, then the
        observation normaliser's mean and variance where the run has one."""

    def set_obs_stats(self, mean: np.ndarray, var: np.ndarray) -> None:
        """Take the observation statistics another trainer published."""

    def state_dict(self) -> dict:
        """As `Algorithm.state_dict`, with the policy version."""

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output. Raises ``ValueError`` when it does not fit."""

    def close(self) -> None:
        """Stop any thread the algorithm's gradient steps run (idempotent)."""


class AlgoConfig(Protocol):
    """What every algorithm config provides besides its hyper-parameters."""

    gamma: float
    """discount (the reward normaliser discounts with it too)"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """Env steps of one pool of ``num_envs`` envs per iteration."""

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule between the hyper-parameters, and with pools of ``num_envs`` envs
        and ``num_gmis`` GMIs, one message each (``algo.<field>=...``); empty when valid. A
        field's own bounds are declared on it (``Annotated[float, Gt(0)]``) and checked with
        its type by the run's config, not here."""


def load_modules(modules: dict[str, torch.nn.Module], stored: dict) -> None:
    """Load ``stored[name]`` (a module's ``state_dict``, as under a checkpoint's ``"modules"``)
    into each of ``modules``.

    Raises:
        ValueError: a module is missing from ``stored`` or its weights do not fit.
    """
    for name, module in modules.items():
        try:
            module.load_state_dict(stored[name])
        except (RuntimeError, KeyError) as e:
            raise ValueError(f"checkpoint weights do not fit this model: {e!r}") from None


def actor_critic_state(model: torch.nn.Module, grad_step, iteration: int,
                       generator: torch.Generator | None = None) -> dict:
    """The checkpoint state of a learner with one actor-critic and one `GradStep` (PPO, A2C,
    APPO, A3C): weights (``modules``), optimizer moments, the update count and, where the
    learner samples minibatches, its generator."""
    state = {"modules": {"actor_critic": model.state_dict()},
             "optimizers": {"actor_critic": grad_step.state_dict()}, "iteration": iteration}
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def load_actor_critic_state(state: dict, model: torch.nn.Module, grad_step,
                            generator: torch.Generator | None = None) -> int:
    """Restore `actor_critic_state` output; returns the update count.

    Raises:
        ValueError: the stored weights or optimizer do not fit this model.
    """
    load_modules({"actor_critic": model}, state["modules"])
    grad_step.load_state_dict(state["optimizers"]["actor_critic"])
    if generator is not None:
        generator.set_state(state["generator"])
    return int(state["iteration"])

