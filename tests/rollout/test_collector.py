"""Collection and acting: every acting path draws the same actions from the same generator, and
the device form of the collector (torch tensors; here on the CPU) fills the buffer as the NumPy
form does."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import gmi_drl.envs as envs
from gmi_drl.models import build_actor_critic
from gmi_drl.rollout.acting import CompiledActing, NumpyActing, TorchActing, make_acting
from gmi_drl.rollout.arrays import DeviceArrays, HostArrays
from gmi_drl.rollout.collector import Collector
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.rollout.storage import RolloutBuffer


def _model(space, seed=0):
    torch.manual_seed(seed)
    return build_actor_critic(gym.spaces.Box(-1, 1, (5,)), space)


@pytest.mark.parametrize("space", [gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4)])
def test_acting_paths_draw_the_same_actions(space):
    model = _model(space)
    obs = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    paths = [NumpyActing(model, torch.Generator().manual_seed(3)),
             TorchActing(model, torch.Generator().manual_seed(3), HostArrays()),
             CompiledActing(model, torch.Generator().manual_seed(3), HostArrays())]
    for _ in range(3):
        results = [p.act(obs) for p in paths]
        for r in results[1:]:
            for a, b in zip(results[0], r):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    modes = [p.act(obs, deterministic=True).action for p in paths]
    for m in modes[1:]:
        np.testing.assert_allclose(modes[0], m, rtol=1e-5, atol=1e-5)
    for p in paths[1:]:
        np.testing.assert_allclose(paths[0].value(obs), p.value(obs), rtol=1e-5, atol=1e-6)


def test_make_acting_picks_numpy_on_the_cpu_only_where_it_runs():
    g = torch.Generator()
    assert isinstance(make_acting(_model(gym.spaces.Discrete(2)), g, HostArrays()), NumpyActing)
    relu = build_actor_critic(gym.spaces.Box(-1, 1, (5,)), gym.spaces.Discrete(2),
                              activation="relu")
    assert type(make_acting(relu, g, HostArrays())) is TorchActing
    assert type(make_acting(relu, g, HostArrays(), compile=True)) is CompiledActing
    assert type(make_acting(_model(gym.spaces.Discrete(2)), g, DeviceArrays("cpu"))) is TorchActing


@pytest.mark.parametrize("task", ["CartPole-v1", "Hopper-v5"])
def test_device_collector_fills_the_buffer_as_the_host_collector(task):
    bufs = []
    for arrays in (HostArrays(), DeviceArrays("cpu")):
        pool = envs.make(task, 3, seed=5, autoreset="same_step")
        torch.manual_seed(0)
        model = build_actor_critic(pool.observation_space, pool.action_space)
        acting = make_acting(model, torch.Generator().manual_seed(1), arrays)
        norm = (ObsNormalizer(pool.observation_space.shape, arrays=arrays),
                RewardNormalizer(3, 0.99, arrays=arrays))
        buf = RolloutBuffer(40, 3, pool.observation_space, pool.action_space)
        episodes = Collector(pool, acting, arrays, *norm).collect(buf)
        buf.compute_advantages(0.99, 0.95)
        pool.close()
        bufs.append((buf, episodes))
    (a, ea), (b, eb) = bufs
    for name in ("obs", "actions", "logprobs", "values", "rewards", "final_values",
                 "last_values", "advantages"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-4, atol=1e-4)
    assert torch.equal(a.terminated, b.terminated) and torch.equal(a.truncated, b.truncated)
    assert bool(a.terminated.any() or a.truncated.any())  # episodes ended inside the rollout
    np.testing.assert_allclose(ea.returns, eb.returns)
