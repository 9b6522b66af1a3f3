import math

import pytest
import torch

from gmi_drl.algos.ppo import approx_kl, clip_fraction, ppo_loss


def _scalar_loss(nlp, olp, adv, nv, ov, ret, ent, clip, clip_vloss, vf, ec, norm_adv):
    """PPO paper eq. 7 and 9, one sample at a time in Python floats."""
    n = len(nlp)
    if norm_adv:
        mean = sum(adv) / n
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1))
        adv = [(a - mean) / (std + 1e-8) for a in adv]
    pg = v = kl = frac = 0.0
    for i in range(n):
        ratio = math.exp(nlp[i] - olp[i])
        surr = min(ratio * adv[i], min(max(ratio, 1 - clip), 1 + clip) * adv[i])
        pg += -surr / n
        err = (nv[i] - ret[i]) ** 2
        if clip_vloss:
            clipped = ov[i] + min(max(nv[i] - ov[i], -clip), clip)
            err = max(err, (clipped - ret[i]) ** 2)
        v += 0.5 * err / n
        kl += ((ratio - 1) - (nlp[i] - olp[i])) / n
        frac += (abs(ratio - 1) > clip) / n
    entropy = sum(ent) / n
    return pg - ec * entropy + vf * v, pg, v, entropy, kl, frac


@pytest.mark.parametrize("clip_vloss,norm_adv", [(True, True), (False, False), (True, False)])
def test_matches_scalar_rederivation(clip_vloss, norm_adv):
    g = torch.Generator().manual_seed(0)
    n = 9
    nlp, olp = torch.randn(n, generator=g) * 0.3, torch.randn(n, generator=g) * 0.3
    adv, ret = torch.randn(n, generator=g), torch.randn(n, generator=g)
    nv, ov, ent = torch.randn(n, generator=g), torch.randn(n, generator=g), torch.rand(n, generator=g)
    got = ppo_loss(nlp, olp, adv, nv, ov, ret, ent, 0.2, clip_vloss, 0.5, 0.01, norm_adv)
    want = _scalar_loss(*(x.tolist() for x in (nlp, olp, adv, nv, ov, ret, ent)),
                        0.2, clip_vloss, 0.5, 0.01, norm_adv)
    computed = (*got[:4], approx_kl(got.logratio), clip_fraction(got.logratio, 0.2))
    for g_term, w_term in zip(computed, want):
        assert float(g_term) == pytest.approx(w_term, rel=1e-5, abs=1e-6)


def test_clipping_removes_gradient_beyond_the_trust_region():
    # ratio = e^0.5 > 1.2 with positive advantage: the clipped term is active, so no policy gradient.
    nlp = torch.tensor([0.5], requires_grad=True)
    out = ppo_loss(nlp, torch.zeros(1), torch.ones(1), torch.zeros(1), torch.zeros(1),
                   torch.zeros(1), torch.zeros(1), 0.2, True, 0.5, 0.0, norm_adv=False)
    out.policy_loss.backward()
    assert nlp.grad.item() == 0.0
    assert clip_fraction(out.logratio, 0.2).item() == 1.0
