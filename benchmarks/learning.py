"""Learning benchmark: does each gmi-drl algorithm reach its target return, on how many seeds,
and how does it compare with Stable-Baselines3 given the same hyper-parameters and env steps?

    .venv/bin/python benchmarks/learning.py --cases dqn-cartpole a2c-cartpole   # + SB3, 3 seeds
    .venv/bin/python benchmarks/learning.py --cases ppo-cartpole --no-sb3
    .venv/bin/python benchmarks/learning.py --cases ddpg-halfcheetah td3-halfcheetah
    .venv/bin/python benchmarks/learning.py --cases dqn-pong --seeds 1
    .venv/bin/python benchmarks/learning.py --cases sac-halfcheetah --precision bf16-mixed

Cases (gmi-drl preset; SB3 is built from the same config: learning rate, buffer, batch,
schedules, n-step returns, network sizes, envs):

| case | preset | env steps | pass when |
|---|---|---:|---|
| ppo-cartpole | ppo cartpole-zoo | 200k | mean(last 20) >= 475 on 3/3 seeds |
| ppo-hopper | ppo mujoco, 8 envs x 256 steps | 1M | >= 1500 on 2/3 seeds |
| dqn-cartpole | dqn cartpole | 100k | >= 475 on 3/3 seeds |
| dqn-cartpole-zoo | dqn cartpole-zoo (RL-Zoo's entry) | 100k | >= 475 on 3/3 seeds |
| a2c-cartpole | a2c classic | 500k | >= 475 on 3/3 seeds |
| ddpg-halfcheetah, td3-halfcheetah | mujoco | 300k | median final mean >= SB3's |
| sac-halfcheetah | sac mujoco (RL-Zoo's) | 300k | median final mean >= 0.9x SB3's |
| dqn-pong | dqn pong (3-step returns) | 500k (2M frames) | >= 0 on 1 seed |
| a2c-qbert | a2c iswitch (Qbert-v5) | 500k (2M frames) | curve beside SB3's (no target) |
| appo-hopper | appo mujoco (2 serving GMIs x 8 envs, 1 trainer) | 1M | >= 1500 on 2/3 seeds |
| a3c-cartpole | a3c classic (1 serving GMI x 8 envs, 1 trainer) | 500k | >= 475 on 3/3 seeds |

SB3 has no APPO or A3C: those two cases run gmi-drl only and print each run's policy-lag
distribution (``policy_lag.csv``).

"mean(last 20)" is the mean return of the last 20 training episodes (whole games on Atari).
Each row: the first env step and wall second at which it crossed the target, the final mean,
wall time and steps/s; gmi-drl's run directories hold the learning curves (metrics.csv), SB3's
episodes are written to ``sb3-<case>-seed<N>.csv`` beside them.
"""

from __future__ import annotations

import csv
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

from gmi_drl.config import TrainConfig, preset
from gmi_drl.telemetry.summary import first_crossing
from gmi_drl.train import train


@dataclass(frozen=True)
class Case:
    algo: str
    preset: str
    task_id: str | None
    steps: int
    target: float | None
    """mean(last 20) to reach; None: compare the final mean with SB3's"""
    need: int
    """seeds that must reach the target (0: no target)"""
    sb3: bool = True
    """SB3 implements the algorithm (APPO and A3C: no)"""
    serving_gmis: int = 1
    """async_training cases: serving GMIs"""
    ratio: float = 1.0
    """cases without a target pass when gmi-drl's median final mean >= ratio x SB3's"""


CASES = {
    "ppo-cartpole": Case("ppo", "cartpole-zoo", None, 200_000, 475.0, 3),
    "ppo-hopper": Case("ppo", "mujoco", "Hopper-v5", 1_000_000, 1500.0, 2),
    "dqn-cartpole": Case("dqn", "cartpole", None, 100_000, 475.0, 3),
    "dqn-cartpole-zoo": Case("dqn", "cartpole-zoo", None, 100_000, 475.0, 3),
    "a2c-cartpole": Case("a2c", "classic", None, 500_000, 475.0, 3),
    "ddpg-halfcheetah": Case("ddpg", "mujoco", "HalfCheetah-v5", 300_000, None, 0),
    "td3-halfcheetah": Case("td3", "mujoco", "HalfCheetah-v5", 300_000, None, 0),
    "sac-halfcheetah": Case("sac", "mujoco", "HalfCheetah-v5", 300_000, None, 0, ratio=0.9),
    "dqn-pong": Case("dqn", "pong", None, 500_000, 0.0, 1),
    "a2c-qbert": Case("a2c", "iswitch", None, 500_000, None, 0),
    "appo-hopper": Case("appo", "mujoco", "Hopper-v5", 1_000_000, 1500.0, 2, sb3=False,
                        serving_gmis=2),
    "a3c-cartpole": Case("a3c", "classic", None, 500_000, 475.0, 3, sb3=False),
}


@dataclass
class Args:
    cases: list[str] = field(default_factory=lambda: ["dqn-cartpole", "a2c-cartpole"])
    """which cases to run (see the table above)"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """seeds per case"""
    sb3: bool = True
    """also train Stable-Baselines3 with the same hyper-parameters (``--no-sb3``: gmi-drl only)"""
    gmi: bool = True
    """train gmi-drl (``--no-gmi``: SB3 only, e.g. in a second invocation beside a ``--no-sb3``
    one, each side on its own core; the verdict then needs both tables)"""
    scale: float = 1.0
    """multiply every case's env steps by this (a quick look; targets are for 1.0)"""
    out_dir: str | None = None
    """where the runs go (default: a new ``runs/bench-learning-<time>/``; runs never overwrite)"""
    precision: str = "fp32"
    """gmi-drl's ``cfg.precision`` (bf16-mixed: gradient steps under autocast to bfloat16; SB3
    stays float32)"""


@dataclass
class Result:
    steps: np.ndarray
    """``(E,)`` env step at which each episode ended"""
    returns: np.ndarray
    wall_s: np.ndarray
    total_steps: int
    total_wall_s: float


def _config(case: Case, seed: int, steps: int, run_dir: Path,
            precision: str = "fp32") -> TrainConfig:
    cfg = preset(case.preset, case.task_id, algo=case.algo)
    cfg.precision = precision
    if case.algo == "ppo" and case.preset == "mujoco":  # CleanRL's batch 2048, minibatch 64
        cfg.env.num_envs, cfg.algo.num_steps = 8, 256
    cfg.total_timesteps, cfg.seed, cfg.run_dir = steps, seed, str(run_dir)
    cfg.log.tensorboard = False
    if cfg.is_async:
        cfg.gmi.serving_gmis = case.serving_gmis
    return cfg


def _lags(run_dir: Path) -> str:
    """An async run's policy-lag distribution: ``lag: share of fragments`` (policy_lag.csv)."""
    path = run_dir / "policy_lag.csv"
    if not path.exists():
        return ""
    rows = [tuple(map(int, line.split(","))) for line in path.read_text().splitlines()[1:]]
    total = sum(c for _, c in rows)
    return "policy lag: " + ", ".join(f"{lag}: {c / total:.1%}" for lag, c in rows)


def _gmi(cfg: TrainConfig) -> Result:
    r = train(cfg)
    return Result(r.episode_steps, r.episode_returns, r.episode_wall_s, r.global_step, r.wall_s)


def _sb3(cfg: TrainConfig, out: Path) -> Result:
    """Train SB3's implementation of ``cfg.algo_name`` with ``cfg``'s hyper-parameters."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    class Episodes(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int, float, float]] = []
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.rows.append((self.num_timesteps, float(info["episode"]["r"]),
                                      time.perf_counter() - self.t0))
            return True

    torch.set_num_threads(cfg.torch_threads)
    model = _sb3_model(cfg)
    callback = Episodes()
    t0 = time.perf_counter()
    model.learn(cfg.total_timesteps, callback=callback)
    wall = time.perf_counter() - t0
    with open(out, "w", newline="") as f:
        csv.writer(f).writerows([("step", "return", "wall_s"), *callback.rows])
    s, r, w = (np.array(c, float) for c in zip(*callback.rows)) if callback.rows else ([],) * 3
    return Result(np.asarray(s), np.asarray(r), np.asarray(w), cfg.total_timesteps, wall)


def _tf_rmsprop(a) -> dict:
    """SB3's ``RMSpropTFLike`` for gmi-drl's ``rmsprop_tf`` (RL-Zoo's Atari A2C), else nothing."""
    if a.optimizer != "rmsprop_tf":
        return {}
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    return dict(optimizer_class=RMSpropTFLike,
                optimizer_kwargs=dict(alpha=0.99, eps=a.optimizer_eps, weight_decay=0))


def _hidden(spec: str) -> list[int]:
    return [int(h) for h in spec.split(":") if h]


def _sb3_model(cfg: TrainConfig):
    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize, VecTransposeImage

    a, m, name = cfg.algo, cfg.model, cfg.algo_name
    atari = m.encoder == "nature_cnn"
    if atari:  # the pool's Atari settings: no sticky actions, frame skip 4, 84x84, 4 frames
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)  # (with --no-gmi nothing else has registered ALE/*)
        game = cfg.env.task_id.removesuffix("-v5")
        env = VecTransposeImage(VecFrameStack(make_atari_env(
            f"ALE/{game}-v5", n_envs=cfg.env.num_envs, seed=cfg.seed,
            env_kwargs=dict(frameskip=1, repeat_action_probability=0.0)), 4))
    else:
        env = make_vec_env(cfg.env.task_id, n_envs=cfg.env.num_envs, seed=cfg.seed)
    n = cfg.norm
    if n.obs or n.reward:
        env = VecNormalize(env, norm_obs=n.obs, norm_reward=n.reward, clip_obs=n.obs_clip,
                           clip_reward=n.reward_clip, gamma=a.gamma)
    policy = "CnnPolicy" if atari else "MlpPolicy"
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[m.activation]
    lr = a.learning_rate
    common = dict(seed=cfg.seed, device="cpu", gamma=a.gamma,
                  learning_rate=(lambda left: left * lr) if getattr(a, "anneal_lr", False) else lr)
    if name == "dqn":
        kw = dict(net_arch=_hidden(m.critic_hidden), activation_fn=act)
        if atari:
            kw = dict(features_extractor_kwargs=dict(features_dim=m.cnn_features))
        return sb3.DQN(policy, env, buffer_size=a.buffer_size, learning_starts=a.learning_starts,
                       batch_size=a.minibatch_size, tau=a.tau, train_freq=a.train_frequency,
                       gradient_steps=a.gradient_steps,
                       target_update_interval=a.target_network_frequency,
                       exploration_fraction=a.exploration_fraction,
                       exploration_initial_eps=a.start_e, exploration_final_eps=a.end_e,
                       max_grad_norm=a.max_grad_norm, n_steps=a.n_step, policy_kwargs=kw,
                       optimize_memory_usage=False, **common)
    if name in ("a2c", "ppo"):
        kw = dict(net_arch=dict(pi=_hidden(m.actor_hidden), vf=_hidden(m.critic_hidden)),
                  activation_fn=act)
        if atari:
            kw = dict(features_extractor_kwargs=dict(features_dim=m.cnn_features))
        if name == "a2c":
            return sb3.A2C(policy, env, n_steps=a.num_steps, gae_lambda=a.gae_lambda,
                           ent_coef=a.ent_coef, vf_coef=a.vf_coef,
                           max_grad_norm=a.max_grad_norm,
                           normalize_advantage=a.normalize_advantage,
                           use_rms_prop=a.optimizer == "rmsprop",
                           rms_prop_eps=a.optimizer_eps, policy_kwargs=kw | _tf_rmsprop(a),
                           **common)
        return sb3.PPO(policy, env, n_steps=a.num_steps,
                       batch_size=a.num_steps * cfg.env.num_envs // a.num_minibatches,
                       n_epochs=a.update_epochs, gae_lambda=a.gae_lambda, clip_range=a.clip_coef,
                       ent_coef=a.ent_coef, vf_coef=a.vf_coef, max_grad_norm=a.max_grad_norm,
                       policy_kwargs=kw, **common)
    dim = env.action_space.shape[0]
    kw = dict(net_arch=dict(pi=_hidden(m.actor_hidden), qf=_hidden(m.critic_hidden)),
              activation_fn=act)
    off = dict(buffer_size=a.buffer_size, learning_starts=a.learning_starts,
               batch_size=a.minibatch_size, tau=a.tau, train_freq=a.train_frequency,
               gradient_steps=a.gradient_steps, n_steps=a.n_step, policy_kwargs=kw)
    if name == "sac":  # (SB3's entropy coefficient starts at 1.0 under "auto", as gmi-drl's)
        return sb3.SAC(policy, env, ent_coef=f"auto_{a.alpha}" if a.autotune else a.alpha,
                       target_entropy="auto" if a.target_entropy is None else a.target_entropy,
                       **off, **common)
    off["action_noise"] = NormalActionNoise(np.zeros(dim), a.exploration_noise * np.ones(dim))
    if name == "td3":
        return sb3.TD3(policy, env, policy_delay=a.policy_delay,
                       target_policy_noise=a.target_policy_noise,
                       target_noise_clip=a.target_noise_clip, **off, **common)
    return sb3.DDPG(policy, env, **off, **common)


def _row(who: str, seed: int, r: Result, target: float | None) -> str:
    hit = (first_crossing(r.steps, r.returns, r.wall_s, target)
           if target is not None and len(r.returns) else None)
    final = r.returns[-20:].mean() if len(r.returns) else float("nan")
    return (f"| {who} | {seed} | {hit[0] if hit else '-'} | {f'{hit[1]:.0f}' if hit else '-'} | "
            f"{final:.1f} | {r.total_wall_s:.0f} | {r.total_steps / r.total_wall_s:,.0f} |")


def _final(r: Result) -> float:
    return float(r.returns[-20:].mean()) if len(r.returns) else float("nan")


def _reached(r: Result, target: float) -> bool:
    return first_crossing(r.steps, r.returns, r.wall_s, target) is not None


def main(args: Args) -> None:
    logging.basicConfig(level=logging.WARNING)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown --cases {unknown}: choose from {list(CASES)}")
    out_dir = Path(args.out_dir or time.strftime("runs/bench-learning-%Y%m%d-%H%M%S"))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.cases:
        case = CASES[name]
        steps = int(case.steps * args.scale)
        need = min(case.need, len(args.seeds))
        goal = (f"mean(last 20) >= {case.target:g} on {need}/{len(args.seeds)} seeds"
                if case.need else f"median final mean(last 20) >= {case.ratio:g}x SB3's")
        print(f"\n{name}: {steps:,} env steps, {goal}")
        print("| who | seed | reached at step | reached at s | final mean | wall s | steps/s |\n"
              "|---|---:|---:|---:|---:|---:|---:|", flush=True)
        runs: dict[str, list[Result]] = {"gmi-drl": [], "SB3": []}
        for seed in args.seeds:
            cfg = _config(case, seed, steps, out_dir / f"{name}-seed{seed}", args.precision)
            if args.gmi:
                runs["gmi-drl"].append(_gmi(cfg))
                print(_row("gmi-drl", seed, runs["gmi-drl"][-1], case.target), flush=True)
                if cfg.is_async:
                    print(f"  ({_lags(Path(cfg.run_dir))})", flush=True)
            if args.sb3 and case.sb3:
                runs["SB3"].append(_sb3(cfg, out_dir / f"sb3-{name}-seed{seed}.csv"))
                print(_row("SB3", seed, runs["SB3"][-1], case.target), flush=True)
        medians = {who: statistics.median(map(_final, rs)) for who, rs in runs.items() if rs}
        line = ", ".join(f"{who} median final {v:.1f}" for who, v in medians.items())
        if case.need and runs["gmi-drl"]:
            passed = sum(_reached(r, case.target) for r in runs["gmi-drl"])
            sb3 = (f" (SB3: {sum(_reached(r, case.target) for r in runs['SB3'])}/"
                   f"{len(runs['SB3'])})" if runs["SB3"] else "")
            verdict = "PASS" if passed >= need else "FAIL"
            print(f"{name}: gmi-drl reached on {passed}/{len(args.seeds)} seeds{sb3}; {line} "
                  f"-> {verdict}")
        elif "SB3" in medians and "gmi-drl" in medians:
            verdict = "PASS" if medians["gmi-drl"] >= case.ratio * medians["SB3"] else "FAIL"
            print(f"{name}: {line} -> {verdict}")
        else:
            print(f"{name}: {line}")


if __name__ == "__main__":
    main(tyro.cli(Args))
