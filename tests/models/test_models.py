import gymnasium as gym
import numpy as np
import pytest
import torch

from gmi_drl.models import MLP, NatureCNN, build_actor_critic, parse_layers


def test_parse_layers_and_errors():
    assert parse_layers("11:64:64:3") == [11, 64, 64, 3]
    for bad in ("64", "11:x:3", "11:0:3", ""):
        with pytest.raises(ValueError, match="layer string"):
            parse_layers(bad)


def test_mlp_shapes_follow_the_layer_string():
    mlp = MLP("11:64:32:3", "relu")
    linears = [m for m in mlp if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(11, 64), (64, 32), (32, 3)]
    assert mlp(torch.zeros(5, 11)).shape == (5, 3)


def test_nature_cnn_output():
    assert NatureCNN(4)(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2, 512)


def test_gaussian_head_matches_torch_distributions():
    obs_space = gym.spaces.Box(-1, 1, (11,))
    model = build_actor_critic(obs_space, gym.spaces.Box(-1, 1, (3,)))
    with torch.no_grad():
        model.head.logstd.copy_(torch.tensor([[0.1, -0.5, 0.3]]))
    obs = torch.randn(6, 11)
    act = torch.randn(6, 3)
    res = model.evaluate(obs, act)
    dist = torch.distributions.Normal(model.actor(obs), model.head.logstd.exp())
    torch.testing.assert_close(res.logprob, dist.log_prob(act).sum(-1))
    torch.testing.assert_close(res.entropy, dist.entropy().sum(-1))
    assert res.value.shape == (6,)


def test_categorical_head_matches_torch_distributions_and_samples_in_range():
    model = build_actor_critic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(5))
    obs = torch.randn(64, 4)
    out = model.act(obs, torch.Generator().manual_seed(0))
    assert out.action.dtype == torch.int64 and 0 <= out.action.min() and out.action.max() < 5
    dist = torch.distributions.Categorical(logits=model.actor(obs))
    res = model.evaluate(obs, out.action)
    torch.testing.assert_close(res.logprob, dist.log_prob(out.action))
    torch.testing.assert_close(res.entropy, dist.entropy())
    torch.testing.assert_close(out.logprob, res.logprob)


def test_build_rejects_unsupported_inputs():
    with pytest.raises(ValueError, match="needs flat observations"):
        build_actor_critic(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="not supported"):
        build_actor_critic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiBinary(3))
    model = build_actor_critic(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
                               gym.spaces.Discrete(6), encoder="nature_cnn")
    assert model.act(torch.zeros(1, 4, 84, 84, dtype=torch.uint8)).action.shape == (1,)


def test_categorical_samples_follow_the_softmax():
    model = build_actor_critic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(20_000, 3)
    draws = model.head.sample_with(logits, model.head.noise(20_000, torch.Generator().manual_seed(0)))
    freq = torch.bincount(draws, minlength=3).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.5, 0.3]), atol=0.015, rtol=0)
