"""The collection core on a pool of tensors (Warp's CPU device with ``tensors=True``, the path a
GPU run takes): TD3 and DQN train with every per-step array a tensor on the pool's device, and
no collection takes a per-step array to the host."""

import dataclasses
import functools

import numpy as np
import pytest
import torch

from gmi_drl import envs
from gmi_drl.algos import (DDPG, SAC, TD3, AlgoContext, DDPGConfig, ModelConfig, SACConfig,
                           TD3Config)
from gmi_drl.config import preset
from gmi_drl.envs.warp.pool import warp_error
from gmi_drl.optim.grad_step import make_grad_step
from gmi_drl.rollout.arrays import arrays_for
from gmi_drl.rollout.normalize import ObsNormalizer
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
        torch.from_numpy(np.zeros(3)).copy_(x)
    assert n[0] == 4


def _gpu_scale(algo):
    """The ``gmi-ant`` preset's algorithm settings (FastTD3's recipe: n-step returns, AdamW,
    TD3's mixed exploration noise), on buffers small enough for a test."""
    cfg = preset("gmi-ant", algo={TD3: "td3", SAC: "sac"}[algo]).algo
    return dataclasses.replace(cfg, buffer_size=512, minibatch_size=16, learning_starts=64,
                               train_frequency=8)


@warp
@pytest.mark.parametrize("algo, gpu_scale", [(TD3, False), (DDPG, False), (SAC, False),
                                             (TD3, True), (SAC, True)])
def test_replay_actor_critics_train_on_a_warp_pool_of_tensors(algo, gpu_scale):
    """TD3, DDPG and SAC (also with the GPU-scale presets' settings): uniform warm-up actions
    and then the actor's, each without a per-step host transfer (mixed noise drawing each
    world's std again where its episode ended, on the device); the replay holds tensors from
    the pool's device."""
    config = {TD3: TD3Config, DDPG: DDPGConfig, SAC: SACConfig}[algo]
    cfg = _gpu_scale(algo) if gpu_scale else config(buffer_size=512, minibatch_size=16,
                                                    learning_starts=64, train_frequency=8)
    with envs.make("Ant-gmi-v0", 4, seed=0, autoreset="same_step", tensors=True) as pool:
        obs_norm = (ObsNormalizer(pool.spec.observation_space.shape,
                                  arrays=arrays_for("cpu", pool_tensors=True))
                    if gpu_scale else None)  # (the presets normalise observations)
        ctx = AlgoContext(pool.spec, 4, ModelConfig(actor_hidden="32", critic_hidden="32"), 10,
                          0, functools.partial(make_grad_step, compile=False),
                          torch.Generator().manual_seed(0), obs_norm=obs_norm)
        torch.manual_seed(0)
        learner = algo(cfg, ctx)

        def collect(k):
            learner._collector.collect(k, learner._policy, learner._episodes_ended)

        learner.collect(pool)
        assert per_step_transfers(collect) == 0  # warm-up: 32 + 32 env steps
        for _ in range(3):
            learner.collect(pool)
            metrics = learner.update()
        assert learner.env_steps > 64 and np.isfinite(metrics["losses/critic_loss"])
        replay = learner.replay
        assert replay.size == learner.env_steps and replay.obs.abs().sum() > 0
        assert isinstance(learner._collector.obs, torch.Tensor)
        assert per_step_transfers(collect) == 0  # the actor's actions
        if gpu_scale:
            assert obs_norm.rms.count == pytest.approx(learner.env_steps + 1e-4)
        if gpu_scale and algo is TD3:
            stds = learner.acting.stds
            assert isinstance(stds, torch.Tensor) and stds.shape == (4, 1)
            assert ((stds >= 0.001) & (stds <= 0.4)).all()


@warp
@pytest.mark.parametrize("algo", [TD3, SAC])
def test_an_iteration_at_gpu_scale_reads_nothing_to_the_host(algo):
    """The GPU-scale presets' schedule (one env step of every world per iteration, FastTD3's):
    a whole iteration past the warm-up, collection and the update's gradient steps, takes
    nothing to the host; its episodes and metrics wait on the device until they are read (the
    runner reads them at its logged iterations only)."""
    cfg = dataclasses.replace(_gpu_scale(algo), train_frequency=1)  # (the presets' 1)
    with envs.make("Ant-gmi-v0", 4, seed=0, autoreset="same_step", tensors=True) as pool:
        obs_norm = ObsNormalizer(pool.spec.observation_space.shape,
                                 arrays=arrays_for("cpu", pool_tensors=True))
        ctx = AlgoContext(pool.spec, 4, ModelConfig(actor_hidden="32", critic_hidden="32"), 10,
                          0, functools.partial(make_grad_step, compile=False),
                          torch.Generator().manual_seed(0), obs_norm=obs_norm)
        torch.manual_seed(0)
        learner = algo(cfg, ctx)
        while learner.env_steps <= cfg.learning_starts + 8:  # past the warm-up
            learner.collect(pool)
            learner.update()
        with host_transfers() as n:
            for _ in range(3):
                episodes = learner.collect(pool)
                metrics = learner.update()
        assert n[0] == 0
        assert isinstance(metrics["losses/critic_loss"], torch.Tensor)
        assert np.isfinite(float(metrics["losses/critic_loss"]))
        with host_transfers() as n:
            returns = episodes.returns  # read to the host here
        assert n[0] > 0
        with host_transfers() as n:  # then kept
            assert episodes.returns is returns and len(episodes.lengths) == len(returns)
        assert n[0] == 0


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


class _Serving:
    """A serving role over ``B`` envs of warp Ant (6-step episodes) in ``splits`` pools with
    the policy of ``algo`` acting in torch (the same ops on both paths), normalisers, and a
    channel (``mode``: MCC or UCC) of ``T``-step fragments that a batcher reads."""

    def __init__(self, algo, tensors: bool, T: int, B: int = 2, mode: str = "multi",
                 splits: int = 1) -> None:
        import dataclasses

        from gmi_drl.algos import A3C, APPO
        from gmi_drl.comm.channels import Batcher, ChannelPlan, Dispenser, Fabric
        from gmi_drl.comm.weights import WeightStore
        from gmi_drl.envs.spec import env_seeds
        from gmi_drl.envs.warp.locomotion import ANT
        from gmi_drl.envs.warp.pool import WarpPool
        from gmi_drl.rollout.acting import TorchActing
        from gmi_drl.rollout.arrays import HostArrays, pool_arrays
        from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
        from gmi_drl.rollout.trajectory import fragment_fields
        from gmi_drl.runner.roles import ServingRole

        per, task = B // splits, dataclasses.replace(ANT, max_episode_steps=6)
        self.pools = [WarpPool(task, per, env_seeds(s * per, per), tensors=tensors)
                      for s in range(splits)]
        spec = self.pools[0].spec
        fields = fragment_fields(spec.observation_space, spec.action_space, T, B)
        self.fabric = Fabric.create(ChannelPlan(fields, T, B, 1, 1, mode, 1, 8, "block"))
        self.store = WeightStore.create(8)
        torch.manual_seed(0)
        model = {"appo": APPO, "a3c": A3C}[algo].acting_model(spec, ModelConfig())
        arrays = pool_arrays(HostArrays(), self.pools[0])
        acting = TorchActing(model, torch.Generator().manual_seed(1), arrays)
        obs_norm = ObsNormalizer(spec.observation_space.shape, arrays=arrays)
        self.role = ServingRole(self.pools, model, acting, obs_norm,
                                RewardNormalizer(B, 0.99, arrays=arrays),
                                Dispenser(self.fabric, 0), self.store)
        self.batcher = Batcher(self.fabric, 0, fragments_per_batch=1)

    def fragment(self) -> dict:
        self.role.collect()
        assert self.batcher.next(timeout_s=5)
        return {k: v.clone() for k, v in self.batcher.batch.items()}

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
        self.fabric.close()
        self.store.close()


@warp
@pytest.mark.parametrize("algo,mode,splits", [("appo", "multi", 1), ("a3c", "multi", 1),
                                               ("appo", "uni", 1), ("appo", "multi", 2)])
def test_serving_keeps_a_warp_pool_of_tensors_on_its_device(algo, mode, splits):
    """A serving GMI (APPO's, A3C's) over pools of tensors writes the fragments its host path
    writes (the device fragment copied to the channel once per fragment; UCC: row by row, as
    each step is sent; two env splits: each its columns), and over MCC takes nothing to the
    host per step."""
    runs = {}
    for tensors in (True, False):
        serving = _Serving(algo, tensors, T=4, mode=mode, splits=splits)
        try:
            runs[tensors] = [serving.fragment() for _ in range(3)]
        finally:
            serving.close()
    for device, host in zip(runs[True], runs[False]):
        for name in device:
            if name == "final_values":  # every row evaluated vs the truncated ones alone
                torch.testing.assert_close(device[name], host[name], rtol=1e-5, atol=1e-6)
            elif name == "rewards":  # torch divides a float32 tensor by a 0-d float64 one
                # in float32, NumPy in float64: the normalised rewards differ by a rounding
                torch.testing.assert_close(device[name], host[name], rtol=3e-7, atol=0)
            else:
                torch.testing.assert_close(device[name], host[name], rtol=0, atol=0, msg=name)
    frags = runs[True]
    assert any(f["truncated"].any() for f in frags) and any(
        (f["final_values"] != 0).any() for f in frags)
    assert sum(int(f["episode_end"].sum()) for f in frags) >= 2
    if mode == "uni" or splits > 1:
        return
    roles = {k: _Serving(algo, True, T=k) for k in (2, 4)}
    try:
        assert per_step_transfers(lambda k: roles[k].role.collect()) == 0
    finally:
        for serving in roles.values():
            serving.close()
