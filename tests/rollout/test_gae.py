import numpy as np
import pytest
import torch

from gmi_drl.rollout.gae import compute_gae, gae_numpy, gae_reference


def _naive_gae(r, v, term, trunc, final_v, last_v, gamma, lam):
    """Scalar re-derivation, one env at a time, straight from GAE paper eq. 16."""
    T, B = r.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if term[t, b]:
                next_value, cont = 0.0, 0.0
            elif trunc[t, b]:
                next_value, cont = final_v[t, b], 0.0
            else:
                next_value = v[t + 1, b] if t + 1 < T else last_v[b]
                cont = 1.0
            delta = r[t, b] + gamma * next_value - v[t, b]
            running = delta + gamma * lam * cont * running
            adv[t, b] = running
    return adv


def test_hand_computed_with_truncation_and_termination():
    # env 0: steps 0,1 then truncated at step 1 (final obs value 10), new episode at step 2.
    # env 1: terminated at step 0, then runs to the end of the rollout (bootstrap last value).
    g, lam = 0.5, 0.5
    r = torch.tensor([[1.0, 2.0], [1.0, 0.0], [1.0, 1.0]])
    v = torch.tensor([[2.0, 4.0], [3.0, 1.0], [4.0, 2.0]])
    term = torch.tensor([[False, True], [False, False], [False, False]])
    trunc = torch.tensor([[False, False], [True, False], [False, False]])
    final_v = torch.tensor([[0.0, 99.0], [10.0, 0.0], [0.0, 0.0]])  # 99 must be ignored (terminated)
    last_v = torch.tensor([6.0, 8.0])
    adv, ret = compute_gae(r, v, term, trunc, final_v, last_v, g, lam)
    # env 0: t=2: d=1+.5*6-4=0 -> A=0; t=1 (truncated): d=1+.5*10-3=3, no carry -> A=3;
    #        t=0: d=1+.5*3-2=0.5 -> A=0.5+.25*3=1.25
    # env 1: t=2: d=1+.5*8-2=3 -> A=3; t=1: d=0+.5*2-1=0 -> A=.25*3=0.75;
    #        t=0 (terminated): d=2+0-4=-2 -> A=-2
    expected = torch.tensor([[1.25, -2.0], [3.0, 0.75], [0.0, 3.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + v)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kernel", [gae_numpy, gae_reference])
def test_both_kernels_match_the_naive_reference(seed, kernel):
    """The CPU kernel and the plain torch version (what runs on a GPU) against the scalar
    re-derivation."""
    rng = np.random.default_rng(seed)
    T, B = 17, 5
    args = [rng.normal(size=(T, B)).astype(np.float32), rng.normal(size=(T, B)).astype(np.float32),
            rng.random((T, B)) < 0.1, rng.random((T, B)) < 0.1,
            rng.normal(size=(T, B)).astype(np.float32), rng.normal(size=B).astype(np.float32)]
    out = torch.full((T, B), float("nan"))
    kernel(*(torch.from_numpy(x) for x in args), 0.99, 0.95, out)
    np.testing.assert_allclose(out.numpy(), _naive_gae(*args, 0.99, 0.95), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_reference_on_random_rollouts(seed):
    rng = np.random.default_rng(seed)
    T, B = 17, 5
    r = rng.normal(size=(T, B)).astype(np.float32)
    v = rng.normal(size=(T, B)).astype(np.float32)
    term = rng.random((T, B)) < 0.1
    trunc = rng.random((T, B)) < 0.1
    final_v = rng.normal(size=(T, B)).astype(np.float32)
    last_v = rng.normal(size=B).astype(np.float32)
    out = torch.zeros(T, B)
    adv, ret = compute_gae(*(torch.from_numpy(x) for x in (r, v, term, trunc, final_v, last_v)),
                           0.99, 0.95, advantages=out)
    assert adv is out
    expected = _naive_gae(r, v, term, trunc, final_v, last_v, 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), expected + v, rtol=1e-5, atol=1e-5)


def test_lambda_one_no_done_is_discounted_return_minus_value():
    r = torch.ones(4, 1)
    v = torch.zeros(4, 1)
    no = torch.zeros(4, 1, dtype=torch.bool)
    adv, _ = compute_gae(r, v, no, no, torch.zeros(4, 1), torch.tensor([2.0]), 0.9, 1.0)
    expected = [sum(0.9 ** k for k in range(4 - t)) + 0.9 ** (4 - t) * 2.0 for t in range(4)]
    np.testing.assert_allclose(adv[:, 0].numpy(), expected, rtol=1e-6)
