"""SAC: one update against a scalar re-derivation of its three losses, the squashed Gaussian's
log-probability against torch.distributions, acting in the task's bounds (NumPy and torch
alike), the schedule, checkpoints, the refusals, and learning Pendulum."""

import copy
import functools
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

from gmi_drl import envs
from gmi_drl.algos import SAC, AlgoContext, ModelConfig, SACConfig
from gmi_drl.algos.sac import SquashedGaussianActing, squashed_log_prob
from gmi_drl.config import field_errors, preset
from gmi_drl.optim.grad_step import make_grad_step
from gmi_drl.rollout.acting import NumpyForward, TorchForward
from gmi_drl.rollout.arrays import HostArrays
from gmi_drl.rollout.replay import ReplayBatch
from gmi_drl.train import train
from tests.sb3_batches import feed_same_batches


def _learner(seed=0, **cfg):
    with envs.make("Pendulum-v1", 1, num_workers=0) as probe:
        spec = probe.spec
    ctx = AlgoContext(spec, 2, ModelConfig(actor_hidden="16", critic_hidden="16",
                                           activation="relu"), 100, seed,
                      functools.partial(make_grad_step, compile=False),
                      torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    return SAC(SACConfig(**{"buffer_size": 256, "minibatch_size": 16, "learning_starts": 16,
                            **cfg}), ctx)


def _layers(mlp):
    """``[(W rows, b)]`` of an MLP as Python floats."""
    linears = [m for m in mlp if isinstance(m, torch.nn.Linear)]
    return [(m.weight.tolist(), m.bias.tolist()) for m in linears]


def _forward(layers, x):
    """The ReLU MLP on a list of floats, one multiply-add at a time."""
    for i, (w, b) in enumerate(layers):
        x = [sum(wjk * xk for wjk, xk in zip(row, x)) + bj for row, bj in zip(w, b)]
        if i < len(layers) - 1:
            x = [max(v, 0.0) for v in x]
    return x


def _sample(actor, obs, noise):
    """``(a, log pi(a))`` of the tanh-squashed Gaussian, for one observation, in floats."""
    out = _forward(actor, obs)
    mean, raw = out[:len(noise)], out[len(noise):]
    action, logp = [], 0.0
    for m, r, n in zip(mean, raw, noise):
        log_std = min(max(r, -20.0), 2.0)
        u = m + math.exp(log_std) * n
        action.append(math.tanh(u))
        logp += (-0.5 * n * n - log_std - 0.5 * math.log(2 * math.pi)
                 - math.log(1.0 - math.tanh(u) ** 2))
    return action, logp


def test_one_update_equals_the_losses_derived_by_hand():
    """Haarnoja et al. 2018b with SB3's choices, one sample at a time: the critics' loss
    ``sum_i 0.5 mean (Q_i - y)^2``, ``y = r + discount (1 - term) (min Q'(s', a') - alpha log
    pi(a'|s'))``; the actor's ``mean(alpha log pi(a|s) - min Q(s, a))`` against the critics
    after their step; the temperature's ``-log_alpha mean(log pi + target_entropy)`` and its
    first Adam step; the targets' Polyak step after the critic step."""
    algo = _learner(seed=1, minibatch_size=3, learning_starts=0, alpha=0.5, tau=0.1,
                    learning_rate=1e-3, target_entropy=-0.3)
    obs = [[0.5, -1.0, 0.2], [1.0, 0.3, -0.7], [-0.4, 0.8, 2.0]]
    actions, rewards = [[0.3], [-0.9], [0.05]], [1.0, -0.5, 0.25]
    next_obs = [[0.1, 0.2, -0.3], [-1.0, 0.5, 0.4], [0.9, -0.6, 1.5]]
    terminated, discount = [0.0, 1.0, 0.0], [0.99, 0.99, 0.9801]  # the last: a 2-step sum
    batch = ReplayBatch(*(torch.tensor(x) for x in (obs, actions, rewards, next_obs, terminated,
                                                    discount)))
    algo.replay = type("One", (), {"sample": lambda self, *_: batch})()
    algo.env_steps = 1
    draws = torch.Generator()
    draws.set_state(algo.generator.get_state())
    critic_noise, actor_noise = (torch.randn((3, 1), generator=draws).tolist() for _ in "ca")
    actor, critics = _layers(algo.actor.mlp), [_layers(q) for q in algo.critics.q]
    targets = [_layers(q) for q in algo.critics_target.q]
    target_flat = parameters_to_vector(algo.critics_target.parameters()).clone()

    metrics = algo.update()

    alpha, gamma_loss = 0.5, 0.0
    for i in range(3):
        a_next, logp_next = _sample(actor, next_obs[i], critic_noise[i])
        soft = min(_forward(t, next_obs[i] + a_next)[0] for t in targets) - alpha * logp_next
        y = rewards[i] + discount[i] * (1.0 - terminated[i]) * soft
        gamma_loss += sum(0.5 * (_forward(q, obs[i] + actions[i])[0] - y) ** 2 / 3
                          for q in critics)
    assert metrics["losses/critic_loss"] == pytest.approx(gamma_loss, rel=1e-5)
    assert metrics["losses/q_values"] == pytest.approx(
        sum(_forward(critics[0], obs[i] + actions[i])[0] for i in range(3)) / 3, rel=1e-5)
    stepped = [_layers(q) for q in algo.critics.q]  # the actor's loss sees them after their step
    samples = [_sample(actor, obs[i], actor_noise[i]) for i in range(3)]
    q_pi = [[_forward(q, obs[i] + a)[0] for q in stepped] for i, (a, _) in enumerate(samples)]
    assert {int(np.argmin(q)) for q in q_pi} == {0, 1}  # each critic is the smaller once
    actor_loss = sum(alpha * logp - min(q) for (_, logp), q in zip(samples, q_pi)) / 3
    assert metrics["losses/actor_loss"] == pytest.approx(actor_loss, rel=1e-5)
    mean_logp = sum(logp for _, logp in samples) / 3
    assert metrics["losses/entropy"] == pytest.approx(-mean_logp, rel=1e-5)
    assert metrics["losses/alpha"] == pytest.approx(alpha, rel=1e-6)
    assert metrics["losses/alpha_loss"] == pytest.approx(
        -math.log(alpha) * (mean_logp - 0.3), rel=1e-5)
    # Adam's first step moves log_alpha by lr against the sign of d loss / d log_alpha
    grad = -(mean_logp - 0.3)
    assert algo.entropy.log_alpha.item() == pytest.approx(
        math.log(alpha) - 1e-3 * math.copysign(1.0, grad), abs=1e-6)
    torch.testing.assert_close(parameters_to_vector(algo.critics_target.parameters()),
                               0.9 * target_flat + 0.1 * algo.critic_step.params.data)


def test_the_log_probability_is_the_tanh_transformed_gaussians():
    torch.manual_seed(3)
    mean, log_std, noise = torch.randn(5, 2), torch.randn(5, 2) * 0.5, torch.randn(5, 2)
    u = mean + log_std.exp() * noise
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean.double(), log_std.exp().double()),
        torch.distributions.TanhTransform())
    expected = dist.log_prob(torch.tanh(u.double())).sum(-1)
    torch.testing.assert_close(squashed_log_prob(noise, log_std, u).double(), expected,
                               rtol=1e-4, atol=1e-4)
    # finite where tanh(u) rounds to 1 in float32 (log(1 - tanh^2) would be -inf)
    far = torch.full((1, 1), 12.0)
    assert torch.isfinite(squashed_log_prob(torch.zeros(1, 1), torch.zeros(1, 1), far)).all()


def test_acting_stays_in_the_bounds_and_numpy_acts_as_torch():
    algo = _learner()
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(12):
            algo.collect(pool)
    stored = algo.replay.actions[:algo.replay.size]
    assert stored.min() >= -1 and stored.max() <= 1 and stored.std() > 0.1
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    acting = algo.acting
    assert isinstance(acting._mlp, NumpyForward)  # the CPU MLP's fast path
    torch_acting = SquashedGaussianActing(algo.actor, algo.critics, gym.spaces.Box(-2, 2, (1,)),
                                          torch.Generator(), HostArrays())
    torch_acting._mlp = TorchForward(algo.actor.mlp, HostArrays())
    for deterministic in (False, True):
        acting.generator.manual_seed(7)
        torch_acting.generator.manual_seed(7)
        np.testing.assert_allclose(acting.act(obs, deterministic).action,
                                   torch_acting.act(obs, deterministic).action, atol=1e-5)
    env_action = acting.act(obs).action
    assert env_action.min() >= -2.0 and env_action.max() <= 2.0  # Pendulum's torque bounds
    mean = algo.actor(torch.from_numpy(obs))[0]
    np.testing.assert_allclose(acting.scaled(obs, deterministic=True),
                               torch.tanh(mean).detach().numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="finite action bounds"):
        SquashedGaussianActing(algo.actor, algo.critics, gym.spaces.Box(-np.inf, np.inf, (1,)),
                               torch.Generator(), HostArrays())


def test_policy_delay_takes_that_many_actor_steps_and_the_targets_follow_every_critic_step():
    algo = _learner(gradient_steps=4, policy_delay=2, tau=0.5)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(8):
            algo.collect(pool)
    algo.update()
    assert algo.critic_step.optimizer.steps == 4
    assert algo.actor_step.optimizer.steps == algo.alpha_step.optimizer.steps == 4  # 2 turns x 2
    algo.cfg.gradient_steps = 1  # critic step 5: no actor turn, but a target update
    before = parameters_to_vector(algo.critics_target.parameters()).clone()
    metrics = algo.update()
    assert algo.actor_step.optimizer.steps == 4 and "losses/actor_loss" in metrics
    torch.testing.assert_close(parameters_to_vector(algo.critics_target.parameters()),
                               0.5 * before + 0.5 * algo.critic_step.params.data)


def test_a_fixed_alpha_is_not_learned():
    algo = _learner(autotune=False, alpha=0.2)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(12):
            algo.collect(pool)
            metrics = algo.update()
    assert algo.alpha_step is None and "entropy" not in algo.state_dict()["optimizers"]
    assert metrics["losses/alpha"] == pytest.approx(0.2) and metrics["losses/alpha_loss"] == 0


@pytest.mark.parametrize("cfg", [{}, {"autotune": False, "n_step": 3, "policy_delay": 2}])
def test_a_checkpoint_with_the_replay_gives_the_same_next_update(cfg):
    first = _learner(save_replay=True, gradient_steps=3, **cfg)
    with envs.make("Pendulum-v1", 2, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(12):
            first.collect(pool)
            first.update()
    state = copy.deepcopy(first.state_dict())
    second = _learner(seed=5, save_replay=True, gradient_steps=3, **cfg)
    second.load_state_dict(state)
    assert first.update() == second.update()
    for name in ("actor", "critics", "critics_target", "entropy"):
        for key, t in getattr(first, name).state_dict().items():
            torch.testing.assert_close(t, getattr(second, name).state_dict()[key], rtol=0, atol=0)


def test_sac_refuses_what_it_cannot_learn():
    with envs.make("CartPole-v1", 1, num_workers=0) as probe:
        spec = probe.spec
    ctx = AlgoContext(spec, 1, ModelConfig(), 10, 0, make_grad_step, torch.Generator())
    with pytest.raises(ValueError, match="SAC needs a Box action space"):
        SAC(SACConfig(), ctx)
    bad = SACConfig(alpha=0.0, policy_delay=0, log_std_min=3.0, policy_learning_rate=-1.0)
    assert [e.message for e in field_errors(bad, "algo.")] == [
        "algo.policy_learning_rate=-1.0 must be > 0 or None", "algo.alpha=0.0 must be > 0",
        "algo.policy_delay=0 must be >= 1"]
    assert bad.validate(1, 1) == ["algo.log_std_min=3.0 must be < algo.log_std_max=2.0"]
    # the replay holds 100 transitions at the first step: a 256 minibatch would repeat them
    assert SACConfig(learning_starts=100).validate(1, 1) == [(
        "algo.minibatch_size=256 is more than the 100 transitions the replay holds at the first "
        "gradient step (algo.learning_starts=100, in whole iterations of 1 env steps): raise "
        "--algo.learning-starts to 256 or lower --algo.minibatch-size")]
    # 8 envs x 4 steps per iteration: learning_starts 100 is reached with 128 transitions
    assert SACConfig(learning_starts=100, minibatch_size=128,
                     train_frequency=4).validate(8, 1) == []
    for name in ("classic", "mujoco", "cleanrl"):
        cfg = preset(name, algo="sac")
        assert cfg.algo.validate(cfg.env.num_envs, 1) == [], name


@pytest.mark.slow
def test_learns_pendulum(tmp_path):
    """RL-Zoo's Pendulum settings with 64:64 networks: the last five episodes average above
    -400 within 6,000 steps (random play: about -1,200)."""
    cfg = preset("classic", algo="sac")
    cfg.model.actor_hidden = cfg.model.critic_hidden = "64:64"
    cfg.total_timesteps, cfg.placement = 6_000, "serial"
    cfg.log.tensorboard, cfg.run_dir = False, str(tmp_path / "sac")
    cfg.compile = False  # (eager: 6,000 steps take less than the compile; test_grad_step's)
    returns = train(cfg).episode_returns
    assert len(returns) == 30 and np.mean(returns[-5:]) > -400, returns


def test_updates_equal_stable_baselines3_on_the_same_batches():
    """Same weights, the same minibatches and the same Gaussian draws: after 12 gradient steps
    the actor, the critics, their targets and alpha equal SB3's ``SAC.train``'s to float32
    rounding. SB3 draws the actor's sample, then the next action's, with ``normal_`` from
    torch's global RNG; the learner the next action's, then the actor's: the test hands it the
    same numbers in its order. SB3's ``log(1 - tanh^2 + 1e-6)`` against the exact correction
    is within the tolerance here (no action near +-1)."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.logger import Logger

    ref = sb3.SAC("MlpPolicy", gym.make("Pendulum-v1"), learning_rate=1e-3, batch_size=32,
                  gamma=0.9, tau=0.05, policy_kwargs=dict(net_arch=[16]), seed=0, device="cpu")
    ref.set_logger(Logger(None, []))
    ours = _learner(minibatch_size=32, gamma=0.9, tau=0.05, learning_rate=1e-3,
                    learning_starts=0)
    with torch.no_grad():
        actor = list(ours.actor.parameters())
        latent = [p for m in ref.actor.latent_pi for p in m.parameters()]
        for p, q in zip(actor[:2], latent, strict=True):
            p.copy_(q)
        actor[2].copy_(torch.cat([ref.actor.mu.weight, ref.actor.log_std.weight]))
        actor[3].copy_(torch.cat([ref.actor.mu.bias, ref.actor.log_std.bias]))
        for mine, theirs in ((ours.critics, ref.critic), (ours.critics_target, ref.critic_target)):
            for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
                p.copy_(q)
    feed_same_batches(ours, ref, updates=12)
    ours.env_steps = 1
    draws = []
    ours._noise = lambda like: draws.pop()
    for k in range(12):
        torch.manual_seed(k)
        ref.train(gradient_steps=1, batch_size=32)
        g = torch.Generator().manual_seed(k)
        actor_noise, next_noise = torch.randn(32, 1, generator=g), torch.randn(32, 1, generator=g)
        draws[:] = [actor_noise, next_noise]  # popped: the next action's first
        ours.update()
    assert ours.critic_step.optimizer.steps == ours.alpha_step.optimizer.steps == 12
    torch.testing.assert_close(ours.entropy.log_alpha, ref.log_ent_coef, rtol=0, atol=1e-5)
    ref_actor = [*(p for m in ref.actor.latent_pi for p in m.parameters()),
                 torch.cat([ref.actor.mu.weight, ref.actor.log_std.weight]),
                 torch.cat([ref.actor.mu.bias, ref.actor.log_std.bias])]
    for p, q in zip(ours.actor.parameters(), ref_actor, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-5)
    for mine, theirs in ((ours.critics, ref.critic), (ours.critics_target, ref.critic_target)):
        for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-5)
