"""Collection and acting: every acting path draws the same actions from the same generator, and
the device form of the collector (torch tensors; here on the CPU) fills the buffer as the NumPy
form does."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import gmi_drl.envs as envs
from gmi_drl.models import build_actor_critic
from gmi_drl.rollout.acting import (CompiledActing, NumpyActing, NumpyForward, TorchActing,
                                    TorchForward, implementation, make_acting, mlp_forward)
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


def test_one_choice_runs_q_networks_and_deterministic_actors_as_actor_critics():
    """`mlp_forward` (DQN's Q, DDPG's actor) picks as `make_acting` does, and its NumPy twin
    computes what the module does (ReLU MLPs included; a CNN has no twin)."""
    from gmi_drl.algos.ddpg import DeterministicActor
    from gmi_drl.algos.dqn import QNetwork

    torch.manual_seed(0)
    q = QNetwork(gym.spaces.Box(-1, 1, (5,)), 3, "mlp", "16:16", "relu")
    actor = DeterministicActor(5, 2, "16", "tanh")
    obs = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    for module, mlp, post in ((q, q.net[-1], None), (actor, actor.mlp, np.tanh)):
        numpy = mlp_forward(module, mlp, HostArrays(), post)
        assert isinstance(numpy, NumpyForward)
        with torch.no_grad():
            np.testing.assert_allclose(numpy(obs), module(torch.from_numpy(obs)).numpy(),
                                       rtol=1e-5, atol=1e-6)
        on_device = mlp_forward(module, mlp, DeviceArrays("cpu"), post)
        assert isinstance(on_device, TorchForward)
        assert isinstance(on_device(torch.from_numpy(obs)), torch.Tensor)
    cnn = QNetwork(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 3, "nature_cnn", "", "relu")
    assert isinstance(mlp_forward(cnn, cnn.net[-1], HostArrays()), TorchForward)
    assert [implementation(HostArrays(), True, True), implementation(HostArrays(), False, True),
            implementation(DeviceArrays("cpu"), True, False)] == ["numpy", "compiled", "torch"]


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
