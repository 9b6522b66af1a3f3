"""The collection core on a pool of tensors (Warp's CPU device with ``tensors=True``, the path a
GPU run takes): TD3 and DQN train with every per-step array a tensor on the pool's device, and
no collection takes a per-step array to the host."""

import functools

import numpy as np
import pytest
import torch

from gmi_drl import envs
from gmi_drl.algos import TD3, AlgoContext, ModelConfig, TD3Config
from gmi_drl.envs.warp.pool import warp_error
from gmi_drl.optim.grad_step import make_grad_step
from tests.host_sync import host_transfers, per_step_transfers

warp = pytest.mark.skipif(warp_error() is not None, reason=str(warp_error()))


def test_the_check_counts_a_per_step_transfer():
    """`per_step_transfers` sees one ``.numpy()`` per step (the check can fail)."""
    x = torch.zeros(3)

    def collect(k):
        for _ in range(k):
            x.numpy()

    assert per_step_transfers(collect) == 2
    with host_transfers() as n:
        bool(x.any())
        x.cpu().tolist()
    assert n[0] == 3


@warp
def test_td3_trains_on_a_warp_pool_of_tensors():
    with envs.make("Ant-gmi-v0", 4, seed=0, autoreset="same_step", tensors=True) as pool:
        ctx = AlgoContext(pool.spec, 4, ModelConfig(actor_hidden="32", critic_hidden="32"), 10,
                          0, functools.partial(make_grad_step, compile=False),
                          torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        td3 = TD3(TD3Config(buffer_size=512, minibatch_size=16, learning_starts=8,
                            train_frequency=4), ctx)
        for _ in range(3):
            td3.collect(pool)
            metrics = td3.update()
        assert np.isfinite(metrics["losses/critic_loss"])
        replay = td3.replay
        assert replay.size == 3 * 16 and replay.obs.abs().sum() > 0
        assert isinstance(td3._collector.obs, torch.Tensor)

        def collect(k):
            td3._collector.collect(k, td3._policy)

        assert per_step_transfers(collect) == 0


def test_dqn_trains_on_a_discrete_pool_of_tensors():
    """Discrete actions (no warp task has them): `tests.torch_cartpole`, whose steps are
    torch ops where its tensors live; 20-step episodes, so truncations are stored too."""
    from gmi_drl.algos import DQN, DQNConfig
    from tests.torch_cartpole import TorchCartPole

    torch.manual_seed(0)
    pool = TorchCartPole(4, seed=1, max_episode_steps=20)
    ctx = AlgoContext(pool.spec, 4, ModelConfig(critic_hidden="32", activation="relu"), 20, 0,
                      functools.partial(make_grad_step, compile=False),
                      torch.Generator().manual_seed(0))
    dqn = DQN(DQNConfig(buffer_size=512, minibatch_size=16, learning_starts=32,
                        train_frequency=8, target_network_frequency=64), ctx)
    lengths = []
    for _ in range(10):
        lengths.append(dqn.collect(pool).lengths)
        metrics = dqn.update()
    assert np.isfinite(metrics["losses/td_loss"])
    assert dqn.replay.size == 10 * 32 and 20 in np.concatenate(lengths)
    assert dqn.replay.done.any() and (dqn.replay.terminated[:320] == 0).any()

    def collect(k):
        dqn._collector.collect(k, dqn._policy)

    assert per_step_transfers(collect) == 0


def _replay_contents(pool, policy, num_steps=30):
    """The replay a `ReplayCollector` fills over ``pool`` with ``policy(obs, arrays)``."""
    from gmi_drl.rollout.collector import ReplayCollector
    from gmi_drl.rollout.replay import ReplayBuffer

    replay = ReplayBuffer(256, pool.observation_space, pool.action_space, num_envs=4)
    collector = ReplayCollector(pool, replay)
    episodes = collector.collect(num_steps, lambda obs: policy(obs, collector.arrays))
    return [t[:replay.size].clone() for t in replay._tensors], episodes


def test_the_device_path_stores_what_the_host_path_stores():
    """Final observations substituted with ``torch.where`` on the device, ends recorded there:
    the same transitions and episodes as the host path's (CartPole, 12-step episodes: falls
    and time limits)."""
    from tests.torch_cartpole import TorchCartPole

    def policy(obs, arrays):  # envs 0, 1 push towards the pole's lean (balance), 2, 3 away
        action = (obs[:, 2] > 0)
        action[2:] = ~action[2:]
        action = action.long() if isinstance(action, torch.Tensor) else action.astype(np.int64)
        return action, action

    runs = [_replay_contents(TorchCartPole(4, seed=3, max_episode_steps=12, tensors=tensors),
                             policy) for tensors in (True, False)]
    (device, ed), (host, eh) = runs
    for a, b in zip(device, host):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    np.testing.assert_array_equal(ed.lengths, eh.lengths)
    np.testing.assert_array_equal(ed.returns, eh.returns)
    done, terminated = device[5], device[4]
    assert terminated.any() and (done & (terminated == 0)).any()  # both kinds of ends
