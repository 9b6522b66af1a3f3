"""PPO.update against a plain loop of CleanRL's ``ppo.py`` form: per epoch one permutation,
minibatches of it, advantages normalised within each minibatch, `ppo_loss`, gradient norm
clipped, ``torch.optim.Adam``; the learning rate annealed per update; ``target_kl`` ending the
update after the first epoch whose mean approximate KL exceeds it."""

import copy
import functools

import pytest
import torch

import gmi_drl.envs as envs
from gmi_drl.algos import AlgoContext, ModelConfig
from gmi_drl.algos.ppo import PPO, PPOConfig, approx_kl, ppo_loss
from gmi_drl.optim.grad_step import make_grad_step

NUM_ITERATIONS = 4


def _ppo(**cfg) -> PPO:
    with envs.make("CartPole-v1", 1, num_workers=0) as probe:
        spec = probe.spec
    ctx = AlgoContext(spec, 4, ModelConfig(actor_hidden="16", critic_hidden="16"),
                      NUM_ITERATIONS, 0, functools.partial(make_grad_step, compile=False),
                      torch.Generator().manual_seed(0))
    return PPO(PPOConfig(**{**dict(num_steps=16, num_minibatches=4, update_epochs=3,
                                   learning_rate=1e-2), **cfg}), ctx)


class _Reference:
    """The plain loop, on its own copy of the model and of the shuffling generator."""

    def __init__(self, ppo: PPO) -> None:
        self.cfg, self.model = ppo.cfg, copy.deepcopy(ppo.model)
        self.generator = torch.Generator()
        self.generator.set_state(ppo.generator.get_state())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.cfg.learning_rate,
                                          eps=self.cfg.adam_eps)
        self.iteration = self.steps = 0

    def update(self, batch) -> None:
        cfg = self.cfg
        n = len(batch.advantages)
        mb = n // cfg.num_minibatches
        if cfg.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.learning_rate * (1.0 - self.iteration / NUM_ITERATIONS)
        for _ in range(cfg.update_epochs):
            perm, logratios = torch.randperm(n, generator=self.generator), []
            for start in range(0, n, mb):
                i = perm[start:start + mb]
                adv = batch.advantages[i]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                new = self.model.evaluate(batch.obs[i], batch.actions[i])
                out = ppo_loss(new.logprob, batch.logprobs[i], adv, new.value, batch.values[i],
                               batch.returns[i], new.entropy, cfg.clip_coef, cfg.clip_vloss,
                               cfg.vf_coef, cfg.ent_coef, norm_adv=False)
                self.optimizer.zero_grad()
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                self.steps += 1
                logratios.append(out.logratio.detach())
            if cfg.target_kl is not None and approx_kl(torch.cat(logratios)) > cfg.target_kl:
                break
        self.iteration += 1


@pytest.mark.parametrize("cfg", [dict(), dict(target_kl=1e-8), dict(anneal_lr=False)])
def test_update_equals_a_plain_minibatch_loop(cfg):
    ppo = _ppo(**cfg)
    ref = _Reference(ppo)
    with envs.make("CartPole-v1", 4, seed=0, num_workers=0, autoreset="same_step") as pool:
        for _ in range(3):  # the second and third updates: annealed lr, Adam's moments carried
            ppo.collect(pool)
            batch = tuple(x.clone() for x in ppo.buf.flatten())
            ref.update(type(ppo.buf.flatten())(*batch))
            metrics = ppo.update()
            for name, t in ref.model.state_dict().items():
                torch.testing.assert_close(ppo.model.state_dict()[name], t, rtol=1e-4,
                                           atol=1e-5, msg=name)
            anneal = ppo.cfg.anneal_lr
            assert metrics["losses/learning_rate"] == pytest.approx(
                ppo.cfg.learning_rate * (1 - (ppo.iteration - 1) / NUM_ITERATIONS if anneal
                                         else 1.0))
    assert ppo.grad_step.optimizer.steps == ref.steps
    full = 3 * ppo.cfg.update_epochs * ppo.cfg.num_minibatches
    if "target_kl" in cfg:  # the first epoch's steps move the policy past 1e-8
        assert ref.steps == 3 * ppo.cfg.num_minibatches
    else:
        assert ref.steps == full
