"""V-trace (IMPALA eq. 1) against hand-computed values and the plain recursion."""

import math

import numpy as np
import pytest
import torch

from gmi_drl.rollout.vtrace import vtrace, vtrace_reference


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype).view(-1, 1)


def test_vtrace_by_hand():
    # T = 2, B = 1, gamma 0.9: rho_0 = 2 (truncated to 1), rho_1 = 0.5
    # t=1: delta = 0.5 (2 + 0.9 * 3 - 1) = 1.85, v_1 = 1 + 1.85 = 2.85
    # t=0: delta = 1 (1 + 0.9 * 1 - 0.5) = 1.4, v_0 = 0.5 + 1.4 + 0.9 * 1 * 1.85 = 3.565
    # pg advantages: 1 (1 + 0.9 * 2.85 - 0.5) = 3.065 and 0.5 (2 + 0.9 * 3 - 1) = 1.85
    no = _t([False, False], torch.bool)
    out = vtrace(_t([math.log(2.0), math.log(0.5)]), _t([1.0, 2.0]), _t([0.5, 1.0]),
                 torch.tensor([3.0]), no, no, _t([0.0, 0.0]), 0.9)
    torch.testing.assert_close(out.vs.view(-1), torch.tensor([3.565, 2.85]))
    torch.testing.assert_close(out.pg_advantages.view(-1), torch.tensor([3.065, 1.85]))
    # a termination at t=0 cuts the trace: v_0 = 0.5 + 1 (1 - 0.5) = 1.0, advantage 0.5
    out = vtrace(_t([math.log(2.0), math.log(0.5)]), _t([1.0, 2.0]), _t([0.5, 1.0]),
                 torch.tensor([3.0]), _t([True, False], torch.bool), no, _t([0.0, 0.0]), 0.9)
    torch.testing.assert_close(out.vs.view(-1), torch.tensor([1.0, 2.85]))
    torch.testing.assert_close(out.pg_advantages.view(-1), torch.tensor([0.5, 1.85]))
    # a truncation at t=0 bootstraps from V(final_obs) = 4: v_0 = 0.5 + (1 + 3.6 - 0.5) = 4.6
    out = vtrace(_t([math.log(2.0), math.log(0.5)]), _t([1.0, 2.0]), _t([0.5, 1.0]),
                 torch.tensor([3.0]), no, _t([True, False], torch.bool), _t([4.0, 0.0]), 0.9)
    torch.testing.assert_close(out.vs.view(-1), torch.tensor([4.6, 2.85]))


def test_on_policy_vtrace_is_the_n_step_return():
    """With rho = 1 everywhere, v_s is the discounted return bootstrapped at the end."""
    T, gamma = 5, 0.99
    rewards = torch.arange(1.0, T + 1).view(T, 1)
    no = torch.zeros(T, 1, dtype=torch.bool)
    out = vtrace(torch.zeros(T, 1), rewards, torch.full((T, 1), 0.3), torch.tensor([7.0]), no,
                 no, torch.zeros(T, 1), gamma)
    expected = [sum(gamma ** (k - s) * (k + 1) for k in range(s, T)) + gamma ** (T - s) * 7.0
                for s in range(T)]
    torch.testing.assert_close(out.vs.view(-1), torch.tensor(expected))


@pytest.mark.parametrize("lam,rho_bar,c_bar", [(1.0, 1.0, 1.0), (0.95, 2.0, 0.5)])
def test_vtrace_equals_the_reference(lam, rho_bar, c_bar):
    rng = np.random.default_rng(0)
    T, B = 16, 7
    log_rhos = rng.normal(0, 0.7, (T, B)).astype(np.float32)
    rewards = rng.normal(0, 1, (T, B)).astype(np.float32)
    values = rng.normal(0, 1, (T, B)).astype(np.float32)
    boot = rng.normal(0, 1, B).astype(np.float32)
    ends = rng.random((T, B))
    terminated, truncated = ends < 0.1, (ends >= 0.1) & (ends < 0.2)
    final = rng.normal(0, 1, (T, B)).astype(np.float32)
    ref_vs, ref_adv = vtrace_reference(log_rhos, rewards, values, boot, terminated, truncated,
                                       final, 0.97, rho_bar, c_bar, None, lam)
    out = vtrace(*(torch.from_numpy(x) for x in (log_rhos, rewards, values, boot, terminated,
                                                 truncated, final)), 0.97, rho_bar, c_bar,
                 None, lam)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_adv, rtol=1e-5, atol=1e-5)
