"""The runner knows algorithms only through the protocol: an algorithm it has never seen, defined
here and registered for the test, trains through `train`, checkpoints, resumes and reduces
across serial GMIs, with nothing in the runner changed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from gmi_drl import algos
from gmi_drl.algos.base import AlgoContext
from gmi_drl.checkpoint import load_checkpoint
from gmi_drl.config import PRESETS, TrainConfig
from gmi_drl.rollout.collector import Episodes
from gmi_drl.train import train


@dataclass
class ValueRegressionConfig:
    """Fit V(obs) to the rewards of random actions: the least an algorithm can be."""

    num_steps: int = 8
    learning_rate: float = 0.05
    gamma: float = 0.99

    def steps_per_iteration(self, num_envs: int) -> int:
        return num_envs * self.num_steps

    def validate(self, num_envs: int, num_gmis: int) -> list[str]:
        return [] if self.num_steps >= 1 else [f"algo.num_steps={self.num_steps} must be >= 1"]


def _mse(model, obs, target):
    value = model(obs).squeeze(-1)
    loss = ((value - target) ** 2).mean()
    return loss, (loss,)


class ValueRegression:
    def __init__(self, cfg: ValueRegressionConfig, ctx: AlgoContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.steps_per_iteration = cfg.steps_per_iteration(ctx.num_envs)
        self.model = nn.Linear(ctx.spec.observation_space.shape[0], 1)
        self.step = ctx.make_grad_step(self.model, _mse, cfg.learning_rate, 10.0)
        self.rng = np.random.default_rng(ctx.seed)
        self.acting = None
        self.iteration = 0

    def collect(self, pool) -> Episodes:
        obs, rewards, returns, lengths = [], [], [], []
        with self.ctx.phase("rollout"):
            if not hasattr(self, "_obs"):
                self._obs, _ = pool.reset()
            for _ in range(self.cfg.num_steps):
                obs.append(self._obs.astype(np.float32))
                actions = self.rng.integers(0, pool.action_space.n, pool.num_envs)
                self._obs, reward, _, _, info = pool.step(actions)
                rewards.append(reward.astype(np.float32))
                end = info["episode_end"]
                returns.append(info["episode_return"][end].copy())
                lengths.append(info["episode_length"][end].copy())
        self._batch = (torch.from_numpy(np.concatenate(obs)),
                       torch.from_numpy(np.concatenate(rewards)))
        return Episodes.concat(returns, lengths)

    def update(self) -> dict[str, float]:
        (loss,) = self.step(*self._batch)
        self.iteration += 1
        return {"losses/value_loss": float(loss), **self.step.drain()}

    def state_dict(self) -> dict:
        return {"modules": {"value": self.model.state_dict()},
                "optimizers": {"value": self.step.state_dict()}, "iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["modules"]["value"])
        self.step.load_state_dict(state["optimizers"]["value"])
        self.iteration = state["iteration"]

    def close(self) -> None:
        self.step.close()


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(algos.ALGORITHMS, "value-regression",
                        (ValueRegressionConfig, ValueRegression))
    monkeypatch.setitem(PRESETS, "value-regression", {})


def _cfg(tmp_path, name, num_gmis=1, iterations=6):
    cfg = TrainConfig(algo=ValueRegressionConfig())
    cfg.env.num_envs, cfg.gmi.num_gmis = 4, num_gmis
    cfg.placement, cfg.compile = "serial", False
    cfg.total_timesteps = iterations * cfg.batch_size
    cfg.log.tensorboard, cfg.checkpoint.every = False, 2
    cfg.run_dir = str(tmp_path / name)
    return cfg


def test_an_algorithm_the_runner_never_saw_trains_and_resumes(registered, tmp_path):
    result = train(_cfg(tmp_path, "run"))
    assert result.global_step == 6 * 32 and result.run_dir.name == "run"
    state = load_checkpoint(result.run_dir)
    assert state["iteration"] == 6 and state["algo"]["iteration"] == 6
    assert list(state["config"]["algo"]) == ["value-regression"]
    assert "VALUE-REGRESSION on CartPole-v1" in (result.run_dir / "summary.md").read_text()
    again = _cfg(tmp_path, "run", iterations=8)
    again.run_dir, again.resume = None, str(result.run_dir)
    resumed = train(again)
    assert resumed.global_step == 8 * 32
    assert load_checkpoint(result.run_dir)["algo"]["iteration"] == 8


def test_its_gmis_reduce_through_the_gradient_step_the_runner_made(registered, tmp_path):
    two = train(_cfg(tmp_path, "two", num_gmis=2))
    assert len(two.weight_digests) == 2 and len(set(two.weight_digests)) == 1
    one = train(_cfg(tmp_path, "one", num_gmis=1))
    assert one.weight_digests[0] != two.weight_digests[0]  # the second GMI's data counted
