"""The trainer role's learner shared by the actor-critics of the ``async_training`` template
(APPO, A3C): learn from a batch of fragments, publish the weights serving GMIs act with, count
the policy version; each algorithm gives its loss, optimizer and passes over a batch.
"""

from __future__ import annotations

import numpy as np
import torch

from gmi_drl.algos.base import AlgoContext, actor_critic_state, load_actor_critic_state
from gmi_drl.models.actor_critic import ActorCritic, build_actor_critic
from gmi_drl.rollout.acting import make_acting


def evaluate(model: ActorCritic, obs, actions, last_obs):
    """Log-probabilities, entropies and values of a ``[T, M]`` minibatch, and ``V(last_obs)``."""
    T, M = obs.shape[:2]
    new = model.evaluate(obs.flatten(0, 1), actions.flatten(0, 1))
    return (new.logprob.view(T, M), new.entropy.view(T, M), new.value.view(T, M),
            model.value(last_obs))


def normalized(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / (x.std() + 1e-8)


class AsyncLearner:
    """The trainer role's learner of an actor-critic (`gmi_drl.algos.base.AsyncAlgorithm`):
    `update` learns from one batch of fragments (`gmi_drl.comm.channels.Batcher`'s), then its
    weights are the next ``policy_version``. A subclass gives its loss (`objective`), its
    optimizer and how it passes over a batch (`passes`).

    Args:
        cfg: hyper-parameters. ctx: the task and the trainer's parts (its gradient step
            factory reduces across trainer GMIs; ``ctx.num_envs`` is a serving GMI's envs).

    Raises:
        ValueError: spaces the actor-critic does not support.
    """

    optimizer = "adam"

    def __init__(self, cfg, ctx: AlgoContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.steps_per_iteration = cfg.steps_per_iteration(ctx.num_envs)
        self.model = self.acting_model(ctx.spec, ctx.model).to(ctx.device)
        self.grad_step = ctx.make_grad_step(self.model, self.objective(), cfg.learning_rate,
                                            cfg.max_grad_norm, self.optimizer_eps(),
                                            optimizer=self.optimizer)
        self.acting = make_acting(self.model, ctx.action_generator, ctx.arrays, ctx.compile)
        """the policy as the trainer's weights act (``gmi-drl eval``)"""
        self.generator = torch.Generator().manual_seed(ctx.seed)  # minibatch order
        self.policy_version = 0
        self.iteration = 0

    @staticmethod
    def acting_model(spec, m) -> ActorCritic:
        """The actor-critic of task ``spec`` (`EnvSpec`) and model config ``m``: the trainer's,
        and each serving GMI's copy (both built after ``torch.manual_seed(seed)``, so they start
        equal)."""
        return build_actor_critic(spec.observation_space, spec.action_space, m.encoder,
                                  m.actor_hidden, m.critic_hidden, m.activation, m.cnn_features)

    def objective(self):
        """The loss in a `GradStep`'s shape: ``(loss, (policy_loss, value_loss, entropy,
        log_rhos))`` of a ``[T, M]`` minibatch."""
        raise NotImplementedError

    def optimizer_eps(self) -> float:
        raise NotImplementedError

    def passes(self) -> tuple[int, int]:
        """``(epochs, minibatches per epoch)`` over each batch."""
        return 1, 1

    def learn(self, batch: dict[str, torch.Tensor],
              update_obs_stats: bool = True) -> dict[str, float]:
        """`passes` of minibatch steps over ``batch`` (every trajectory whole);
        the observations are normalised first when the run normalises them, folding the batch
        into the statistics when ``update_obs_stats`` (the trainer that publishes: its
        statistics are the ones `weights` sends; other trainers take them, `set_obs_stats`).
        Returns ``losses/...`` means and the gradient step's metrics."""
        step, norm = self.grad_step, self.ctx.obs_norm
        epochs, minibatches = self.passes()
        obs, last_obs = batch["obs"], batch["last_obs"]
        if norm is not None:
            T, N = obs.shape[:2]
            obs = _float(norm(_as_array(obs.flatten(0, 1)), update_obs_stats)).view(
                T, N, *obs.shape[2:])
            last_obs = _float(norm(_as_array(last_obs), update=False))
        fields = (obs, batch["actions"], batch["logprobs"], batch["rewards"],
                  batch["terminated"], batch["truncated"], batch["final_values"], last_obs)
        N = obs.shape[1]
        m = N // minibatches
        aux = []
        for _ in range(epochs):
            order = (torch.randperm(N, generator=self.generator) if minibatches > 1
                     else torch.arange(N))
            for i in range(minibatches):
                cols = order[i * m:(i + 1) * m].to(obs.device)
                mb = [x.index_select(0 if x is last_obs else 1, cols)
                      if minibatches > 1 else x for x in fields]
                aux.append(step(*mb))
        comm = step.drain()
        self.iteration += 1
        self.policy_version += 1
        log_rhos = torch.cat([a[3].reshape(-1) for a in aux])
        means = torch.stack([torch.stack(a[:3]) for a in aux]).mean(0).tolist()
        return {"losses/policy_loss": means[0], "losses/value_loss": means[1],
                "losses/entropy": means[2],
                "losses/importance_ratio": float(log_rhos.exp().mean()),
                "losses/learning_rate": step.lr, **comm}

    def weights(self) -> list[np.ndarray]:
        """What serving GMIs act with, as arrays in a fixed order: every tensor of the model's
        state, then the observation normaliser's mean and variance (when the run has one)."""
        out = [t.detach().cpu().numpy() for t in self.model.state_dict().values()]
        if self.ctx.obs_norm is not None:
            rms = self.ctx.obs_norm.rms  # NumPy on the CPU, tensors on a device
            out += [torch.as_tensor(x).cpu().numpy().astype(np.float64, copy=False)
                    for x in (rms.mean, rms.var)]
        return out

    def set_obs_stats(self, mean: np.ndarray, var: np.ndarray) -> None:
        """Take the observation statistics another trainer published (`weights`' last two
        arrays); no-op without observation normalisation."""
        norm = self.ctx.obs_norm
        if norm is not None:
            norm.rms.mean = norm.rms.arrays.from_torch(torch.from_numpy(mean.copy()))
            norm.rms.var = norm.rms.arrays.from_torch(torch.from_numpy(var.copy()))

    def state_dict(self) -> dict:
        """Weights (``modules``), optimizer moments, the shuffling RNG, the update count and
        the policy version."""
        return {**actor_critic_state(self.model, self.grad_step, self.iteration,
                                     self.generator), "policy_version": self.policy_version}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output (`load_actor_critic_state`)."""
        self.iteration = load_actor_critic_state(state, self.model, self.grad_step,
                                                 self.generator)
        self.policy_version = int(state["policy_version"])

    def close(self) -> None:
        self.grad_step.close()


def _as_array(x: torch.Tensor):
    return x.numpy() if x.device.type == "cpu" else x


def _float(x) -> torch.Tensor:
    t = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
    return t.to(torch.float32)
