"""`GradStep`: the compiled step equals the eager (autograd) reference, with one trainer (the
whole step in one graph) and with a reducer (the gradient compiled, then reduce and step)."""

import functools
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from gmi_drl.algos.ppo import ppo_objective
from gmi_drl.comm.reducer import GradReducer
from gmi_drl.models import build_actor_critic
from gmi_drl.optim.grad_step import GradStep, make_grad_step

LOSS = functools.partial(ppo_objective, clip_coef=0.2, clip_vloss=True, vf_coef=0.5,
                         ent_coef=0.01)


def _model(space):
    torch.manual_seed(0)
    return build_actor_critic(gym.spaces.Box(-1, 1, (5,)), space, actor_hidden="16:8",
                              critic_hidden="12")


def _minibatches(space, k, m=32):
    g = torch.Generator().manual_seed(1)
    if isinstance(space, gym.spaces.Discrete):
        actions = torch.randint(0, space.n, (k, m), generator=g)
    else:
        actions = torch.randn(k, m, 3, generator=g)
    return [(torch.randn(m, 5, generator=g), actions[i], -torch.rand(m, generator=g) * 3,
             torch.randn(m, generator=g), torch.randn(m, generator=g), torch.randn(m, generator=g))
            for i in range(k)]


class _OtherMember(GradReducer):
    """A two-member group whose other member's gradient is 0.01 in every element: the mean,
    ``(g + 0.01) / 2``, steers the step elsewhere than ``g``, so a step that dropped the reduced
    gradient shows."""

    rank, world_size = 0, 2

    def __init__(self):
        self.calls = 0

    def allreduce_(self, tensors):
        self.calls += 1
        for t in tensors:
            t.add_(0.01).mul_(0.5)


@pytest.mark.parametrize("space,optimizer", [(gym.spaces.Box(-1, 1, (3,)), "adam"),
                                             (gym.spaces.Discrete(4), "adam"),
                                             (gym.spaces.Discrete(4), "rmsprop"),
                                             (gym.spaces.Discrete(4), "rmsprop_tf")])
@pytest.mark.parametrize("reducer", [None, "group"])
def test_compiled_steps_equal_eager_steps(space, optimizer, reducer):
    eager_red = _OtherMember() if reducer else None
    comp_red = _OtherMember() if reducer else None
    eager = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, eager_red, compile=False,
                     optimizer=optimizer)
    compiled = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, comp_red, compile=True,
                        optimizer=optimizer)
    assert compiled.fused is (reducer is None)
    torch.testing.assert_close(eager.params.data, compiled.params.data, rtol=0, atol=0)
    initial = eager.params.data.clone()
    for i, mb in enumerate(_minibatches(space, 6)):
        if i == 3:
            eager.lr = compiled.lr = 5e-3  # annealing does not recompile (the lr is a tensor)
        a, b = eager(*mb), compiled(*mb)
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(eager.params.data, compiled.params.data, rtol=1e-4, atol=1e-5)
    assert (eager.params.data - initial).abs().max() > 1e-3  # the steps moved the weights
    assert compiled.optimizer.steps == eager.optimizer.steps == 6
    if reducer:
        assert eager_red.calls == comp_red.calls == 6
        alone = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, None, compile=False,
                         optimizer=optimizer)
        for i, mb in enumerate(_minibatches(space, 6)):
            alone.lr = 5e-3 if i >= 3 else 1e-2
            alone(*mb)
        assert (alone.params.data - eager.params.data).abs().max() > 1e-4  # the mean was used
    state = compiled.state_dict()
    eager.load_state_dict(state)
    assert eager.optimizer.steps == 6 and eager.lr == pytest.approx(5e-3)


def test_a_failing_compiler_falls_back_to_eager_steps(monkeypatch, caplog):
    space = gym.spaces.Discrete(4)

    def broken_compile(fn, **kw):
        def run(*a):
            raise RuntimeError("no C++ compiler here")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    step = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, compile=True)
    ref = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, compile=False)
    with caplog.at_level(logging.WARNING):
        for mb in _minibatches(space, 3):
            step(*mb)
            ref(*mb)
    assert "torch.compile failed (RuntimeError: no C++ compiler here)" in caplog.text
    assert step._compiled is None and not step.fused
    torch.testing.assert_close(step.params.data, ref.params.data, rtol=0, atol=0)


@pytest.mark.parametrize("compile", [False, True])
def test_bf16_mixed_steps_compute_in_bfloat16_and_keep_float32_weights(compile):
    """``bf16-mixed``: the gradient differs from float32's by bfloat16's rounding (so autocast
    ran: 8 mantissa bits, about 0.4% per product) but points the same way; the weights, the
    gradient and Adam's moments stay float32; compiled and eager bf16 steps agree."""
    space = gym.spaces.Box(-1, 1, (3,))
    mbs = _minibatches(space, 4)
    fp32 = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, _OtherMember(), compile=compile)
    bf16 = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, _OtherMember(), compile=compile,
                    precision="bf16-mixed")
    eager = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, _OtherMember(),
                     precision="bf16-mixed")
    for mb in mbs:
        fp32._gradient(mb)
        bf16._gradient(mb)
        g, h = fp32.params.grad, bf16.params.grad
        assert (g - h).abs().max() > 0, "the bf16-mixed gradient equals float32's: no autocast"
        assert torch.nn.functional.cosine_similarity(g, h, 0) > 0.99
        assert (g - h).norm() < 0.05 * g.norm()
    for mb in mbs:
        bf16(*mb)
        eager(*mb)
    assert bf16.params.data.dtype == bf16.params.grad.dtype == torch.float32
    assert all(v.dtype == torch.float32 for v in bf16.optimizer.state_dict().values()
               if isinstance(v, torch.Tensor) and v.is_floating_point())
    torch.testing.assert_close(bf16.params.data, eager.params.data, rtol=2e-2, atol=2e-3)


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision='fp16' must be one of"):
        GradStep(_model(gym.spaces.Discrete(2)), LOSS, 1e-3, 0.5, precision="fp16")


def test_stale_sync_needs_the_switch_reducer():
    with pytest.raises(ValueError, match="stale-sync training needs the switch reducer"):
        make_grad_step(_model(gym.spaces.Discrete(2)), LOSS, 1e-3, 0.5, staleness_bound=1)


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop_tf"])
def test_async_ps_steps_of_one_worker_follow_the_synchronous_steps(optimizer):
    """One worker, S = 0: every update applies on the weights it was computed on, so the
    server's weights follow `GradStep`'s (up to the float32 rounding of weights + update)."""
    import threading

    from gmi_drl.comm.ps import AsyncPSClient, ParameterServer

    ps = ParameterServer(("127.0.0.1", 0), 1, member_timeout_s=20)
    threading.Thread(target=ps.serve_forever, daemon=True).start()
    client = AsyncPSClient("{}:{}".format(*ps.address), 0, 1, 0, timeout_s=20)
    try:
        space = gym.spaces.Box(-1, 1, (3,))
        step = make_grad_step(_model(space), LOSS, 1e-2, 0.5, 1e-5, reducer=client,
                              staleness_bound=0, optimizer=optimizer)
        ref = GradStep(_model(space), LOSS, 1e-2, 0.5, 1e-5, optimizer=optimizer)
        for mb in _minibatches(space, 4):
            step(*mb)
            ref(*mb)
        assert step.drain() == {"comm/dropped": 0.0, "comm/staleness_mean": 0.0,
                                "comm/staleness_max": 0.0}
        step.close()
        torch.testing.assert_close(step.params.data, ref.params.data, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(step.params.data.numpy(), ps.streams[0].weights)
        assert ps.streams[0].version == 4 and ps.dropped == 0
        with pytest.raises(ValueError, match="the parameter server's client announced S = 0"):
            make_grad_step(_model(space), LOSS, 1e-3, 0.5, reducer=client, staleness_bound=2)
    finally:
        client.close()
        ps.close()
