"""A2C: its loss and n-step returns against hand-computed values, learning CartPole, identical
weights on every GMI, and a checkpoint that continues the same run."""

import copy
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from gmi_drl import envs
from gmi_drl.algos import A2C, A2CConfig, AlgoContext, ModelConfig
from gmi_drl.algos.a2c import a2c_loss
from gmi_drl.config import preset
from gmi_drl.optim.grad_step import make_grad_step
from gmi_drl.rollout.storage import RolloutBuffer
from gmi_drl.train import train


def test_a2c_loss_is_the_policy_gradient_value_error_and_entropy():
    logprob = torch.tensor([-0.5, -1.0, -2.0])
    adv = torch.tensor([1.0, -2.0, 0.5])
    value, returns = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0])
    entropy = torch.tensor([0.6, 0.3, 0.0])
    loss, pg, v, ent = a2c_loss(logprob, adv, value, returns, entropy, ent_coef=0.1, vf_coef=0.5)
    expected_pg = -(1.0 * -0.5 + -2.0 * -1.0 + 0.5 * -2.0) / 3
    assert float(pg) == pytest.approx(expected_pg)
    assert float(v) == pytest.approx((1.0 + 0.0 + 4.0) / 3)
    assert float(ent) == pytest.approx(0.3)
    assert float(loss) == pytest.approx(expected_pg - 0.1 * 0.3 + 0.5 * 5.0 / 3)


def test_gae_with_lambda_one_gives_the_n_step_returns():
    """A2C's returns: ``sum_k gamma^k r_{t+k} + gamma^{T-t} V(s_T)``, cut at a termination and
    bootstrapped from ``V(final_obs)`` at a truncation."""
    T, gamma = 5, 0.9
    buf = RolloutBuffer(T, 2, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    g = torch.Generator().manual_seed(0)
    buf.rewards.copy_(torch.randn(T, 2, generator=g))
    buf.values.copy_(torch.randn(T, 2, generator=g))
    buf.last_values.copy_(torch.tensor([3.0, -1.0]))
    buf.terminated[1, 0] = True  # env 0 terminates after step 1
    buf.truncated[2, 1] = True  # env 1 is truncated after step 2, V(final_obs) = 7
    buf.final_values[2, 1] = 7.0
    buf.compute_advantages(gamma, 1.0)
    r, last = buf.rewards.tolist(), buf.last_values.tolist()
    expected = torch.zeros(T, 2)
    for b in range(2):
        for t in range(T):
            ret, discount = 0.0, 1.0
            for k in range(t, T):
                ret += discount * r[k][b]
                discount *= gamma
                if buf.terminated[k, b]:
                    discount = 0.0
                    break
                if buf.truncated[k, b]:
                    ret += discount * float(buf.final_values[k, b])
                    discount = 0.0
                    break
            ret += discount * last[b]
            expected[t, b] = ret
    torch.testing.assert_close(buf.returns, expected)
    torch.testing.assert_close(buf.advantages, expected - buf.values)


def _a2c(seed=0, **cfg):
    with envs.make("CartPole-v1", 1, num_workers=0) as probe:
        spec = probe.spec
    ctx = AlgoContext(spec, 4, ModelConfig(), 100, seed,
                      functools.partial(make_grad_step, compile=False),
                      torch.Generator().manual_seed(seed))
    return A2C(A2CConfig(**cfg), ctx)


def test_a_checkpoint_continues_with_the_same_update():
    first = _a2c()
    with envs.make("CartPole-v1", 4, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(3):
            first.collect(pool)
            first.update()
        state = copy.deepcopy(first.state_dict())
        second = _a2c(seed=7)
        second.load_state_dict(state)
        first.collect(pool)
    second.buf = first.buf  # the same rollout
    assert first.update() == second.update()
    for name, t in first.model.state_dict().items():
        torch.testing.assert_close(t, second.model.state_dict()[name], rtol=0, atol=0)
    assert second.grad_step.optimizer.steps == 4


def test_a2c_learns_cartpole(tmp_path):
    """RL-Zoo's CartPole A2C (8 envs, 5 steps, RMSprop 7e-4): some 10-episode mean reaches 150
    within 25k steps (random play: ~22)."""
    cfg = preset("classic", algo="a2c")
    cfg.total_timesteps, cfg.placement, cfg.compile = 25_000, "serial", False  # (as DQN's)
    cfg.log.tensorboard, cfg.run_dir = False, str(tmp_path / "learn")
    returns = train(cfg).episode_returns
    best = np.convolve(returns, np.ones(10) / 10, "valid").max()
    assert best >= 150, returns[-40:]
