import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gmi_drl.checkpoint import load_checkpoint
from gmi_drl.cli import main

GMI = [sys.executable, "-m", "gmi_drl.cli"]


def _run(args, cwd):
    return subprocess.run(GMI + args, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_train_then_eval_on_cartpole(tmp_path):
    run = tmp_path / "cp"
    out = _run(["train", "ppo", "--env.task-id", "CartPole-v1", "--env.num-envs", "4",
                "--total-timesteps", "2048", "--seed", "3", "--run-dir", str(run),
                "--no-compile", "--algo.update-epochs", "2"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(r"step 2,048/2,048 \(100%\) \| [\d,]+ sps", out.stdout), out.stdout
    assert "done: 2,048 steps" in out.stdout
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["seed"] == 3 and cfg["preset"] == "classic" and cfg["run_dir"] == str(run)
    assert cfg["algo"]["ppo"]["update_epochs"] == 2 and cfg["compile"] is False
    ev = _run(["eval", str(run), "--episodes", "5"], tmp_path)
    assert ev.returncode == 0, ev.stderr
    m = re.search(r"return ([\d.]+) \+/- ([\d.]+) over 5 episodes", ev.stdout)
    assert m and 8 <= float(m.group(1)) <= 500, ev.stdout


def test_invalid_input_exits_2_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "--env.num-envs", "3", "--algo.num-steps", "10",
                 "--algo.gamma", "2"]) == 2
    err = capsys.readouterr().err
    assert "algo.gamma=2.0" in err and "must be a multiple of" in err
    assert not (tmp_path / "runs").exists()  # validated before anything started
    assert main(["train", "trpo"]) == 2 and "one of ['ppo', 'a2c', 'dqn', 'ddpg', 'td3', 'appo', 'a3c', 'sac']" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    (tmp_path / "afile").write_text("")
    assert main(["train", "ppo", "--run-dir", str(tmp_path / "afile" / "sub"),
                 "--total-timesteps", "1024"]) == 2
    assert "cannot write the run directory" in capsys.readouterr().err


def test_dqn_through_the_cli_with_its_own_flags(tmp_path, capsys):
    run = tmp_path / "dqn"
    assert main(["train", "dqn", "--preset", "cartpole-zoo", "--total-timesteps", "1024",
                 "--algo.learning-starts", "256", "--algo.gradient-steps", "4",
                 "--algo.double-q", "--run-dir", str(run), "--log.no-tensorboard",
                 "--no-compile"]) == 0
    assert "done: 1,024 steps" in capsys.readouterr().out
    saved = json.loads((run / "config.json").read_text())["algo"]["dqn"]
    assert saved["learning_starts"] == 256 and saved["double_q"] is True
    assert saved["train_frequency"] == 256  # the preset's, not the class default
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert "over 2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize("algo, task", [("td3", "Pendulum-v1"), ("sac", "Pendulum-v1"),
                                        ("a2c", "CartPole-v1")])
def test_off_policy_and_a2c_through_the_cli_resume_and_eval(tmp_path, capsys, algo, task):
    run = tmp_path / algo
    flags = ["--run-dir", str(run), "--log.no-tensorboard", "--no-compile",
             "--model.actor-hidden", "16", "--model.critic-hidden", "16"]
    extra = {"td3": ["--algo.learning-starts", "100", "--algo.minibatch-size", "64",
                     "--algo.save-replay", "--env.max-episode-steps", "50"],
             "sac": ["--algo.learning-starts", "100", "--algo.minibatch-size", "64",
                     "--algo.save-replay"]}.get(algo, [])
    assert main(["train", algo, "--env.task-id", task, "--total-timesteps", "400", *flags,
                 *extra]) == 0
    capsys.readouterr()
    assert main(["train", algo, "--resume", str(run), "--total-timesteps", "800"]) == 0
    assert "done: 800 steps" in capsys.readouterr().out
    saved = json.loads((run / "config.json").read_text())["algo"][algo]
    assert saved["learning_rate"] == {"td3": 1e-3, "sac": 1e-3}.get(algo, 7e-4)
    if algo in ("td3", "sac"):
        assert saved["policy_delay"] == (2 if algo == "td3" else 1)
        assert saved["save_replay"] is True
        assert load_checkpoint(run)["algo"]["replay"]["size"] == 800
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "over 2 episodes" in out
    if algo == "td3":  # --env.max-episode-steps: the run's episodes and its evaluation's
        lengths = {float(r["value"]) for r in csv.DictReader(open(run / "metrics.csv"))
                   if r["name"] == "env/episodic_length"}
        assert lengths == {50.0}
        assert "mean length 50.0)" in out, out


def test_a_time_limit_a_task_does_not_have_is_refused_before_the_run_dir(tmp_path, capsys):
    from gmi_drl.envs.warp.pool import warp_error

    if warp_error() is not None:
        pytest.skip(str(warp_error()))
    run = tmp_path / "ant"
    assert main(["train", "ppo", "--env.task-id", "Ant-gmi-v0", "--env.max-episode-steps", "50",
                 "--run-dir", str(run)]) == 2
    assert "max_episode_steps=50: a warp task's episodes are 1000 steps" in capsys.readouterr().err
    assert not run.exists()


def test_resume_through_the_cli(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", "ppo", "--preset", "cartpole-zoo", "--total-timesteps", "512",
                 "--run-dir", str(run), "--log.no-tensorboard", "--no-compile"]) == 0
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "1024"]) == 0
    assert "done: 1,024 steps" in capsys.readouterr().out
    assert load_checkpoint(run)["global_step"] == 1024
    assert json.loads(Path(run / "config.json").read_text())["total_timesteps"] == 1024


def test_bench_and_switch_subcommands_dispatch(capsys):
    from gmi_drl.cli import BENCHMARKS, USAGE, main

    assert main(["bench", "nope"]) == 2
    assert "must be one of" in capsys.readouterr().err
    assert main(["bench", "--help"]) == 0
    listing = capsys.readouterr().out
    names = USAGE.split("gmi-drl bench {")[1].split("}")[0]
    assert set(names.replace("\n", "").replace(" ", "").split(",")) == set(BENCHMARKS)
    assert all(f"benchmarks/{script}.py" in listing for script in BENCHMARKS.values())
    scripts = {p.stem for p in (Path(__file__).parent.parent / "benchmarks").glob("*.py")}
    assert scripts == set(BENCHMARKS.values())  # every script has a name
    with pytest.raises(SystemExit) as exit_:
        main(["switch", "serve", "--help"])
    assert exit_.value.code == 0 and "--bind" in capsys.readouterr().out
    # what a benchmark cannot run is one line, not a traceback
    assert main(["bench", "env", "--tasks", "Nope-v0", "--seconds", "0.1", "--repeats", "1"]) == 2
    assert capsys.readouterr().err.startswith(
        "gmi-drl bench env: ValueError: invalid pool: task_id='Nope-v0' is neither registered")
    assert main(["bench", "env", "--repeats", "0"]) == 2
    assert "--repeats 0 must be an int >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("args, named", [
    (["reduce", "--iters", "2"], "--iters 2"),  # its warm-up took every sample, then a crash
    (["gmi", "--parts", "foo"], "invalid choice: 'foo'"),  # ran nothing and exited 0
    (["grad-step", "--algos", "td3"], "--algos td3"),  # a KeyError
    (["engines", "--tasks", "CartPole-v1"], "Discrete"),  # an AttributeError
    (["faces", "--sb3-steps", "0"], "--sb3-steps 0"),  # a ZeroDivisionError after the runs
    (["train", "--hopper-updates", "1"], "--hopper-updates 1"),  # the same, after the runs
    (["launch", "--gmis", "1"], "--gmis 1"),
    (["switch", "--mode", "stale-sync", "--workers", "2", "3"], "--workers 2 3"),  # 3 dropped
])
def test_a_benchmark_refuses_a_bad_flag_before_it_measures(args, named, capsys):
    """Exit status 2 and one message naming the flag: argparse's usage error, or the bench
    wrapper's line for a ValueError; no table, no traceback."""
    try:
        status = main(["bench", *args])
    except SystemExit as e:  # argparse's parser.error
        status = e.code
    out, err = capsys.readouterr()
    assert status == 2 and named in err and "Traceback" not in err, err
    assert "|" not in out, out  # refused before any table


def test_switch_serve_refuses_bad_input_in_one_line(capsys):
    import logging
    import socket

    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    try:
        port = taken.getsockname()[1]
        for flags, says in ((["--bind", f"127.0.0.1:{port}"], "Address already in use"),
                            (["--bind", "127.0.0.1:0", "--slots", "3"], "power of two"),
                            (["--bind", "127.0.0.1:0", "--log-level", "loud"], "--log-level"),
                            (["--bind", "127.0.0.1:0", "--seed", "-1", "--member-timeout",
                              "nan", "--delay-ms", "inf"],
                             "--delay-ms inf must be >= 0 and finite; --member-timeout nan must "
                             "be > 0 and finite; --seed -1 must be in [0, 2**64) or unset"),
                            (["--bind", "127.0.0.1:0", "--stats-interval", "-1"],
                             "--stats-interval -1.0 must be >= 0")):
            assert main(["switch", "serve", *flags]) == 2
            err = capsys.readouterr().err
            assert says in err and "Traceback" not in err
        with pytest.raises(SystemExit) as exit_:  # argparse's own error, with the reason
            main(["switch", "serve", "--bind", "127.0.0.1:99999"])
        assert exit_.value.code == 2
        assert "'127.0.0.1:99999' is not HOST:PORT" in capsys.readouterr().err
    finally:
        taken.close()
        logging.getLogger("gmi_drl.comm.switch").setLevel(logging.NOTSET)  # as other tests find it

BASE = ["--env.task-id", "CartPole-v1", "--env.num-envs", "2", "--algo.num-steps", "64",
        "--log.no-tensorboard", "--no-compile", "--algo.update-epochs", "1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A PPO CartPole run of 256 steps (2 iterations, a checkpoint after each)."""
    run = tmp_path_factory.mktemp("cli") / "base"
    assert main(["train", "ppo", *BASE, "--total-timesteps", "256", "--run-dir", str(run),
                 "--checkpoint.every", "1"]) == 0
    return run


def _copy(run, to):
    import shutil

    return Path(shutil.copytree(run, to))


def test_a_resume_reads_its_checkpoint_once_before_the_gmi_does(finished, tmp_path,
                                                                monkeypatch):
    """The controller finds and loads the checkpoint once (its config, the checks), then the
    lone GMI, which runs in this process, loads it to start from."""
    import torch

    run = _copy(finished, tmp_path / "again")
    loads, real = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 0
    newest = run / "checkpoints" / "iteration-0000002.pt"
    assert [Path(p) for p in loads] == [newest, newest]


def test_a_runs_config_json_is_a_config_file(finished, tmp_path, capsys):
    assert main(["train", "ppo", "--config", str(finished / "config.json"), "--total-timesteps",
                 "128", "--run-dir", str(tmp_path / "again")]) == 0
    saved = json.loads((tmp_path / "again" / "config.json").read_text())
    assert saved["env"]["num_envs"] == 2 and saved["config"] == str(finished / "config.json")


def test_a_mistyped_field_in_a_config_file_is_named_before_the_parser_sees_it(
        finished, tmp_path, capsys, recwarn):
    data = json.loads((finished / "config.json").read_text())
    data["env"]["num_envs"] = "16"  # a hand edit: a string where an int belongs
    bad = tmp_path / "tuned.json"
    bad.write_text(json.dumps({"config": data}))
    assert main(["train", "ppo", "--config", str(bad), "--run-dir", str(tmp_path / "x")]) == 2
    assert f"--config {bad}: env.num_envs='16' must be an int" in capsys.readouterr().err
    assert not [w for w in recwarn if "annotated with type" in str(w.message)]
    assert not (tmp_path / "x").exists()


def test_a_resume_the_checkpoint_cannot_serve_changes_nothing(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "r")
    before = (run / "config.json").read_text()
    capsys.readouterr()
    for flags, msg in ((["--env.task-id", "Acrobot-v1"], "env.task_id='Acrobot-v1' (trained on "
                        "'CartPole-v1')"),
                       (["--env.num-envs", "4"], "batch_size=256 env steps per iteration "
                        "(trained with 128), from env.num_envs=4 (trained with 2)"),
                       (["--model.actor-hidden", "8"], "model.actor_hidden='8'"),
                       ([], "already at 256 env steps"),
                       (["--total-timesteps", "300"], "iteration 2 of the 2 that"),
                       (["--run-dir", str(tmp_path / "x")], "--run-dir with --resume"),
                       (["--preset", "demo"], "--preset with --resume")):
        assert main(["train", "ppo", "--resume", str(run), *flags]) == 2, flags
        assert msg in capsys.readouterr().err, flags
    assert (run / "config.json").read_text() == before
    assert not (tmp_path / "x").exists()
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 0
    assert "done: 384 steps" in capsys.readouterr().out


def test_a_resume_past_every_capture_iteration_warns_that_it_captures_nothing(
        finished, tmp_path, capsys, caplog):
    run = _copy(finished, tmp_path / "r")
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384",
                 "--profile.tool", "torch", "--profile.iterations", "1"]) == 0
    assert ("profile.iterations [1] all ran before this resume starts at iteration 2: this "
            "invocation captures nothing") in caplog.text


def test_resume_without_config_json_uses_the_checkpoints_config(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "r")
    (run / "config.json").write_text("{trunc")
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 0
    assert "done: 384 steps" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["env"]["task_id"] == "CartPole-v1"


def test_a_task_the_algorithm_cannot_run_is_refused_before_the_run_dir(tmp_path, capsys):
    for algo, flags, msg in (
            ("td3", ["--env.task-id", "CartPole-v1"], "needs a Box action space"),
            ("dqn", ["--env.task-id", "Pendulum-v1"], "needs a Discrete action space"),
            ("dqn", ["--env.task-id", "FrozenLake-v1"], "needs flat observations"),
            ("ddpg", ["--env.task-id", "Pendulum-v1", "--model.encoder", "nature_cnn"],
             "builds MLP actor and critics"),
            ("sac", ["--env.task-id", "CartPole-v1"], "SAC needs a Box action space"),
            ("sac", ["--norm.reward"], "learns from the rewards as stored in its replay"),
            ("sac", ["--algo.learning-starts", "100"], "algo.minibatch_size=256 is more than "
             "the 100 transitions the replay holds at the first gradient step")):
        run_dir = tmp_path / f"{algo}-{len(msg)}"
        assert main(["train", algo, *flags, "--run-dir", str(run_dir)]) == 2
        assert msg in capsys.readouterr().err
        assert not run_dir.exists()


def test_default_run_dirs_of_one_second_differ(tmp_path, monkeypatch):
    from gmi_drl.config import preset
    from gmi_drl.runner.run import Run

    monkeypatch.chdir(tmp_path)
    dirs = {Run.create(preset("classic")).run_dir for _ in range(3)}
    assert len(dirs) == 3 and all(d.is_dir() for d in dirs)


def test_stale_checkpoint_temporaries_are_removed(tmp_path):
    from gmi_drl.checkpoint import prune_checkpoints

    stale = tmp_path / "checkpoints" / ".iteration-0000003.pt.99999999.tmp"
    stale.parent.mkdir()
    stale.write_bytes(b"cut short by a kill")
    prune_checkpoints(tmp_path, 2)
    assert not stale.exists()


def test_eval_and_help_arguments(finished, capsys):
    assert main(["eval", str(finished), "--num-envs", "0", "--seed", "-1"]) == 2
    assert ("num_envs=0 must be an int >= 1; seed=-1 must be an int in [0, 2**31)"
            in capsys.readouterr().err)
    from gmi_drl.evaluate import evaluate

    with pytest.raises(ValueError, match=r"episodes=2.5 must be an int >= 1; num_envs='3' must "
                                         r"be an int >= 1"):
        evaluate(finished, episodes=2.5, num_envs="3")  # the Python API takes anything
    assert main(["train", "--help"]) == 0
    assert "gmi-drl train ALGO" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    assert "usage: gmi-drl train ppo [" in capsys.readouterr().out
    assert main(["profile", "--help"]) == 0
    assert "usage: gmi-drl profile report RUN_DIR" in capsys.readouterr().out
    assert main(["profile"]) == 2
    assert "first argument must be 'report'" in capsys.readouterr().err


@pytest.mark.parametrize("algo, typo, meant, elsewhere", [
    ("ppo", "--algo.learnin-rate", "--algo.learning-rate", "--algo.learning-starts"),
    ("td3", "--algo.polcy-delay", "--algo.policy-delay", "in gmi-drl"),
])
def test_a_mistyped_flag_is_matched_with_its_algorithms_flags_alone(algo, typo, meant,
                                                                    elsewhere, capsys):
    """The suggestions name the algorithm's own flags and its full command, not every
    algorithm's (tyro's subcommand union listed 7 algorithms' flags, as `gmi-drl ppo`)."""
    with pytest.raises(SystemExit):
        main(["train", algo, typo, "3"])
    err = capsys.readouterr().err
    assert meant in err and elsewhere not in err, err
    assert f"gmi-drl train {algo} --help" in err, err


@pytest.mark.parametrize("damage", ["no config", "no obs_norm", "a field of the wrong type"])
def test_eval_of_a_checkpoint_with_damaged_contents_says_so(finished, tmp_path, capsys, damage):
    """Right format and version, wrong insides: a clear refusal, not a traceback."""
    import torch

    from gmi_drl.checkpoint import list_checkpoints

    state = torch.load(list_checkpoints(finished)[0], weights_only=False)
    if damage == "no config":
        del state["config"]
    elif damage == "no obs_norm":
        del state["obs_norm"]
    else:
        state["config"]["env"]["num_envs"] = "abc"
    path = tmp_path / "damaged.pt"
    torch.save(state, path)
    assert main(["eval", str(path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "not a usable checkpoint" in err and "Traceback" not in err
    assert ("num_envs='abc'" in err) == (damage == "a field of the wrong type")


def test_resume_refuses_another_optimizer_and_a_checkpoint_outside_a_run(tmp_path, capsys):
    run = tmp_path / "a2c"
    assert main(["train", "a2c", "--env.task-id", "CartPole-v1", "--total-timesteps", "80",
                 "--run-dir", str(run), "--log.no-tensorboard", "--no-compile"]) == 0
    before = (run / "config.json").read_text()
    capsys.readouterr()
    assert main(["train", "a2c", "--resume", str(run), "--total-timesteps", "160",
                 "--algo.optimizer", "adam"]) == 2  # the dry run of the GMIs' load
    assert "cannot continue with its weights or optimizer state" in capsys.readouterr().err
    assert (run / "config.json").read_text() == before
    loose = tmp_path / "x" / "y" / "best.pt"
    loose.parent.mkdir(parents=True)
    loose.write_bytes(next((run / "checkpoints").glob("*.pt")).read_bytes())
    assert main(["train", "a2c", "--resume", str(loose), "--total-timesteps", "160"]) == 2
    assert "not in a run's checkpoints/ folder" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["y"]  # nothing written there


def test_a_run_made_from_config_resumes(finished, tmp_path, capsys):
    run = tmp_path / "from-config"
    assert main(["train", "ppo", "--config", str(finished / "config.json"), "--total-timesteps",
                 "128", "--run-dir", str(run)]) == 0
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "256"]) == 0
    assert "done: 256 steps" in capsys.readouterr().out
    assert main(["train", "ppo", "--resume", str(run), "--config", str(run / "config.json")]) == 2
    assert "--config with --resume" in capsys.readouterr().err


def test_a_run_directory_in_use_is_refused(tmp_path, capsys):
    from gmi_drl.config import preset
    from gmi_drl.runner.run import Run

    cfg = preset("classic")
    cfg.run_dir = str(tmp_path / "live")
    with Run.create(cfg).claimed():  # what a running train holds
        assert main(["train", "ppo", *BASE, "--total-timesteps", "128", "--run-dir",
                     cfg.run_dir]) == 2
        assert "is in use by a running gmi-drl (pid " in capsys.readouterr().err
    assert main(["train", "ppo", *BASE, "--total-timesteps", "128", "--run-dir",
                 cfg.run_dir]) == 0  # released
    with Run.create(cfg).claimed():
        assert main(["train", "ppo", "--resume", cfg.run_dir, "--total-timesteps", "256"]) == 2
        err = capsys.readouterr().err  # (--run-dir is refused with --resume: not suggested)
        assert err.rstrip().endswith("wait for it to end"), err


def test_a_placement_error_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", *BASE, "--gmi.num-gmis", "2", "--gmi.backend", "mig"]) == 2
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_train_runs_from_a_thread_other_than_the_main_one(tmp_path, capsys):
    """The SIGTERM handler is the main thread's alone: from another thread train runs
    without it (signal.signal would raise there)."""
    import threading

    codes = []
    worker = threading.Thread(target=lambda: codes.append(main(
        ["train", "ppo", "--total-timesteps", "512", "--no-compile", "--log.no-tensorboard",
         "--run-dir", str(tmp_path / "run")])))
    worker.start()
    worker.join(timeout=120)
    assert codes == [0], capsys.readouterr().err


def test_exit_status_of_a_stopped_command(monkeypatch):
    """143 after SIGTERM (also when a library re-raised it as a KeyboardInterrupt of its own,
    as Ray's wait does), 130 after Ctrl-C, and an earlier command's SIGTERM does not leak into
    the next one run in the same process."""
    from gmi_drl import cli

    assert cli._stop_status(cli.Terminated()) == 143
    assert cli._stop_status(ValueError()) == 1
    cli._sigterm.clear()
    assert cli._stop_status(KeyboardInterrupt()) == 130
    cli._sigterm.set()
    assert cli._stop_status(KeyboardInterrupt()) == 143

    def interrupted(args, debug):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_eval", interrupted)
    assert cli.main(["eval"]) == 130  # the SIGTERM above belonged to an earlier command


def test_eval_video_goes_to_the_run_or_beside_a_loose_checkpoint(tmp_path):
    """The run directory for ``RUN/checkpoints/x.pt``; the checkpoint's own folder otherwise
    (its grandparent could be ``/`` or a folder the user never named)."""
    from gmi_drl.evaluate import _video_dir

    assert _video_dir(tmp_path / "run" / "checkpoints" / "x.pt") == tmp_path / "run"
    assert _video_dir(tmp_path / "loose" / "sub" / "hop.pt") == tmp_path / "loose" / "sub"
    assert _video_dir(Path("/x.pt")) == Path("/")


def test_a_mujoco_that_cannot_import_spares_the_other_tasks(tmp_path, monkeypatch):
    """``MUJOCO_GL`` naming a backend the machine lacks (``osmesa`` without libOSMesa) breaks
    ``import mujoco`` itself: CartPole must still train, and a MuJoCo task must say why not."""
    monkeypatch.setenv("MUJOCO_GL", "no-such-backend")
    ok = _run(["train", "ppo", *BASE, "--total-timesteps", "128", "--no-compile", "--run-dir",
               str(tmp_path / "cartpole")], tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "the MuJoCo tasks are unavailable" in ok.stderr
    bad = _run(["train", "ppo", "--env.task-id", "Hopper-v5", "--run-dir",
                str(tmp_path / "hopper")], tmp_path)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "env.task_id='Hopper-v5' needs MuJoCo" in bad.stderr
    assert "MUJOCO_GL=no-such-backend names a rendering backend" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "hopper").exists()
    spec = subprocess.run([sys.executable, "-c", "import gmi_drl.envs as e\ntry:\n"
                           "    e.task_spec('Hopper-v5')\nexcept ValueError as x:\n    print(x)"],
                          capture_output=True, text=True, timeout=120)  # what eval builds on
    assert "task_id='Hopper-v5' needs MuJoCo" in spec.stdout, spec.stderr[-2000:]


def test_resume_refusals_say_which_command_would_work(finished, tmp_path, capsys):
    assert main(["train", "dqn", "--resume", str(finished)]) == 2
    assert f"is a ppo run, not dqn: run gmi-drl train ppo --resume {finished}" in (
        capsys.readouterr().err)
    early = tmp_path / "early"  # a run stopped before its first checkpoint
    (early / "checkpoints").mkdir(parents=True)
    (early / "train.log").write_text("... the run stopped\n")
    assert main(["train", "ppo", "--resume", str(early)]) == 2
    assert ("the run stopped before its first checkpoint, so nothing can be continued; start it "
            "over with the command that started it") in capsys.readouterr().err


def test_resume_of_what_is_no_checkpoint_says_what_to_give(finished, tmp_path, capsys, caplog):
    assert main(["train", "ppo", "--resume", str(finished / "config.json")]) == 2
    assert ("a checkpoint is a .pt file: give the run directory, or one of its "
            "checkpoints/iteration-*.pt") in capsys.readouterr().err
    text = tmp_path / "readme.txt"
    text.write_text("notes\n")
    assert main(["train", "ppo", "--resume", str(text)]) == 2
    err = capsys.readouterr().err
    assert "is corrupt or not a torch checkpoint; a checkpoint is a .pt" in err
    assert "Error" not in err  # (the unpickler's own KeyError is no help)
    loose = tmp_path / "loose" / "model.pt"  # no run directory around it: no config.json
    loose.parent.mkdir()
    loose.write_bytes(b"junk")
    assert main(["train", "ppo", "--resume", str(loose)]) == 2
    assert "model.pt is corrupt" in capsys.readouterr().err
    assert "config.json" not in caplog.text
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "ppo", "--resume", str(empty)]) == 2
    assert f"{empty} is no run directory that wrote one" in capsys.readouterr().err


def test_a_run_stopped_after_its_last_checkpoint_is_not_sent_to_resume(finished, tmp_path,
                                                                         capsys):
    """Ctrl-C between the final checkpoint and summary.md: there is nothing to continue."""
    from gmi_drl.config import from_dict
    from gmi_drl.runner.run import Run, RunStopped

    run = _copy(finished, tmp_path / "r")
    (run / "summary.md").unlink()
    cfg = from_dict(json.loads((run / "config.json").read_text()))
    stopped = RunStopped(Run(run, cfg), KeyboardInterrupt())
    assert stopped.next_step.startswith("its last checkpoint was already at the run's 256 env "
                                        "steps: training had ended")
    assert stopped.next_step.endswith(f"--resume {run} --total-timesteps MORE")
    assert main(["train", "ppo", "--resume", str(run)]) == 2
    assert ("stopped after its last checkpoint, before summary.md; metrics.csv holds its whole "
            "learning curve") in capsys.readouterr().err
    cfg.total_timesteps = 512  # an earlier checkpoint: continue, as before
    assert RunStopped(Run(run, cfg), KeyboardInterrupt()).next_step.startswith("continue with")


def test_a_checkpoint_copied_from_another_run_is_named(finished, tmp_path, capsys):
    """A run's config.json says PPO and the command says PPO, but the newest checkpoint is a
    DQN run's: the checkpoint is the stray, so moving it out is the advice, not editing
    config.json; once moved, the run resumes from its own newest checkpoint."""
    import shutil

    dqn = tmp_path / "dqn"
    assert main(["train", "dqn", "--preset", "cartpole", "--total-timesteps", "64",
                 "--algo.learning-starts", "32", "--algo.minibatch-size", "32", "--run-dir",
                 str(dqn), "--log.no-tensorboard", "--no-compile"]) == 0
    run = _copy(finished, tmp_path / "r")
    stray = run / "checkpoints" / "iteration-0000900.pt"
    shutil.copy(sorted((dqn / "checkpoints").glob("*.pt"))[-1], stray)
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 2
    err = capsys.readouterr().err
    assert (f"{stray} holds a dqn run, but {run / 'config.json'} is a ppo run: the checkpoint "
            f"came from another run. Move it out of {run / 'checkpoints'}") in err
    stray.unlink()
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 0


def test_an_edited_config_json_is_named_not_the_flags(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "r")
    data = json.loads((run / "config.json").read_text())
    data["env"]["task_id"] = "Acrobot-v1"
    (run / "config.json").write_text(json.dumps(data))
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 2
    assert (f"with no such flag given, {run / 'config.json'} differs from the checkpoint's own "
            "config: restore it, or delete it") in capsys.readouterr().err
    data = json.loads((finished / "config.json").read_text())
    data["algo"] = {"dqn": {}}
    (run / "config.json").write_text(json.dumps(data))
    assert main(["train", "ppo", "--resume", str(run)]) == 2
    assert (f"{run / 'config.json'} configures dqn, but the checkpoint in {run} is a ppo run: "
            "restore config.json") in capsys.readouterr().err
    data = json.loads((finished / "config.json").read_text())
    data["algo"]["ppo"]["gamma"] = 1.5  # a value no flag gave
    (run / "config.json").write_text(json.dumps(data))
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 2
    err = capsys.readouterr().err
    assert "algo.gamma=1.5 must be in [0, 1]" in err
    assert (f"(with no such flag given: {run / 'config.json'} differs from the checkpoint's own "
            "config; restore it, or delete it") in err
    (run / "config.json").write_text((finished / "config.json").read_text())
    assert main(["train", "ppo", "--resume", str(run), "--algo.gamma", "2"]) == 2
    err = capsys.readouterr().err  # the flag's value: config.json is not blamed
    assert "algo.gamma=2.0 must be in [0, 1]" in err and "config.json" not in err
    (run / "config.json").unlink()  # what the message offers: the checkpoint's copy
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 0


def test_eval_of_a_task_not_registered_here_names_the_checkpoint(finished, tmp_path, capsys):
    import torch

    from gmi_drl.checkpoint import list_checkpoints

    state = torch.load(list_checkpoints(finished)[0], weights_only=False)
    state["config"]["env"]["task_id"] = "NotRegisteredHere-v0"
    path = tmp_path / "elsewhere.pt"
    torch.save(state, path)
    assert main(["eval", str(path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: its task cannot be made here: unknown task_id='NotRegisteredHere-v0'" in err


def test_config_file_errors_name_the_file_and_a_second_algorithm(finished, tmp_path, capsys):
    data = json.loads((finished / "config.json").read_text())
    data["env"]["num_envs"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["train", "ppo", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "env.num_envs=0 must be >= 1" in err and f"came from --config {bad}" in err
    data = json.loads((finished / "config.json").read_text())
    data["algo"]["dqn"] = {}
    bad.write_text(json.dumps(data))
    assert main(["train", "ppo", "--config", str(bad)]) == 2
    assert "\"algo\" section names 2 algorithms ('ppo', 'dqn')" in capsys.readouterr().err


def test_a_skipped_mujoco_video_says_how_to_render_headless(monkeypatch):
    from gmi_drl.evaluate import _render_hint

    monkeypatch.delenv("MUJOCO_GL", raising=False)
    assert "set MUJOCO_GL=egl" in _render_hint("Hopper-v5")
    assert _render_hint("CartPole-v1") == ""
    monkeypatch.setenv("MUJOCO_GL", "egl")  # chosen already: the error says the rest
    assert _render_hint("Hopper-v5") == ""


@pytest.mark.parametrize("debug", [False, True])
def test_records_for_train_log_alone_reach_the_terminal_only_with_debug(debug):
    """A Ray restart logs the failed GMIs' tracebacks for train.log; the terminal shows the
    one-line reason unless --debug."""
    code = ("import logging\n"
            "from gmi_drl.cli import main\n"
            "from gmi_drl.errors import LOG_FILE_ONLY\n"
            f"main({['--help', '--debug'] if debug else ['--help']!r})\n"
            "log = logging.getLogger('gmi_drl.test')\n"
            "log.warning('the one-line reason')\n"
            "log.warning('a traceback', extra=LOG_FILE_ONLY)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "the one-line reason" in out.stderr
    assert ("a traceback" in out.stderr) is debug


def test_config_json_is_laid_over_the_checkpoints_config(finished, tmp_path, capsys):
    """A field config.json leaves out keeps the run's value (not the default); a field it sets
    is kept; one this gmi-drl does not know refuses the resume and leaves the file as it is."""
    run = _copy(finished, tmp_path / "r")
    data = json.loads((run / "config.json").read_text())
    assert data["env"]["num_envs"] == 2  # (the default is another value)
    del data["env"]["num_envs"]
    data["algo"]["ppo"]["ent_coef"] = 0.05
    (run / "config.json").write_text(json.dumps(data))
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "384"]) == 0
    resumed = json.loads((run / "config.json").read_text())
    assert resumed["env"]["num_envs"] == 2 and resumed["algo"]["ppo"]["ent_coef"] == 0.05
    resumed["algo"]["ppo"]["prioritized"] = True
    text = json.dumps(resumed)
    (run / "config.json").write_text(text)
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "512"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'config.json'}: config file: unknown field algo.ppo.prioritized" in err
    assert "fix it, or delete it to resume with the config stored in the checkpoint" in err
    assert (run / "config.json").read_text() == text


def test_a_checkpoint_of_an_older_format_version_is_refused_by_name(finished, tmp_path, capsys):
    import torch

    from gmi_drl.checkpoint import list_checkpoints

    run = _copy(finished, tmp_path / "old")
    newest, *older = list_checkpoints(run)
    for path in older:
        path.unlink()
    state = torch.load(newest, weights_only=True)
    state["version"] = 1
    torch.save(state, newest)
    assert main(["eval", str(run), "--episodes", "1"]) == 2
    assert "written by an older gmi-drl" in capsys.readouterr().err


def test_a_config_file_used_for_another_task_is_said_to_be_that_tasks(tmp_path, caplog):
    import json

    from gmi_drl.cli import _train_config
    from gmi_drl.config import preset, to_dict

    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"config": to_dict(preset("auto", "CartPole-v1", "ppo"))}))
    with caplog.at_level("WARNING"):
        cfg, _ = _train_config("ppo", ["--config", str(path)])
    assert cfg.env.task_id == "CartPole-v1" and "was made for" not in caplog.text
    with caplog.at_level("WARNING"):
        cfg, _ = _train_config("ppo", ["--config", str(path), "--env.task-id", "Acrobot-v1"])
    assert cfg.env.task_id == "Acrobot-v1"
    assert f"--config {path} was made for CartPole-v1, not Acrobot-v1" in caplog.text


def test_train_help_lists_the_algorithms_presets(capsys):
    from gmi_drl.config import PRESETS

    with pytest.raises(SystemExit):
        main(["train", "ddpg", "--help"])
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "preset the defaults came from: " + ", ".join(["auto", *PRESETS["ddpg"]]) in text
    assert "Runs as GMIs: --seeds 1-5 [--sweep FLAG=V1,V2 ...] [--budget.threads-pct P]" in text


def test_a_budget_without_seeds_says_it_is_a_batchs(capsys):
    assert main(["train", "ppo", "--budget.cores", "1"]) == 2
    assert ("--budget.cores is a budget of each run of a batch: give --seeds (and --sweep) with "
            "it" in capsys.readouterr().err)
