import gymnasium as gym
import numpy as np
import pytest
import torch

from gmi_drl.algos.flat import FlatParams
from gmi_drl.algos.ppo import ppo_loss
from gmi_drl.algos.ppo_fast import FastPPOGrad
from gmi_drl.models import build_actor_critic
from gmi_drl.models.fast_mlp import NumpyActing


def _batch(model, space, m, seed):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(m, 5, generator=g)
    with torch.no_grad():
        act = model.act(obs, g)
        # old log-probs spread so that ratios land inside and outside the clip range
        old_logprob = act.logprob + 0.3 * torch.randn(m, generator=g)
        old_value = act.value + 0.5 * torch.randn(m, generator=g)
    adv, ret = torch.randn(m, generator=g), torch.randn(m, generator=g)
    return obs, act.action, old_logprob, adv, old_value, ret


@pytest.mark.parametrize("space", [gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4)])
@pytest.mark.parametrize("clip_vloss,ent_coef", [(True, 0.0), (False, 0.01), (True, 0.05)])
def test_fast_gradient_equals_autograd(space, clip_vloss, ent_coef):
    model = build_actor_critic(gym.spaces.Box(-1, 1, (5,)), space, actor_hidden="16:8",
                               critic_hidden="12")
    if isinstance(space, gym.spaces.Box):
        with torch.no_grad():
            model.head.logstd.copy_(torch.tensor([[0.2, -0.4, 0.1]]))
    flat = FlatParams(model)
    obs, act, olp, adv, ov, ret = _batch(model, space, 48, seed=1)
    new = model.evaluate(obs, act)
    ref = ppo_loss(new.logprob, olp, adv, new.value, ov, ret, new.entropy, 0.2, clip_vloss,
                   0.5, ent_coef, norm_adv=False)
    flat.zero_grad()
    ref.loss.backward()
    ref_grad = flat.grad.clone()
    ratio = ref.logratio.exp()
    assert ((ratio < 0.8) | (ratio > 1.2)).any() and ((ratio > 0.8) & (ratio < 1.2)).any()

    flat.grad.fill_(123.0)  # the fast path must overwrite every gradient entry
    arrays = (x.numpy() for x in (obs, act, olp, adv, ov, ret))
    pg, vl, ent, logratio = FastPPOGrad(model)(*arrays, 0.2, clip_vloss, 0.5, ent_coef)
    torch.testing.assert_close(flat.grad, ref_grad, rtol=1e-4, atol=1e-6)
    for got, want in ((pg, ref.policy_loss), (vl, ref.value_loss), (ent, ref.entropy)):
        assert got == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(torch.from_numpy(logratio), ref.logratio.detach(), rtol=1e-5,
                               atol=1e-6)


def test_unsupported_models_fall_back():
    relu = build_actor_critic(gym.spaces.Box(-1, 1, (5,)), gym.spaces.Discrete(2), activation="relu")
    assert not FastPPOGrad.supports(relu)
    with pytest.raises(ValueError, match="tanh MLPs"):
        FastPPOGrad(relu)
    gpu_like = build_actor_critic(gym.spaces.Box(-1, 1, (5,)), gym.spaces.Discrete(2)).double()
    assert not FastPPOGrad.supports(gpu_like)  # float64 (like any non-CPU-float32 model): autograd


@pytest.mark.parametrize("space", [gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4)])
def test_numpy_acting_equals_torch_acting(space):
    model = build_actor_critic(gym.spaces.Box(-1, 1, (5,)), space, actor_hidden="16:8")
    if isinstance(space, gym.spaces.Box):
        with torch.no_grad():
            model.head.logstd.copy_(torch.tensor([[0.2, -0.4, 0.1]]))
    obs = torch.randn(32, 5, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model.act(obs, torch.Generator().manual_seed(9))
    action, logprob, value = NumpyActing(model).act(obs.numpy(), torch.Generator().manual_seed(9))
    if isinstance(space, gym.spaces.Discrete):
        assert (action == want.action.numpy()).all() and len(set(action.tolist())) > 1
    else:
        np.testing.assert_allclose(action, want.action.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logprob, want.logprob.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, want.value.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(NumpyActing(model).value(obs.numpy()), want.value.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_numpy_views_follow_in_place_updates_and_notice_rehoming():
    model = build_actor_critic(gym.spaces.Box(-1, 1, (5,)), gym.spaces.Discrete(2))
    acting = NumpyActing(model)
    obs = np.ones((1, 5), np.float32)
    before = acting.value(obs).copy()
    with torch.no_grad():
        model.critic[-1].bias.add_(1.0)  # an optimizer step writes in place
    np.testing.assert_allclose(acting.value(obs), before + 1.0, rtol=1e-6)
    assert not acting.stale()
    FlatParams(model)  # moves every parameter into a new buffer
    assert acting.stale()
