import pytest
import torch
from torch import nn

from gmi_drl.optim.flat import (FlatAdam, FlatParams, FlatRMSprop, clip_factor, clip_grad_norm_,
                                make_flat_optimizer)


def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))


def _loss(net, step):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 5, generator=g), torch.randn(16, 2, generator=g)
    return ((net(x) - y) ** 2).mean() * 50  # large enough that clipping kicks in


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_flat_adam_with_clipping_equals_torch_adam(traced, weight_decay):
    """With weight decay: ``torch.optim.AdamW`` (decoupled decay)."""
    ref, net = _net(0), _net(0)
    opt = (torch.optim.AdamW(ref.parameters(), lr=3e-3, eps=1e-5, weight_decay=weight_decay,
                             foreach=False) if weight_decay else
           torch.optim.Adam(ref.parameters(), lr=3e-3, eps=1e-5, foreach=False))
    flat = FlatParams(net)
    fopt = FlatAdam(flat, lr=3e-3, eps=1e-5, traced=traced, weight_decay=weight_decay)
    clipped = 0
    for step in range(25):
        opt.zero_grad()
        _loss(ref, step).backward()
        ref_norm = nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        flat.zero_grad()
        _loss(net, step).backward()
        if traced:  # the compiled graph's form: the factor stays a tensor
            norm = torch.linalg.vector_norm(flat.grad)
            fopt.step(flat.grad * clip_factor(flat.grad, 0.5))
        else:
            norm = torch.linalg.vector_norm(flat.grad)  # (before clipping)
            clip_grad_norm_(flat.grad, 0.5)
            fopt.step()
        clipped += float(ref_norm) > 0.5
        assert float(norm) == pytest.approx(float(ref_norm), rel=1e-5)
    assert clipped > 5  # the test exercised clipping
    for p, q in zip(ref.parameters(), net.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert fopt.steps == 25


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_clipping_scales_to_the_bound_and_skips_an_infinite_one(device):
    """The host form (CPU) and the device form (no host sync) give torch's factor; an infinite
    bound leaves the gradient as it is without computing its norm."""
    from tests.host_sync import host_transfers

    grad = torch.arange(1.0, 101.0, device=device)
    norm = float(torch.linalg.vector_norm(grad))
    clipped = grad.clone()
    with host_transfers() as n:
        clip_grad_norm_(clipped, 0.5)
    assert n[0] == (1 if device == "cpu" else 0)  # (the device form: no read to the host)
    torch.testing.assert_close(clipped, grad * (0.5 / (norm + 1e-6)))
    same = grad.clone()
    with host_transfers() as n:
        clip_grad_norm_(same, float("inf"))
    assert n[0] == 0 and torch.equal(same, grad)
    small = grad / 1e4  # (norm about 0.058: under the bound, unchanged)
    clip_grad_norm_(small, 0.5)
    torch.testing.assert_close(small, grad / 1e4)


def test_parameters_and_grads_are_views_of_the_flat_buffers():
    net = _net(1)
    flat = FlatParams(net)
    _loss(net, 0).backward()
    assert flat.grad.abs().sum() > 0
    for p in net.parameters():
        assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()
    flat.data.zero_()
    assert all((p == 0).all() for p in net.parameters())
    net.load_state_dict(_net(2).state_dict())  # loading copies into the views
    assert flat.data.abs().sum() > 0
    assert flat.names == [name for name, _ in net.named_parameters()] and flat.numel == 7 * 5 + 7 + 2 * 7 + 2


@pytest.mark.parametrize("traced", [False, True])
def test_optimizer_state_round_trip(traced):
    net = _net(3)
    fopt = FlatAdam(FlatParams(net), lr=1e-3, traced=traced)
    _loss(net, 0).backward()
    fopt.step()
    other = FlatAdam(FlatParams(_net(3)), lr=0.5, traced=not traced)
    other.load_state_dict(fopt.state_dict())
    # lr stays the loading optimizer's: the run's setting, which a resume may change
    assert other.steps == 1 and other.lr == 0.5
    torch.testing.assert_close(other.exp_avg_sq, fopt.exp_avg_sq)
    with pytest.raises(ValueError, match="optimizer state for"):
        FlatAdam(FlatParams(nn.Linear(2, 2)), lr=1e-3).load_state_dict(fopt.state_dict())


@pytest.mark.parametrize("name", ["rmsprop", "rmsprop_tf"])
@pytest.mark.parametrize("traced", [False, True])
def test_flat_rmsprop_equals_torch_rmsprop_and_sb3s_tf_form(traced, name):
    """``rmsprop``: torch's RMSprop; ``rmsprop_tf``: SB3's RMSpropTFLike (RL-Zoo's Atari A2C),
    whose steps differ from torch's by orders of magnitude at first."""
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    ref, net = _net(4), _net(4)
    if name == "rmsprop_tf":
        opt = RMSpropTFLike(ref.parameters(), lr=7e-4, alpha=0.99, eps=1e-5)
    else:
        opt = torch.optim.RMSprop(ref.parameters(), lr=7e-4, alpha=0.99, eps=1e-5,
                                  foreach=False)
    flat = FlatParams(net)
    fopt = make_flat_optimizer(name, flat, 7e-4, 1e-5, traced)
    assert isinstance(fopt, FlatRMSprop)
    initial = flat.data.clone()
    for step in range(20):
        opt.zero_grad()
        _loss(ref, step).backward()
        opt.step()
        flat.zero_grad()
        _loss(net, step).backward()
        fopt.step()
    assert (flat.data - initial).abs().max() > 1e-3
    for p, q in zip(ref.parameters(), net.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    other = FlatRMSprop(FlatParams(_net(4)), lr=1.0, traced=not traced)
    other.load_state_dict(fopt.state_dict())
    assert other.steps == 20 and other.lr == 1.0  # (the loading optimizer's lr)
    torch.testing.assert_close(other.square_avg, fopt.square_avg)
    with pytest.raises(ValueError, match="not Adam's"):
        FlatAdam(FlatParams(_net(4)), lr=1e-3).load_state_dict(fopt.state_dict())
    with pytest.raises(ValueError, match="must be one of"):
        make_flat_optimizer("sgd", flat, 1e-3, 1e-8)
    with pytest.raises(ValueError, match="AdamW"):
        make_flat_optimizer("rmsprop", flat, 1e-3, 1e-8, weight_decay=0.1)
