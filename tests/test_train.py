import copy
import csv
import json

import numpy as np
import pytest
import torch

from gmi_drl.checkpoint import CheckpointError, load_checkpoint
from gmi_drl.comm.reducer import IdentityReducer
from gmi_drl.config import preset
from gmi_drl.rollout.storage import Rows
from gmi_drl.runner.loop import Trainer
from gmi_drl.runner.run import Run
from gmi_drl.train import train


def _quick_cfg(tmp_path, name="run", **algo):
    cfg = preset("cartpole-zoo")
    cfg.run_dir = str(tmp_path / name)
    cfg.log.tensorboard, cfg.compile = False, False
    for k, v in algo.items():
        setattr(cfg.algo, k, v)
    return cfg


def test_ppo_learns_cartpole_within_budget(tmp_path):
    """RL-Zoo's CartPole settings, compiled gradient steps (the default): the last 20 episodes
    average >= 250 after 40,960 steps (seed 1 reaches 475 at ~41k steps; a random policy scores
    ~22)."""
    cfg = _quick_cfg(tmp_path)
    cfg.total_timesteps, cfg.compile = 40_960, True
    result = train(cfg)
    assert result.global_step == 40_960
    assert result.episode_returns[-20:].mean() >= 250, result.episode_returns[-20:]
    run = tmp_path / "run"
    for name in ("config.json", "metrics.csv", "timeline.json", "summary.md", "learning_curve.png",
                 "checkpoints/latest.pt"):
        assert (run / name).exists(), name
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    names = {r["name"] for r in rows}
    assert {"env/episodic_return", "losses/policy_loss", "perf/sps", "perf/rollout_s",
            "perf/rollout/env_step_s", "perf/update_s", "perf/update/compiled_step_s"} <= names
    assert max(int(r["global_step"]) for r in rows) == 40_960
    saved = json.loads((run / "config.json").read_text())
    assert saved["env"]["task_id"] == "CartPole-v1" and saved["algo"]["ppo"]["num_steps"] == 32
    summary = (run / "summary.md").read_text()
    assert "## Placement" in summary and "placement: local: one GMI in this process" in summary


def _rows(buf):
    return [getattr(buf, f) for f in Rows._fields] + [buf.advantages, buf.returns]


def test_checkpoint_round_trip_gives_the_same_next_update(tmp_path):
    cfg = _quick_cfg(tmp_path, num_steps=16)
    cfg.norm.obs = cfg.norm.reward = True
    run = Run.create(cfg)
    run.start()
    first = Trainer(run, 0, IdentityReducer())
    for _ in range(2):
        first.algo.collect(first.pool)
        first.algo.update()
    run.save_checkpoint(first.state_dict(global_step=2 * 128, iteration=2))
    other = copy.deepcopy(cfg)
    other.seed = 99  # different initial weights and envs on purpose
    second = Trainer(Run(run.run_dir, other, run.checkpoint_path), 0, IdentityReducer())
    np.testing.assert_array_equal(second.obs_norm.rms.mean, first.obs_norm.rms.mean)
    np.testing.assert_array_equal(second.reward_norm.returns, first.reward_norm.returns)
    assert second.first_iteration == 2
    obs = first.algo.buf.obs[0].numpy()
    a1, a2 = first.algo.acting.act(obs), second.algo.acting.act(obs)
    np.testing.assert_array_equal(a1.action, a2.action)  # same weights, same action RNG stream
    for src, dst in zip(_rows(first.algo.buf), _rows(second.algo.buf)):
        dst.copy_(src)
    stats1, stats2 = first.algo.update(), second.algo.update()
    assert stats1 == stats2
    s1, s2 = first.algo.state_dict(), second.algo.state_dict()
    for name, t in s1["modules"]["actor_critic"].items():
        torch.testing.assert_close(t, s2["modules"]["actor_critic"][name], rtol=0, atol=0)
    assert s2["iteration"] == 3
    first.close()
    second.close()


def test_resume_continues_the_run(tmp_path):
    cfg = _quick_cfg(tmp_path)
    cfg.total_timesteps = 2 * cfg.batch_size
    train(cfg)
    run = tmp_path / "run"
    first = load_checkpoint(run)
    assert first["global_step"] == 512 and first["iteration"] == 2
    assert first["algo"]["iteration"] == 2
    cfg2 = _quick_cfg(tmp_path)
    cfg2.run_dir, cfg2.resume, cfg2.total_timesteps = None, str(run), 4 * cfg.batch_size
    result = train(cfg2)
    assert result.run_dir == run and result.global_step == 1024
    state = load_checkpoint(run)
    assert state["algo"]["iteration"] == 4
    assert len(state["episode_returns"]) > len(first["episode_returns"])
    steps = [int(r["global_step"]) for r in csv.DictReader(open(run / "metrics.csv"))]
    assert sorted(set(steps)) == [256, 512, 768, 1024]
    # the learning rate schedule continued from iteration 2 of 4 (not restarted)
    lr = [float(r["value"]) for r in csv.DictReader(open(run / "metrics.csv"))
          if r["name"] == "losses/learning_rate"]
    assert lr[2] == pytest.approx(1e-3 * (1 - 2 / 4))


def test_mismatched_or_corrupt_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(bad)
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a gmi-drl checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing")
    cfg = _quick_cfg(tmp_path)
    cfg.total_timesteps = cfg.batch_size
    train(cfg)
    narrow = _quick_cfg(tmp_path)
    narrow.run_dir, narrow.resume, narrow.total_timesteps = None, str(tmp_path / "run"), 512
    narrow.model.actor_hidden = "32"
    with pytest.raises(CheckpointError, match="(?s)does not match this run.*size mismatch"):
        train(narrow)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CPU build of torch "
                    "or no driver here)")
def test_gpu_learner_matches_the_cpu_learner_closely(tmp_path):
    """Acting, storage and the update on CUDA: same data and seeds give nearly the same
    returns."""
    results = {}
    for device in ("cpu", "cuda"):
        cfg = preset("classic", "CartPole-v1")
        cfg.env.num_envs, cfg.algo.num_steps, cfg.total_timesteps = 4, 64, 512
        cfg.device, cfg.run_dir, cfg.log.tensorboard = device, str(tmp_path / device), False
        results[device] = train(cfg)
    # CUDA kernels round differently, so trajectories drift apart slowly; returns stay close
    assert results["cuda"].global_step == results["cpu"].global_step
    assert abs(results["cuda"].episode_returns.mean() - results["cpu"].episode_returns.mean()) < 15
