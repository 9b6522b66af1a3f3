"""DDPG and TD3: targets and losses against hand-computed values, TD3's smoothing and delayed
update, exploration in the task's bounds, checkpoints, and learning Pendulum."""

import copy
import dataclasses
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

from gmi_drl import envs
from gmi_drl.algos import DDPG, TD3, AlgoContext, DDPGConfig, ModelConfig, TD3Config
from gmi_drl.algos.ddpg import (DeterministicActor, QCritics, actor_objective, critic_objective,
                                critic_target, smoothed_target_action)
from gmi_drl.config import field_errors, preset
from gmi_drl.optim.grad_step import make_grad_step
from gmi_drl.rollout.arrays import HostArrays, arrays_for
from gmi_drl.train import train
from tests.sb3_batches import feed_same_batches


def test_critic_target_masks_terminations_and_takes_the_smaller_critic():
    q_next = torch.tensor([[1.0, 5.0, -2.0], [2.0, 3.0, 4.0]])  # 2 critics, 3 samples
    rewards, terminated = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    torch.testing.assert_close(critic_target(q_next, rewards, terminated, 0.9),
                               torch.tensor([1 + 0.9 * 1.0, 0.5, 0.9 * -2.0]))
    torch.testing.assert_close(critic_target(q_next[1:], rewards, terminated, 0.9),
                               torch.tensor([1 + 0.9 * 2.0, 0.5, 0.9 * 4.0]))  # DDPG: one critic


def test_target_smoothing_clips_the_noise_then_the_action():
    action = torch.tensor([[0.0, 0.9, -0.95]])
    noise = torch.tensor([[1.0, 1.0, -10.0]])  # scaled by 0.2: 0.2, 0.2, -2 -> clipped to -0.5
    torch.testing.assert_close(smoothed_target_action(action, noise, 0.2, 0.5),
                               torch.tensor([[0.2, 1.0, -1.0]]))


class _Const(torch.nn.Module):
    """Q'(s', a') = c_i for critic i, and mu'(s') = 0: the target is known by hand."""

    def __init__(self, values):
        super().__init__()
        self.values = torch.tensor(values)

    def forward(self, obs, actions=None):
        if actions is None:
            return torch.zeros(len(obs), 2)
        return self.values[:, None].expand(len(self.values), len(obs))


def test_critic_loss_is_the_summed_squared_error_of_each_critic():
    torch.manual_seed(0)
    critics = QCritics(3, 2, "8", "relu", 2)
    obs, actions = torch.randn(4, 3), torch.rand(4, 2) * 2 - 1
    rewards, terminated = torch.tensor([1.0, 0.0, -1.0, 2.0]), torch.tensor([0.0, 0.0, 1.0, 0.0])
    loss, (aux, q1_mean) = critic_objective(
        critics, obs, actions, rewards, obs, terminated, torch.tensor([0.5, 0.5, 0.5, 0.25]),
        actor_target=_Const([3.0, 2.0]), critics_target=_Const([3.0, 2.0]),
        target_policy_noise=0.0, target_noise_clip=0.0)
    # min(3, 2); the last row's discount as after a 2-step sum with gamma 0.5
    target = rewards + torch.tensor([0.5, 0.5, 0.5, 0.25]) * (1 - terminated) * 2.0
    q = critics(obs, actions)
    expected = ((q[0] - target) ** 2).mean() + ((q[1] - target) ** 2).mean()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(aux, expected.detach())
    torch.testing.assert_close(q1_mean, q[0].mean().detach())


def test_the_actor_loss_moves_the_actor_only():
    torch.manual_seed(1)
    actor, critics = DeterministicActor(3, 2, "8", "relu"), QCritics(3, 2, "8", "relu", 2)
    obs = torch.randn(5, 3)
    loss, _ = actor_objective(actor, obs, critics=critics)
    torch.testing.assert_close(loss, -critics.q1(obs, actor(obs)).mean())
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())
    assert all(p.grad is None for p in critics.parameters())


def _learner(cls=TD3, cfg_cls=TD3Config, seed=0, **cfg):
    with envs.make("Pendulum-v1", 1, num_workers=0) as probe:
        spec = probe.spec
    ctx = AlgoContext(spec, 2, ModelConfig(actor_hidden="16", critic_hidden="16",
                                           activation="relu"), 100, seed,
                      functools.partial(make_grad_step, compile=False),
                      torch.Generator().manual_seed(seed))
    return cls(cfg_cls(**{"buffer_size": 256, "minibatch_size": 16, "learning_starts": 8, **cfg}),
               ctx)


def test_td3_updates_the_actor_and_targets_every_policy_delay_critic_steps():
    algo = _learner(gradient_steps=3, policy_delay=2, tau=0.5)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(4):
            algo.collect(pool)
    actor_before = algo.actor_step.params.data.clone()
    target_before = parameters_to_vector(algo.actor_target.parameters()).clone()
    algo.update()
    assert algo.critic_step.optimizer.steps == 3 and algo.actor_step.optimizer.steps == 1
    assert not torch.equal(algo.actor_step.params.data, actor_before)
    # the one soft update ran after the actor step: target = (target + actor) / 2
    torch.testing.assert_close(parameters_to_vector(algo.actor_target.parameters()),
                               0.5 * target_before + 0.5 * algo.actor_step.params.data)
    algo.update()  # critic steps 4, 5, 6: actor steps after 4 and 6
    assert algo.critic_step.optimizer.steps == 6 and algo.actor_step.optimizer.steps == 3
    algo.cfg.gradient_steps = 1  # critic step 7 alone: no actor step in this iteration
    metrics = algo.update()
    assert algo.actor_step.optimizer.steps == 3
    assert "losses/actor_loss" in metrics  # the latest one, so a logged row has it


def test_exploration_stays_in_the_bounds_and_the_replay_holds_rescaled_actions():
    algo = _learner(DDPG, DDPGConfig, exploration_noise=0.5, learning_starts=4)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(8):
            algo.collect(pool)
    stored = algo.replay.actions[:algo.replay.size]
    assert stored.min() >= -1 and stored.max() <= 1 and stored.std() > 0.1
    obs = np.zeros((64, 3), np.float32)
    env_action = algo.acting.act(obs).action
    assert env_action.min() >= -2.0 and env_action.max() <= 2.0  # Pendulum's torque bounds
    greedy = algo.acting.act(obs, deterministic=True).action
    np.testing.assert_allclose(greedy, np.broadcast_to(greedy[0], greedy.shape))
    with pytest.raises(ValueError, match="finite action bounds"):
        type(algo.acting)(algo.actor, algo.critics, gym.spaces.Box(-np.inf, np.inf, (1,)), 0.1,
                          torch.Generator(), HostArrays())


def _ends_then_stds(acting, done, n=6):
    acting.scaled(np.zeros((n, 3), np.float32) if acting._host else torch.zeros(n, 3))
    before = np.array(acting.stds).copy()
    acting.episodes_ended(done if acting._host else torch.as_tensor(done))
    return before.ravel(), np.array(acting.stds).ravel()


@pytest.mark.parametrize("arrays", ["host", "tensors"])
def test_mixed_noise_gives_each_env_a_std_in_range_drawn_again_when_its_episode_ends(arrays):
    algo = _learner(exploration_noise=0.05, exploration_noise_max=0.4)
    acting = algo.make_acting(HostArrays() if arrays == "host" else arrays_for("cpu", True))
    done = np.array([True, False, False, True, False, False])
    before, after = _ends_then_stds(acting, done)
    assert ((before >= 0.05) & (before <= 0.4)).all() and len(set(before)) == 6
    np.testing.assert_array_equal(after[~done], before[~done])  # kept where nothing ended
    assert (after[done] != before[done]).all() and ((after >= 0.05) & (after <= 0.4)).all()
    # each env's spread follows its own std: 4,000 draws of one observation per env
    acting.stds = acting.stds * 0 + (np.array([[0.01], [0.3]] * 3, np.float32) if acting._host
                                     else torch.tensor([[0.01], [0.3]] * 3))
    obs = np.zeros((6, 3), np.float32) if acting._host else torch.zeros(6, 3)
    greedy = np.asarray(acting.scaled(obs, deterministic=True))
    spread = np.std([np.asarray(acting.scaled(obs)) - greedy for _ in range(4000)], axis=0)
    np.testing.assert_allclose(spread[:, 0], [0.01, 0.3] * 3, rtol=0.1)
    fixed = _learner(exploration_noise=0.1).make_acting(HostArrays())
    fixed.scaled(np.zeros((6, 3), np.float32))
    assert fixed.stds is None  # one std for every env: nothing drawn per env
    assert TD3Config(exploration_noise=0.2, exploration_noise_max=0.1).validate(1, 1) == [
        "algo.exploration_noise_max=0.1 must be 0 (one std for every env) or >= "
        "algo.exploration_noise=0.2 (the least std of mixed noise)"]


def test_mixed_noise_draws_again_where_collected_episodes_end():
    algo = _learner(exploration_noise=0.01, exploration_noise_max=0.5, learning_starts=0)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step",
                   max_episode_steps=3) as pool:
        algo.collect(pool)
        first = algo.acting.stds.copy()
        algo.collect(pool)  # step 2 of 3
        np.testing.assert_array_equal(algo.acting.stds, first)
        algo.collect(pool)  # step 3: both episodes truncated
        assert (algo.acting.stds != first).all()


@pytest.mark.parametrize("cls, cfg_cls, n_step", [(DDPG, DDPGConfig, 1), (TD3, TD3Config, 1),
                                                  (TD3, TD3Config, 3)])
def test_a_checkpoint_with_the_replay_gives_the_same_next_update(cls, cfg_cls, n_step):
    first = _learner(cls, cfg_cls, save_replay=True, gradient_steps=3, n_step=n_step)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(8):
            first.collect(pool)
            first.update()
    state = copy.deepcopy(first.state_dict())
    second = _learner(cls, cfg_cls, seed=5, save_replay=True, gradient_steps=3, n_step=n_step)
    second.load_state_dict(state)
    assert first.update() == second.update()
    for name in ("actor", "critics", "actor_target", "critics_target"):
        for key, t in getattr(first, name).state_dict().items():
            torch.testing.assert_close(t, getattr(second, name).state_dict()[key], rtol=0, atol=0)


def test_observation_normalisation_keeps_raw_replays_and_normalises_acting_and_minibatches():
    """``--norm.obs``: the replay holds the pool's observations; every collected step (the
    warm-up's too) folds into the statistics; minibatches are normalised with the statistics of
    the update."""
    from gmi_drl.rollout.normalize import ObsNormalizer

    algo = _learner(learning_starts=8)
    norm = ObsNormalizer((3,), clip=5.0)
    algo.ctx = dataclasses.replace(algo.ctx, obs_norm=norm)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as twin:
        first = twin.reset()[0].copy()
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(6):
            algo.collect(pool)
            algo.update()
    assert norm.rms.count == pytest.approx(12 + 1e-4)  # 6 steps of 2 envs
    np.testing.assert_array_equal(algo.replay.obs[:2].numpy(), first)  # raw
    batch = algo.replay.sample(16, torch.Generator().manual_seed(0))
    got = algo._batch_normalizer()(batch)
    expected = np.clip((batch.obs.numpy() - norm.rms.mean) / np.sqrt(norm.rms.var + norm.eps),
                       -5, 5)
    np.testing.assert_allclose(got.obs.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert got.rewards is batch.rewards and not torch.equal(got.next_obs, batch.next_obs)


def test_td3_trains_and_evaluates_with_observation_normalisation(tmp_path):
    from gmi_drl.evaluate import evaluate

    cfg = preset("classic", algo="td3")
    cfg.model.actor_hidden = cfg.model.critic_hidden = "16"
    cfg.total_timesteps, cfg.algo.learning_starts, cfg.placement = 400, 256, "serial"
    cfg.norm.obs, cfg.log.tensorboard, cfg.run_dir = True, False, str(tmp_path / "td3")
    cfg.checkpoint.every, cfg.compile = 400, False  # (the compiled step: test_grad_step's)
    result = train(cfg)
    assert result.global_step == 400
    path = tmp_path / "td3" / "checkpoints" / "iteration-0000400.pt"
    state = torch.load(path, weights_only=False)
    assert state["obs_norm"] is not None and state["obs_norm"]["count"] >= 400
    assert len(evaluate(path, episodes=1).returns) == 1


def test_ddpg_refuses_what_it_cannot_learn():
    with envs.make("CartPole-v1", 1, num_workers=0) as probe:
        spec = probe.spec
    ctx = AlgoContext(spec, 1, ModelConfig(), 10, 0, make_grad_step, torch.Generator())
    with pytest.raises(ValueError, match="Box action space"):
        TD3(TD3Config(), ctx)
    cfg = TD3Config(tau=0.0, policy_delay=0, n_step=-1)  # (its bounds: declared on the fields)
    assert [e.message for e in field_errors(cfg, "algo.")] == [
        "algo.tau=0.0 must be in (0, 1]", "algo.n_step=-1 must be >= 1",
        "algo.policy_delay=0 must be >= 1"]
    assert cfg.validate(1, 1) == []  # no rule between fields broken


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ddpg", "td3"])
def test_learns_pendulum(tmp_path, algo):
    """RL-Zoo's Pendulum settings with 64:64 networks and 1,000 random steps: the last five
    episodes average above -600 within 8,000 steps (random play: about -1,200)."""
    cfg = preset("classic", algo=algo)
    cfg.model.actor_hidden = cfg.model.critic_hidden = "64:64"
    cfg.total_timesteps, cfg.algo.learning_starts, cfg.placement = 8_000, 1_000, "serial"
    cfg.log.tensorboard, cfg.run_dir = False, str(tmp_path / algo)
    cfg.compile = False  # (eager: 8,000 steps take less than the compile; test_grad_step's)
    returns = train(cfg).episode_returns
    assert len(returns) == 40 and np.mean(returns[-5:]) > -600, returns


@pytest.mark.parametrize("algo", ["ddpg", "td3"])
def test_updates_equal_stable_baselines3_on_the_same_batches(algo):
    """Same weights, the same minibatches and the same target-smoothing noise: after 12
    gradient steps (TD3: 6 actor steps and target updates) the four networks equal SB3's
    ``train``'s to float32 rounding (SB3 draws its noise with ``normal_`` from torch's global
    RNG, the learner with ``randn`` from its own generator: the same numbers, seeded alike)."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.logger import Logger

    cls, cfg_cls, ref_cls = {"ddpg": (DDPG, DDPGConfig, sb3.DDPG),
                             "td3": (TD3, TD3Config, sb3.TD3)}[algo]
    ref = ref_cls("MlpPolicy", gym.make("Pendulum-v1"), learning_rate=1e-3, batch_size=32,
                  gamma=0.9, tau=0.05, policy_kwargs=dict(net_arch=[16]), seed=0,
                  device="cpu")
    ref.set_logger(Logger(None, []))
    ours = _learner(cls, cfg_cls, minibatch_size=32, gamma=0.9, tau=0.05, learning_starts=0)
    pairs = [(ours.actor, ref.actor), (ours.actor_target, ref.actor_target),
             (ours.critics, ref.critic), (ours.critics_target, ref.critic_target)]
    with torch.no_grad():
        for mine, theirs in pairs:
            for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
                p.copy_(q)
    feed_same_batches(ours, ref, updates=12)
    ours.env_steps = 1
    for k in range(12):
        torch.manual_seed(k)
        ref.train(gradient_steps=1, batch_size=32)
        ours.generator.manual_seed(k)
        ours.update()
    assert ours.critic_step.optimizer.steps == 12
    assert ours.actor_step.optimizer.steps == (6 if algo == "td3" else 12)
    for mine, theirs in pairs:
        for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-5)
