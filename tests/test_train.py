import copy
import csv
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from gmi_drl.checkpoint import CheckpointError, find_loadable, load_checkpoint, resolve_checkpoint
from gmi_drl.comm.reducer import IdentityReducer
from gmi_drl.config import ConfigError, preset
from gmi_drl.rollout.storage import Rows
from gmi_drl.runner.loop import HolisticGMI
from gmi_drl.runner.resume import Resume
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
                 "train.log", "checkpoints/iteration-0000160.pt"):
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
    from gmi_drl.evaluate import evaluate

    # the trained weights, not the initial ones (a random policy scores ~22)
    assert evaluate(run, episodes=4).returns.mean() >= 250


def test_eval_acts_with_the_checkpoints_weights_on_observations_it_normalises(tmp_path):
    """``gmi-drl eval``'s action for an observation is the stored actor's mean (computed here
    from the checkpoint's tensors) of the observation normalised by the stored, frozen
    statistics; raw observations would give other actions."""
    from gmi_drl.evaluate import _act, load_policy

    cfg = preset("classic", "Pendulum-v1", "ppo")  # 64:64 tanh actor, actions in [-2, 2]
    cfg.norm.obs, cfg.total_timesteps = True, 2 * cfg.batch_size
    cfg.compile, cfg.log.tensorboard, cfg.run_dir = False, False, str(tmp_path / "run")
    train(cfg)
    state = load_checkpoint(tmp_path / "run")
    w = {k: v.double().numpy() for k, v in state["algo"]["modules"]["actor_critic"].items()}

    def mean_action(x):
        h = np.tanh(x @ w["actor.0.weight"].T + w["actor.0.bias"])
        h = np.tanh(h @ w["actor.2.weight"].T + w["actor.2.bias"])
        return np.clip(h @ w["actor.4.weight"].T + w["actor.4.bias"], -2.0, 2.0)

    stats = {k: state["obs_norm"][k].numpy() for k in ("mean", "var")}
    obs = np.array([[0.9, 0.44, 1.5], [-0.2, 0.98, -3.0], [-0.99, -0.1, 7.0]], np.float32)
    normalised = np.clip((obs - stats["mean"]) / np.sqrt(stats["var"] + 1e-8),
                         -cfg.norm.obs_clip, cfg.norm.obs_clip)
    _, acting, obs_norm = load_policy(tmp_path / "run")
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    got = _act(acting, obs_norm, obs, space, deterministic=True)
    np.testing.assert_allclose(got, mean_action(normalised), rtol=1e-4, atol=1e-5)
    assert np.abs(mean_action(normalised) - mean_action(obs.astype(np.float64))).max() > 1e-3
    assert space.contains(got[0])


def _rows(buf):
    return [getattr(buf, f) for f in Rows._fields] + [buf.advantages, buf.returns]


def test_a_sparse_metrics_row_summarises_every_episode_since_the_last_row(tmp_path):
    """With log_every 3, each env/episodic_return row is the mean of all episodes that ended
    in the 3 iterations it covers, not only in the last one."""
    cfg = _quick_cfg(tmp_path)
    cfg.total_timesteps, cfg.log.log_every = 12 * cfg.batch_size, 3
    result = train(cfg)
    rows = {int(r["global_step"]): float(r["value"])
            for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv"))
            if r["name"] == "env/episodic_return"}
    edges = [3 * k * cfg.batch_size for k in range(5)]
    assert sorted(rows) == edges[1:]
    for lo, hi in zip(edges, edges[1:]):
        at = (result.episode_steps > lo) & (result.episode_steps <= hi)
        assert at.sum() > len(np.unique(result.episode_steps[at]))  # several iterations' worth
        assert rows[hi] == pytest.approx(result.episode_returns[at].mean(), rel=1e-5)  # 6 digits


def test_a_metrics_rows_phase_seconds_are_the_mean_per_iteration_since_the_last_row(tmp_path):
    """perf/<phase>_s of a row covers the iterations since the previous row, so the log and
    checkpoint phases, which end after a row is written, are counted in the next row."""
    cfg = _quick_cfg(tmp_path)
    cfg.total_timesteps, cfg.log.log_every, cfg.checkpoint.every = 9 * cfg.batch_size, 3, 1
    result = train(cfg)
    run = tmp_path / "run"
    perf = {}
    for r in csv.DictReader(open(run / "metrics.csv")):
        perf.setdefault(r["name"], {})[int(r["global_step"])] = float(r["value"])
    timeline = json.loads((run / "timeline.json").read_text())["traceEvents"]
    update = {e["args"]["iteration"]: e["args"]["phases_s"]["update"]
              for e in timeline if e.get("cat") == "iteration"}
    for row, first in ((1, 0), (2, 3), (3, 6)):
        assert perf["perf/update_s"][3 * row * cfg.batch_size] == pytest.approx(
            sum(update[k] for k in range(first, first + 3)) / 3, rel=1e-4)
    assert perf["perf/checkpoint_s"][6 * cfg.batch_size] > 0
    assert perf["perf/log_s"][6 * cfg.batch_size] > 0
    # the steady rate leaves out the first iteration (its seconds are the timeline's)
    first_end = min(e["ts"] + e["dur"] for e in timeline if e.get("cat") == "iteration")
    start = min(e["ts"] for e in timeline if e.get("cat") == "iteration")
    assert result.steady_sps == pytest.approx(
        8 * cfg.batch_size / (result.wall_s - (first_end - start) * 1e-6), rel=0.2)


def _two_iterations(cfg):
    """A started run of ``cfg`` and its GMI 0, after two collect + update iterations."""
    run = Run.create(cfg)
    run.start()
    gmi0 = HolisticGMI(run, 0, IdentityReducer())
    for _ in range(2):
        gmi0.algo.collect(gmi0.pool)
        gmi0.algo.update()
    return run, gmi0


def test_gmis_resumed_with_a_saved_replay_all_refill_in_step(tmp_path):
    """The checkpoint holds GMI 0's replay alone: with several GMIs each refills its own, and
    all take their first gradient step at the same iteration (a collective step needs all)."""
    cfg = preset("cartpole", "CartPole-v1", algo="dqn")
    cfg.algo.save_replay, cfg.algo.learning_starts, cfg.algo.train_frequency = True, 24, 8
    cfg.env.num_envs, cfg.gmi.num_gmis, cfg.total_timesteps = 2, 2, 8 * 2 * 2 * 8
    cfg.run_dir, cfg.log.tensorboard, cfg.compile = str(tmp_path / "run"), False, False
    run, gmi0 = _two_iterations(cfg)
    state = gmi0.state_dict(global_step=2 * 32, iteration=2)
    assert "replay" in state["algo"]
    run.save_checkpoint(state)
    resumed = Run(run.run_dir, cfg, resolve_checkpoint(str(run.run_dir)))
    gmis = [HolisticGMI(resumed, rank, IdentityReducer()) for rank in (0, 1)]
    assert all(t.algo.replay is None for t in gmis)  # made by the first collect
    for trains in (False, True):  # 16 env steps of the 24 to refill, then 32
        for t in gmis:
            t.algo.collect(t.pool)
        assert [("losses/td_loss" in t.algo.update()) for t in gmis] == [trains, trains]
    for t in (gmi0, *gmis):
        t.close()


def test_episodes_on_the_device_are_read_where_a_row_or_checkpoint_needs_them(tmp_path):
    """`GMIShell.record` keeps `DeviceEpisodes` on the device (no host transfer per iteration)
    and reads them, in order and with their own step and wall time, when host episodes come,
    a checkpoint is taken or a row is logged (`settle`)."""
    from gmi_drl.rollout.episodes import DeviceEnds, Episodes
    from tests.host_sync import host_transfers

    def device_episodes(returns):
        ends = DeviceEnds(1, len(returns), torch.device("cpu"))
        ends.record(0, slice(None), {"episode_end": torch.ones(len(returns), dtype=torch.bool),
                                     "episode_return": torch.tensor(returns),
                                     "episode_length": torch.ones(len(returns))}, True)
        return ends.episodes()

    run, gmi = _two_iterations(_quick_cfg(tmp_path, num_steps=16))
    first = [device_episodes([1.0, 2.0]), device_episodes([3.0])]
    with host_transfers() as n:
        for k, ep in enumerate(first):
            gmi.record(ep, 100 + k, 1.5 + k)
    assert n[0] == 0 and gmi.episode_returns == []
    gmi.record(Episodes(np.array([4.0]), np.array([7])), 102, 3.5)  # host: all, in order
    assert gmi.episode_returns == [1.0, 2.0, 3.0, 4.0]
    assert gmi.episode_steps == [100, 100, 101, 102] and gmi.episode_wall_s[-2:] == [2.5, 3.5]
    gmi.record(device_episodes([5.0]), 103, 4.5)
    state = gmi.state_dict(global_step=103, iteration=3)  # a checkpoint holds every episode
    assert state["episode_returns"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    gmi.close()


def test_checkpoint_round_trip_gives_the_same_next_update(tmp_path):
    cfg = _quick_cfg(tmp_path, num_steps=16)
    cfg.norm.obs = cfg.norm.reward = True
    run, first = _two_iterations(cfg)
    saved = run.save_checkpoint(first.state_dict(global_step=2 * 128, iteration=2))
    other = copy.deepcopy(cfg)
    other.seed = 99  # different initial weights and envs on purpose
    second = HolisticGMI(Run(run.run_dir, other, saved), 0, IdentityReducer())
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


def test_a_resume_with_another_learning_rate_steps_with_it(tmp_path):
    """The checkpoint's optimizer state carries its moments, not the learning rate: a resumed
    run steps with the one its config gives (and config.json says)."""
    cfg = _quick_cfg(tmp_path, anneal_lr=False)
    cfg.total_timesteps = 2 * cfg.batch_size
    train(cfg)
    run = tmp_path / "run"
    cfg2 = _quick_cfg(tmp_path, anneal_lr=False, learning_rate=3e-4)
    cfg2.run_dir, cfg2.resume, cfg2.total_timesteps = None, str(run), 4 * cfg.batch_size
    train(cfg2)
    lr = [float(r["value"]) for r in csv.DictReader(open(run / "metrics.csv"))
          if r["name"] == "losses/learning_rate"]
    assert lr == [pytest.approx(cfg.algo.learning_rate)] * 2 + [pytest.approx(3e-4)] * 2
    state = load_checkpoint(run)
    assert state["algo"]["optimizers"]["actor_critic"]["lr"] == pytest.approx(3e-4)


def test_a_resume_stopped_before_its_first_checkpoint_leaves_config_json_as_it_was(
        tmp_path):
    """config.json is written with each checkpoint: a resume given a Ray address where no
    cluster listens stops before any GMI starts, and one stopped before it wrote a checkpoint
    leaves the run's config.json as it was, so the next plain ``--resume`` is not sent there."""
    import socket

    from gmi_drl.runner.run import RunStopped

    cfg = _quick_cfg(tmp_path)
    cfg.total_timesteps = cfg.batch_size
    train(cfg)
    run = tmp_path / "run"
    before = (run / "config.json").read_text()
    with socket.socket() as free:  # a loopback port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    bad = _quick_cfg(tmp_path)
    bad.run_dir, bad.resume, bad.total_timesteps = None, str(run), 2 * cfg.batch_size
    bad.placement, bad.ray.address = "ray", f"127.0.0.1:{port}"
    with pytest.raises(RunStopped, match=f"no Ray cluster at 127.0.0.1:{port}"):
        train(bad)
    assert (run / "config.json").read_text() == before

    def stop(p):  # stopped for another reason, before its first checkpoint: the same
        raise ValueError("stopped by the caller")

    other = _quick_cfg(tmp_path)
    other.run_dir, other.resume, other.total_timesteps = None, str(run), 3 * cfg.batch_size
    with pytest.raises(ValueError, match="stopped by the caller"):
        train(other, on_progress=stop)
    assert (run / "config.json").read_text() == before
    (run / "config.json").write_bytes(b"\xff\xfe not UTF-8")  # damaged: the checkpoint's is used
    good = _quick_cfg(tmp_path)  # a resume that saves a checkpoint keeps its own config
    good.run_dir, good.resume, good.total_timesteps = None, str(run), 2 * cfg.batch_size
    train(good)
    assert json.loads((run / "config.json").read_text())["total_timesteps"] == 512


def test_checkpoints_keep_the_newest_and_resume_past_a_corrupt_one(tmp_path, caplog):
    cfg = _quick_cfg(tmp_path)
    cfg.total_timesteps, cfg.checkpoint.every, cfg.checkpoint.keep = 4 * 256, 1, 2
    train(cfg)
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iteration-0000003.pt",
                                                       "iteration-0000004.pt"]
    newest = ckpts / "iteration-0000004.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # a copy cut short
    with caplog.at_level("WARNING", logger="gmi_drl.checkpoint"):
        assert load_checkpoint(tmp_path / "run")["iteration"] == 3
    assert "iteration-0000004.pt is corrupt" in caplog.text
    assert "continuing from iteration-0000003.pt" in caplog.text
    again = _quick_cfg(tmp_path)
    again.run_dir, again.resume, again.total_timesteps = None, str(tmp_path / "run"), 5 * 256
    again.checkpoint = cfg.checkpoint
    assert Run.create(again, Resume.find(again.resume)).resume_from == ckpts / "iteration-0000003.pt"
    assert train(again).global_step == 5 * 256
    assert load_checkpoint(newest)["iteration"] == 4  # rewritten by the resumed run
    assert sorted(p.name for p in ckpts.iterdir()) == ["iteration-0000004.pt",
                                                       "iteration-0000005.pt"]
    for p in ckpts.iterdir():
        p.write_bytes(b"junk\n")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "run")
    assert str(err.value).startswith("none of the 2 checkpoints in ")
    assert "cannot be continued (start a new one in another directory)" in str(err.value)
    assert "iteration-0000005.pt is corrupt" in str(err.value)


@pytest.mark.parametrize("content", [b"not a checkpoint at all", b"junk\n", b"", "half"])
def test_a_corrupt_checkpoint_is_one_clear_line(tmp_path, content):
    bad = tmp_path / "bad.pt"
    if content == "half":
        torch.save({"weights": torch.zeros(1000)}, bad)
        content = bad.read_bytes()[:2000]
    bad.write_bytes(content)
    with pytest.raises(CheckpointError, match="corrupt|cut short") as err:
        load_checkpoint(bad)
    text = str(err.value)
    assert text.startswith(str(bad)) and "\n" not in text
    assert "weights_only" not in text  # torch's advice to load it unsafely is not passed on
    assert "could run code" not in text  # said only of a file that pickles a class
    run = tmp_path / "run"  # a run directory whose only checkpoint is that file
    (run / "checkpoints").mkdir(parents=True)
    bad.rename(run / "checkpoints" / "iteration-0000003.pt")
    with pytest.raises(CheckpointError, match="it is the run's only checkpoint, so the run "
                       r"cannot be continued or evaluated \(start a new one"):
        find_loadable(run)


class _Pickled:  # a class in a file: what weights_only refuses
    pass


def test_a_checkpoint_that_pickles_code_is_refused_as_such(tmp_path):
    torch.save({"format": "gmi-drl-checkpoint", "cls": _Pickled}, tmp_path / "code.pt")
    with pytest.raises(CheckpointError, match="not loaded, as that could run code"):
        load_checkpoint(tmp_path / "code.pt")


def test_mismatched_or_corrupt_checkpoint_is_a_clear_error(tmp_path):
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
    before = (tmp_path / "run" / "config.json").read_text()
    with pytest.raises(ConfigError, match=r"cannot continue with model.actor_hidden='32' "
                       r"\(trained with '64:64'\)"):
        train(narrow)  # refused before anything is written
    assert (tmp_path / "run" / "config.json").read_text() == before
    longer = _quick_cfg(tmp_path)
    longer.run_dir, longer.resume, longer.total_timesteps = None, str(tmp_path / "run"), 4096
    longer.algo.num_steps *= 2
    longer.algo.learning_rate *= 0.5  # may change: not named
    with pytest.raises(ConfigError) as err:
        train(longer)
    assert f"from algo.num_steps={longer.algo.num_steps}" in str(err.value)
    assert "learning_rate" not in str(err.value)
    # the GMIs' own check, what a Ray run (no dry run on its controller) relies on
    ckpt = resolve_checkpoint(tmp_path / "run")
    with pytest.raises(CheckpointError, match="(?s)does not match this run.*size mismatch"):
        HolisticGMI(Run(tmp_path / "run", narrow, ckpt), 0, IdentityReducer())


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CPU build of torch "
                    "or no driver here)")
@pytest.mark.parametrize("algo,preset_name", [("dqn", "cartpole"), ("a2c", "classic"),
                                              ("ddpg", "classic"), ("td3", "classic"),
                                              ("sac", "classic")])
def test_every_algorithm_trains_on_cuda(tmp_path, algo, preset_name):
    """Acting (exploration draws from the runner's CUDA generator), replay and the update on
    CUDA, through the warm-up steps and past them."""
    cfg = preset(preset_name, algo=algo)
    cfg.device, cfg.run_dir, cfg.log.tensorboard = "cuda", str(tmp_path / algo), False
    cfg.total_timesteps = 600
    if hasattr(cfg.algo, "learning_starts"):  # (at least one minibatch: 256 for DDPG/TD3/SAC)
        cfg.algo.learning_starts = max(200, cfg.algo.minibatch_size)
    result = train(cfg)
    assert result.global_step >= 600
    assert (tmp_path / algo / "metrics.csv").read_text().count("losses/") > 0


def test_a_checkpoint_pruned_while_it_is_read_is_not_called_corrupt(tmp_path, monkeypatch,
                                                                    caplog):
    """``gmi-drl eval`` of a run that is still training: the newest file listed can be pruned
    (a newer one written) before it is read; the listing is taken again."""
    import gmi_drl.checkpoint as ck

    run = tmp_path / "run"
    for k in (1, 2):
        ck.save_checkpoint(run / "checkpoints" / f"iteration-000000{k}.pt", {"iteration": k})
    load, calls = ck._load_file, []

    def training_meanwhile(path):
        calls.append(path.name)
        if len(calls) == 1:  # iteration 3 written, iteration 2 pruned, as the run does
            ck.save_checkpoint(run / "checkpoints" / "iteration-0000003.pt", {"iteration": 3})
            path.unlink()
        return load(path)

    monkeypatch.setattr(ck, "_load_file", training_meanwhile)
    path, state = ck.find_loadable(run)
    assert path.name == "iteration-0000003.pt" and state["iteration"] == 3
    assert calls == ["iteration-0000002.pt", "iteration-0000003.pt"]
    assert "corrupt" not in caplog.text


def test_a_checkpoint_directory_that_cannot_be_written_is_found_at_the_start(tmp_path):
    """(As root, permissions do not stop a write: a path under a file does.)"""
    from gmi_drl.config import ConfigError
    from gmi_drl.runner.run import _check_writable

    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"file/checkpoints cannot be written \(Not a "
                       r"directory\): fix its permissions, or choose another --run-dir"):
        _check_writable(tmp_path / "file" / "checkpoints")
    _check_writable(tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # the probe file is gone


@pytest.mark.parametrize("algo,preset_name,task,trained", [
    ("dqn", "cartpole-zoo", None, ["q_network"]),
    ("ddpg", "classic", "Pendulum-v1", ["actor", "critics"]),
    ("sac", "classic", "Pendulum-v1", ["actor", "critics", "entropy"]),
    ("ppo", "classic", "CartPole-v1", ["actor_critic"])])
def test_the_model_size_counts_the_trained_networks_not_their_targets(algo, preset_name, task,
                                                                      trained):
    """M_p (the cost model's and the shared-memory reducer's size) is what an allreduce of the
    gradients carries: the networks an optimizer steps, not their target copies."""
    from gmi_drl.train import build_on_cpu, weight_count

    cfg = preset(preset_name, task, algo)
    modules = build_on_cpu(cfg).state_dict()["modules"]
    assert sorted(modules) != sorted(trained) or algo == "ppo"  # (DQN, DDPG: with targets)
    assert weight_count(cfg) == sum(t.numel() for name in trained
                                    for t in modules[name].values())


def test_precision_reaches_every_gradient_step_of_the_run(tmp_path):
    """``--precision bf16-mixed`` builds the run's gradient steps (SAC's three) in it, and
    an fp32 run's stay fp32."""
    for precision in ("fp32", "bf16-mixed"):
        cfg = preset("classic", "Pendulum-v1", algo="sac")
        cfg.run_dir, cfg.precision = str(tmp_path / precision), precision
        cfg.log.tensorboard, cfg.compile = False, False
        _, gmi0 = _two_iterations(cfg)
        steps = gmi0.algo._steps.values()
        assert len(steps) == 3 and {s.precision for s in steps} == {precision}
        gmi0.close()
