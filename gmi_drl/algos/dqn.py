"""Deep Q-Network: Q-learning with experience replay and a target network.

Source: Mnih et al. 2015, "Human-level control through deep reinforcement learning" (Nature
DQN): Algorithm 1 (replay, epsilon-greedy, the target network updated every C steps) and the
Huber loss on the TD error; van Hasselt et al. 2016 (Double DQN, eq. 4) with ``double_q``. The
defaults and the schedule (train every ``train_frequency`` env steps once ``learning_starts``
are taken, target sync every ``target_network_frequency`` env steps, before the iteration's
gradient steps) follow CleanRL's ``dqn.py`` (which trains only past ``learning_starts`` and
syncs after its gradient step: one gradient step apart);
``gradient_steps`` per iteration and ``tau`` follow Stable-Baselines3's DQN.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Annotated, Literal

import gymnasium as gym
import numpy as np
import torch
from annotated_types import Ge, Gt, Interval
from torch import nn
from torch.nn import functional as F

from gmi_drl.algos.base import AlgoContext, load_modules
from gmi_drl.models.actor_critic import ActResult
from gmi_drl.models.cnn import NatureCNN
from gmi_drl.models.mlp import MLP
from gmi_drl.rollout.acting import mlp_forward
from gmi_drl.optim.flat import FlatParams, soft_update_
from gmi_drl.rollout.arrays import Array, Arrays, HostArrays, pool_arrays
from gmi_drl.rollout.collector import Episodes, ReplayCollector
from gmi_drl.rollout.replay import (FrameReplayBuffer, ReplayBuffer, make_replay,
                                   refill_steps, replay_config_errors, warmup_errors)


@dataclass
class DQNConfig:
    """DQN hyper-parameters (defaults: CleanRL ``dqn.py``, but for the Huber loss and the
    gradient-norm bound of 10, which are Nature DQN's and Stable-Baselines3's; the ``classic``
    preset sets CleanRL's squared error and no bound)."""

    learning_rate: Annotated[float, Gt(0)] = 2.5e-4
    """Adam step size"""
    buffer_size: Annotated[int, Ge(1)] = 10_000
    """replay capacity of each GMI, transitions"""
    gamma: Annotated[float, Interval(ge=0, le=1)] = 0.99
    """discount factor"""
    n_step: Annotated[int, Ge(1)] = 1
    """rewards per TD target: n-step returns (Rainbow's multi-step, Hessel et al. 2018), cut
    where an episode ended; 1 is Nature DQN's one-step target"""
    tau: Annotated[float, Interval(gt=0, le=1)] = 1.0
    """target update rate: 1 copies the online network, < 1 is a Polyak average"""
    target_network_frequency: Annotated[int, Ge(1)] = 500
    """env steps of a GMI between target updates"""
    minibatch_size: Annotated[int, Ge(1)] = 128
    """transitions per gradient step (each GMI samples its own)"""
    start_e: Annotated[float, Interval(ge=0, le=1)] = 1.0
    """exploration epsilon at the start"""
    end_e: Annotated[float, Interval(ge=0, le=1)] = 0.05
    """exploration epsilon at the end of the schedule"""
    exploration_fraction: Annotated[float, Interval(gt=0, le=1)] = 0.5
    """fraction of the run over which epsilon falls linearly from start_e to end_e"""
    learning_starts: Annotated[int, Ge(0)] = 10_000
    """env steps of a GMI before the first gradient step (filling the buffer)"""
    train_frequency: Annotated[int, Ge(1)] = 10
    """steps of every env per iteration (an iteration is num_envs * train_frequency env steps)"""
    gradient_steps: Annotated[int, Ge(1)] = 1
    """gradient steps per iteration"""
    double_q: bool = False
    """Double DQN target: the online network picks the next action, the target rates it"""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss: Huber (Nature DQN, SB3) or squared error (CleanRL)"""
    max_grad_norm: Annotated[float, Gt(0)] = 10.0
    """global gradient norm bound (SB3's default; inf: none, as CleanRL)"""
    adam_eps: Annotated[float, Gt(0)] = 1e-8
    """Adam epsilon"""
    save_replay: bool = False
    """put the replay buffer in checkpoints (a resumed run of one GMI then trains on it at
    once; without it, and with several GMIs, whose checkpoint would hold GMI 0's alone, a
    resumed run refills its buffers for learning_starts env steps first, at most the buffer's
    size and half the steps left; the files grow by the buffer's size)"""

    def steps_per_iteration(self, num_envs: int) -> int:
        """``num_envs * train_frequency``."""
        return num_envs * self.train_frequency

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        """Every broken rule between these hyper-parameters and pools of ``num_envs`` envs
        (each field's own bounds are declared on it)."""
        errors = [] if self.end_e <= self.start_e else [
            f"algo.start_e={self.start_e}, algo.end_e={self.end_e}: need 0 <= end_e <= "
            "start_e <= 1"]
        return (errors
                + replay_config_errors(self.buffer_size, self.minibatch_size, self.n_step,
                                       num_envs)
                + warmup_errors(self.learning_starts, self.minibatch_size,
                                self.steps_per_iteration(num_envs)))


class QNetwork(nn.Module):
    """``Q(obs) -> (N, num_actions) float32``: an MLP on flat observations, or the Nature CNN
    and a linear layer on stacked frames (Mnih et al. 2015, Methods "Model architecture").

    Raises:
        ValueError: ``encoder`` ``mlp`` on observations that are not a 1-d Box.
    """

    def __init__(self, observation_space: gym.spaces.Box, num_actions: int, encoder: str,
                 hidden: str, activation: str, cnn_features: int = 512) -> None:
        super().__init__()
        if encoder == "nature_cnn":
            cnn = NatureCNN.for_observations(observation_space.shape, cnn_features)
            self.net = nn.Sequential(cnn, nn.Linear(cnn.out_features, num_actions))
        else:
            if not isinstance(observation_space, gym.spaces.Box) or len(
                    observation_space.shape or ()) != 1:
                raise ValueError(f"encoder 'mlp' needs flat observations (a 1-d Box), got "
                                 f"{observation_space}")
            n_in = int(observation_space.shape[0])
            # torch's default initialisation, as CleanRL's dqn.py and SB3's DQN have it
            self.net = nn.Sequential(nn.Flatten(),
                                     MLP(f"{n_in}:{hidden}:{num_actions}", activation,
                                         orthogonal=False))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def td_target(q_next_target: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor,
              discount: torch.Tensor | float,
              q_next_online: torch.Tensor | None = None) -> torch.Tensor:
    """``r + discount (1 - terminated) Q_target(s', a')`` for ``(B,)`` rewards and
    terminations, ``discount`` (``gamma``, or ``(B,)`` ``gamma ** m`` after an n-step sum of
    ``m`` rewards: `gmi_drl.rollout.replay.ReplayBatch`) and ``(B, num_actions)`` next-state
    values: ``a' = argmax Q_target(s')`` (Nature DQN), or ``argmax Q_online(s')`` when
    ``q_next_online`` is given (Double DQN, van Hasselt 2016 eq. 4). Truncated episodes are
    stored with the state that followed and ``terminated = 0``: they bootstrap."""
    if q_next_online is None:
        next_value = q_next_target.max(1).values
    else:
        next_value = q_next_target.gather(1, q_next_online.argmax(1, keepdim=True)).squeeze(1)
    return rewards + discount * (1.0 - terminated) * next_value


def dqn_objective(q_network: nn.Module, obs: torch.Tensor, actions: torch.Tensor,
                  rewards: torch.Tensor, next_obs: torch.Tensor, terminated: torch.Tensor,
                  discount: torch.Tensor, *, target_network: nn.Module, double_q: bool,
                  loss: str) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The TD loss of one replay minibatch in a `GradStep`'s shape (so the target's forward
    joins the compiled step): ``Q(s, a)`` of the ``(B,) int64`` ``actions`` against `td_target`
    (no gradient through it), Huber (delta 1) or mean squared error. Returns
    ``(loss, (loss, mean Q(s, a)))``."""
    q_next_target = target_network(next_obs).detach()
    q_next_online = q_network(next_obs).detach() if double_q else None
    target = td_target(q_next_target, rewards, terminated, discount, q_next_online)
    q = q_network(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
    if loss == "huber":
        value = F.smooth_l1_loss(q, target)
    else:
        value = F.mse_loss(q, target)
    return value, (value.detach(), q.detach().mean())


class EpsilonGreedy:
    """The agent role of DQN: ``argmax_a Q(obs, a)``, or with probability ``epsilon`` an action
    drawn uniformly (Q computed as `gmi_drl.rollout.acting.mlp_forward` chooses: NumPy on
    views of an MLP's weights on the CPU; the `gmi_drl.rollout.acting.Acting` protocol:
    ``logprob`` is 0 and ``value`` is ``max_a Q``). Draws from the runner's generator: per call
    one uniform per env for the coin and one integer per env for the random action."""

    def __init__(self, q_network: QNetwork, num_actions: int, generator: torch.Generator,
                 arrays: Arrays) -> None:
        self.q_network, self.num_actions, self.generator = q_network, num_actions, generator
        self._host = isinstance(arrays, HostArrays)
        self.epsilon = 1.0
        self._q = mlp_forward(q_network, q_network.net[-1], arrays)
        """``Q(obs) (N, num_actions)``, arrays of ``arrays``' kind"""

    def act(self, obs: Array, deterministic: bool = False) -> ActResult:
        q = self._q(obs)
        if self._host:
            action, value = q.argmax(1), q.max(1)
        else:
            value, action = q.max(1)
        if not deterministic:
            n = len(action)
            g = self.generator  # drawn on its device (the runner's, a GPU's with --device cuda)
            coin = torch.rand(n, generator=g, device=g.device)
            random = torch.randint(self.num_actions, (n,), generator=g, device=g.device)
            if self._host:
                action = np.where(coin.cpu().numpy() < self.epsilon, random.cpu().numpy(), action)
            else:
                explore = (coin < self.epsilon).to(action.device)
                action = torch.where(explore, random.to(action.device), action)
        zeros = np.zeros_like(value) if self._host else torch.zeros_like(value)
        return ActResult(action, zeros, value)

    def explore(self, obs: Array) -> Array:
        """Epsilon-greedy actions ``(N,) int64`` (the draws of `act`); on the CPU, Q is
        computed only for the rows that exploit (none while epsilon is 1)."""
        if not self._host:
            return self.act(obs).action
        n = len(obs)
        g = self.generator
        coin = torch.rand(n, generator=g, device=g.device).cpu().numpy()
        action = torch.randint(self.num_actions, (n,), generator=g, device=g.device).cpu().numpy()
        greedy = np.flatnonzero(coin >= self.epsilon)
        if len(greedy):
            action[greedy] = self._q(obs[greedy]).argmax(1)
        return action

    def value(self, obs: Array) -> Array:
        q = self._q(obs)
        return q.max(1) if self._host else q.max(1).values


class DQN:
    """The DQN learner (an `gmi_drl.algos.base.Algorithm`): ``collect`` steps every env
    ``train_frequency`` times with epsilon-greedy actions into the replay buffer; ``update``
    takes ``gradient_steps`` gradient steps on uniform minibatches once ``learning_starts`` env
    steps are stored, and moves the target network every ``target_network_frequency`` steps.

    Raises:
        ValueError: a non-Discrete action space, or observation/reward normalisation (DQN
            learns from raw rewards; normalise inside the task instead).
    """

    def __init__(self, cfg: DQNConfig, ctx: AlgoContext) -> None:
        spec = ctx.spec
        if not isinstance(spec.action_space, gym.spaces.Discrete):
            raise ValueError(f"DQN needs a Discrete action space, {spec.task_id} has "
                             f"{spec.action_space}")
        if ctx.obs_norm is not None or ctx.reward_norm is not None:
            raise ValueError("DQN does not use the runner's normalisers: run without "
                             "--norm.obs / --norm.reward")
        self.cfg, self.ctx = cfg, ctx
        self.steps_per_iteration = cfg.steps_per_iteration(ctx.num_envs)
        n = int(spec.action_space.n)
        m = ctx.model
        self.q_network = QNetwork(spec.observation_space, n, m.encoder, m.critic_hidden,
                                  m.activation, m.cnn_features).to(ctx.device)
        self.target_network = copy.deepcopy(self.q_network).requires_grad_(False)
        loss = functools.partial(dqn_objective, target_network=self.target_network,
                                 double_q=cfg.double_q, loss=cfg.loss)
        self.grad_step = ctx.make_grad_step(self.q_network, loss, cfg.learning_rate,
                                            cfg.max_grad_norm, cfg.adam_eps)
        self._target = FlatParams(self.target_network)
        self.acting = self.make_acting(ctx.arrays)
        self.replay: ReplayBuffer | FrameReplayBuffer | None = None  # the first collect makes it
        self._refill_until = 0
        """env steps at which a run resumed without its replay trains again (counted in env
        steps, the same on every GMI, so that all GMIs take their first step together)"""
        self.generator = torch.Generator().manual_seed(ctx.seed)  # replay sampling
        self.total_steps = ctx.num_iterations * self.steps_per_iteration
        self.env_steps, self.last_target_update, self.iteration = 0, 0, 0
        self._collector: ReplayCollector | None = None

    def epsilon(self) -> float:
        """The linear schedule at this GMI's env step (CleanRL's ``linear_schedule``)."""
        cfg = self.cfg
        duration = max(cfg.exploration_fraction * self.total_steps, 1.0)
        slope = (cfg.end_e - cfg.start_e) / duration
        return max(slope * self.env_steps + cfg.start_e, cfg.end_e)

    def collect(self, pool) -> Episodes:
        """``train_frequency`` steps of every env (phase ``rollout``) into the replay buffer."""
        with self.ctx.phase("rollout"):
            if self._collector is None:
                self._start(pool)
            return self._collector.collect(self.cfg.train_frequency, self._policy)

    def _policy(self, obs: Array) -> tuple[Array, Array]:
        arrays = self._arrays
        self.acting.epsilon = self.epsilon()
        action = arrays.to_pool(self.acting.explore(arrays.from_pool(obs)))
        self.env_steps += len(action)
        return action, action

    def _start(self, pool) -> None:
        spec, cfg = self.ctx.spec, self.cfg
        if self.replay is None:
            self.replay = make_replay(cfg.buffer_size, spec, self.ctx.num_envs, self.ctx.device,
                                      n_step=cfg.n_step, gamma=cfg.gamma)
        self._collector = ReplayCollector(pool, self.replay)
        self._arrays = pool_arrays(self.ctx.arrays, pool)
        if getattr(pool, "tensors", False):
            # a pool of tensors: act on them where they are, never through NumPy
            self.acting = self.make_acting(self._arrays)

    def make_acting(self, arrays: Arrays) -> EpsilonGreedy:
        """The policy as it acts on ``arrays`` (the runner's, or a pool of tensors' on its
        device)."""
        return EpsilonGreedy(self.q_network, int(self.ctx.spec.action_space.n),
                             self.ctx.action_generator, arrays)

    def update(self) -> dict[str, float]:
        """``gradient_steps`` gradient steps once ``learning_starts`` env steps were taken
        (none before); the target network first, when ``target_network_frequency`` env steps
        passed since its last update. Returns ``losses/td_loss``, ``losses/q_values`` (means
        over the steps), ``losses/epsilon`` and the gradient step's metrics."""
        cfg, step = self.cfg, self.grad_step
        self.iteration += 1
        metrics = {"losses/epsilon": self.epsilon()}
        if self.env_steps < cfg.learning_starts:
            return metrics
        if self.env_steps < self._refill_until:  # resumed without its replay: refill first
            return metrics
        if self.env_steps - self.last_target_update >= cfg.target_network_frequency:
            self._update_target()
        aux = []
        for _ in range(cfg.gradient_steps):
            loss, q = step(*self.replay.sample(cfg.minibatch_size, self.generator))
            aux.append(torch.stack([loss, q]))
        means = torch.stack(aux).mean(0)  # (0-d tensors: read where a row is logged)
        return {**metrics, "losses/td_loss": means[0], "losses/q_values": means[1],
                **step.drain()}

    def _update_target(self) -> None:
        soft_update_(self._target, self.grad_step.params, self.cfg.tau)
        self.last_target_update = self.env_steps

    def state_dict(self) -> dict:
        """Both networks (``modules``), the optimizer, the sampling RNG, the counters and, with
        ``save_replay``, the replay buffer (without it, or with several GMIs, a resumed run
        refills the buffer before it trains again: `refill_steps`)."""
        state = {"modules": {"q_network": self.q_network.state_dict(),
                             "target_network": self.target_network.state_dict()},
                 "optimizers": {"q_network": self.grad_step.state_dict()},
                 "generator": self.generator.get_state(), "iteration": self.iteration,
                 "env_steps": self.env_steps, "last_target_update": self.last_target_update}
        if self.cfg.save_replay and self.replay is not None:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output.

        Raises:
            ValueError: the stored weights or optimizer do not fit this model.
        """
        load_modules({"q_network": self.q_network, "target_network": self.target_network},
                     state["modules"])
        self.grad_step.load_state_dict(state["optimizers"]["q_network"])
        self.generator.set_state(state["generator"])
        self.iteration, self.env_steps = int(state["iteration"]), int(state["env_steps"])
        self.last_target_update = int(state["last_target_update"])
        self.acting.epsilon = self.epsilon()  # (eval's sampling acts as the trained agent did)
        self._refill_until = 0 if "replay" in state else self.env_steps + refill_steps(
            self.cfg.learning_starts, self.cfg.buffer_size, self.total_steps - self.env_steps)
        if "replay" in state:
            self.replay = make_replay(self.cfg.buffer_size, self.ctx.spec, self.ctx.num_envs,
                                      self.ctx.device, state["replay"], self.cfg.n_step,
                                      self.cfg.gamma)

    def close(self) -> None:
        self.grad_step.close()
