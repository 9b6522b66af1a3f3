import pytest
import tyro

from gmi_drl.config import ConfigError, TrainConfig, from_dict, preset, task_family, to_dict, validate


def test_validate_names_every_invalid_field_at_once():
    cfg = TrainConfig()
    cfg.env.num_envs = 3
    cfg.algo.num_steps = 10          # batch_size 30, not a multiple of 4 minibatches
    cfg.algo.gamma = 1.5
    cfg.algo.learning_rate = 0.0
    cfg.model.actor_hidden = "64:abc"
    cfg.env.task_id = "NoSuchTask-v0"
    cfg.total_timesteps = 10
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    for needle in ("env.num_envs * algo.num_steps=30 must be a multiple of "
                   "algo.num_minibatches=4", "algo.gamma=1.5", "algo.learning_rate=0.0",
                   "model.actor_hidden='64:abc'", "env.task_id='NoSuchTask-v0'",
                   "total_timesteps=10 must be >= batch_size=30"):
        assert needle in msg
    assert msg.count("\n") == 6  # one line per problem


def test_defaults_are_valid_and_derived_sizes_are_properties():
    cfg = TrainConfig()
    validate(cfg)
    assert (cfg.batch_size, cfg.num_iterations, cfg.algo_name) == (512, 976, "ppo")
    cfg.gmi.num_gmis = 2
    assert (cfg.batch_size, cfg.num_iterations) == (1024, 488)  # batch_size counts every GMI


def test_presets_follow_cleanrl():
    m = preset("mujoco")
    assert (m.env.num_envs, m.algo.num_steps, m.algo.learning_rate, m.algo.num_minibatches,
            m.algo.update_epochs, m.algo.ent_coef, m.norm.obs, m.norm.reward,
            m.total_timesteps) == (1, 2048, 3e-4, 32, 10, 0.0, True, True, 1_000_000)
    c = preset("classic")
    assert (c.env.num_envs, c.algo.num_steps, c.algo.learning_rate, c.algo.ent_coef,
            c.algo.num_minibatches, c.algo.update_epochs) == (4, 128, 2.5e-4, 0.01, 4, 4)
    a = preset("atari")
    assert (a.env.num_envs, a.algo.clip_coef, a.model.encoder) == (8, 0.1, "nature_cnn")
    for name in ("classic", "mujoco", "atari", "demo", "cartpole-zoo"):
        validate(preset(name))


def test_the_dqn_pong_preset_is_the_atari_one_with_n_step_returns():
    atari, pong = preset("atari", algo="dqn"), preset("pong", algo="dqn")
    validate(pong)
    a, p = atari.algo, pong.algo
    assert (p.n_step, p.learning_rate, p.learning_starts, p.exploration_fraction,
            pong.total_timesteps) == (3, 2.5e-4, 20_000, 0.2, 500_000)
    assert a.n_step == 1 and pong.env == atari.env and pong.model == atari.model
    assert (p.minibatch_size, p.buffer_size, p.train_frequency, p.target_network_frequency) == (
        a.minibatch_size, a.buffer_size, a.train_frequency, a.target_network_frequency)


def test_auto_preset_by_task_family():
    assert task_family("Hopper-v5") == "mujoco" and task_family("CartPole-v1") == "classic"
    assert task_family("ALE/Pong-v5") == "atari" and task_family("Pong-v5") == "atari"
    cfg = preset("auto", "HalfCheetah-v5")
    assert cfg.preset == "mujoco" and cfg.env.task_id == "HalfCheetah-v5"
    with pytest.raises(ConfigError, match="preset='nope'"):
        preset("nope")
    with pytest.raises(ConfigError, match="algo='trpo' must be one of"):
        preset("auto", "CartPole-v1", algo="trpo")
    # an algorithm without a preset of the task's family gets its general one
    for algo in ("a3c", "a2c"):
        cfg = preset("auto", "Hopper-v5", algo=algo)
        assert cfg.preset == "classic" and cfg.env.task_id == "Hopper-v5"
    with pytest.raises(ConfigError, match="preset='mujoco' must be one of"):
        preset("mujoco", "Hopper-v5", algo="a3c")  # asked for by name: still refused


def test_tyro_flags_override_preset_defaults_and_dict_round_trip():
    cfg = tyro.cli(TrainConfig, default=preset("mujoco"),  # as the CLI: the algorithm first
                   args=["ppo", "--env.num-envs", "16", "--algo.learning-rate", "1e-3", "--seed",
                         "7", "--norm.no-reward", "--gmi.reduction", "har"],
                   config=(tyro.conf.CascadeSubcommandArgs,))
    assert (cfg.env.num_envs, cfg.algo.learning_rate, cfg.seed, cfg.algo.num_steps) == (16, 1e-3, 7, 2048)
    assert (cfg.norm.obs, cfg.norm.reward, cfg.gmi.reduction) == (True, False, "har")
    data = to_dict(cfg)
    assert list(data["algo"]) == ["ppo"] and data["algo"]["ppo"]["num_steps"] == 2048
    assert from_dict(data) == cfg
    with pytest.raises(ConfigError, match="unknown field bogus"):
        from_dict({**data, "bogus": 1})
    with pytest.raises(ConfigError, match="algo 'trpo' is none of"):
        from_dict({**data, "algo": {"trpo": {}}})
    with pytest.raises(ConfigError,
                       match=r"unknown field env.num_envz \(did you mean 'num_envs'\?\)"):
        from_dict({**data, "env": {"num_envz": 8}})
    with pytest.raises(ConfigError, match="no \"algo\""):
        from_dict({"env": {"num_envs": 8}})


def test_fields_of_the_wrong_type_or_not_finite_are_named():
    """What a config file or the Python API can get wrong and tyro's flags cannot."""
    cfg = preset("classic")
    cfg.env.num_envs, cfg.placement, cfg.algo.learning_rate = "8", "cloud", float("inf")
    cfg.gmi.num_devices, cfg.seed = 2.5, True
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    for msg in ("env.num_envs='8' must be an int", "placement='cloud' must be one of ['serial', "
                "'local', 'ray']", "algo.learning_rate=inf must be a finite number",
                "gmi.num_devices=2.5 must be an int or null", "seed=True must be an int"):
        assert msg in str(e.value)
    cfg = preset("classic")
    cfg.seed = -1
    with pytest.raises(ConfigError, match=r"seed=-1 must be in \[0, 2\*\*62 - 4\]"):
        validate(cfg)
    cfg = preset("classic")
    cfg.algo, cfg.log = "ppo", None  # whole sections: an AttributeError from inside, before
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert "algo='ppo' must be PPOConfig or A2CConfig or" in str(e.value)
    assert "log=None must be LogConfig" in str(e.value)
    for not_a_config in (None, "classic", {"env": {}}):
        with pytest.raises(ConfigError, match="is no TrainConfig"):
            validate(not_a_config)
    with pytest.raises(ConfigError, match="task_id=123 must be a string"):
        preset("auto", 123)
    cfg = preset("classic")  # a list's items, as a config file gives them
    cfg.profile.iterations, cfg.profile.ranks = ["1"], [0, "a"]
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    for msg in ("profile.iterations=['1'] must be a list of ints",
                "profile.ranks=[0, 'a'] must be a list of ints"):
        assert msg in str(e.value)


@pytest.mark.parametrize("run_dir", ["", "  "])
def test_an_empty_run_dir_is_refused(run_dir):
    """It would put the run's files straight into the working directory."""
    with pytest.raises(ConfigError, match="is empty: give a directory"):
        validate(TrainConfig(run_dir=run_dir))


def test_existing_run_dir_needs_resume_once_it_holds_a_checkpoint(tmp_path):
    """A run stopped before its first checkpoint has nothing to continue: the same command
    starts it over; one with checkpoints needs --resume."""
    (tmp_path / "config.json").write_text("{}")
    cfg = TrainConfig(run_dir=str(tmp_path))
    validate(cfg)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "iteration-0000001.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match="--resume"):
        validate(cfg)


def test_cuda_device_without_cuda_is_refused():
    import torch

    cfg = preset("classic", "CartPole-v1")
    cfg.device = "cuda"
    if torch.cuda.is_available():
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match="device='cuda'"):
            validate(cfg)


def test_ray_flags_parse_and_are_validated_together():
    cfg = tyro.cli(TrainConfig, default=preset("classic"),
                   args=["--placement", "ray", "--ray.address", "10.0.0.1:6379",
                         "--ray.max-restarts", "2", "--ray.num-cpus-per-gmi", "0.5"])
    assert (cfg.placement, cfg.ray.address, cfg.ray.max_restarts, cfg.ray.num_cpus_per_gmi) == (
        "ray", "10.0.0.1:6379", 2, 0.5)
    validate(cfg)
    assert from_dict(to_dict(cfg)) == cfg
    cfg.ray.address = "auto"
    validate(cfg)
    cfg.ray.address, cfg.ray.max_restarts = "headnode", -1
    cfg.ray.num_cpus_per_gmi, cfg.ray.placement_timeout_s = 0, 0
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    for needle in ("ray.address='headnode' must be auto or HOST:PORT", "ray.max_restarts=-1",
                   "ray.num_cpus_per_gmi=0", "ray.placement_timeout_s=0"):
        assert needle in msg


def test_ray_refuses_the_local_launchers_reduction_options():
    cfg = preset("classic")
    cfg.placement, cfg.gmi.num_gmis, cfg.gmi.reduction = "ray", 2, "ring"
    cfg.gmi.netns, cfg.gmi.switch_addr = "ns0,ns1", "10.0.0.1:9000,10.0.0.2:9000"
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    for needle in ("gmi.reduction='ring' is for the local placement", "gmi.netns is for the local",
                   "give one switch address for all GMIs"):
        assert needle in msg


def test_ray_async_trainers_reduce_through_a_ring_whatever_their_number():
    cfg = preset("classic", "CartPole-v1", "appo")
    cfg.placement, cfg.gmi.trainer_gmis, cfg.gmi.reduction = "ray", 2, "mpr"
    with pytest.raises(ConfigError, match="the trainer GMIs of an async_training run reduce "
                                          "through a gloo ring"):
        validate(cfg)
    cfg.gmi.reduction = "auto"
    validate(cfg)  # several trainer GMIs on Ray


def test_ray_settings_without_the_ray_launcher_are_refused_unless_a_run_resumes(tmp_path):
    cfg = preset("classic")
    cfg.ray.address, cfg.ray.max_restarts = "auto", 1
    with pytest.raises(ConfigError, match=r"ray.address, ray.max_restarts set but "
                                          r"placement='local'; add --placement ray"):
        validate(cfg)
    cfg.resume = str(tmp_path)  # a Ray run's: its stored ray.* came with it, not from flags
    validate(cfg)


def test_serial_placement_refuses_what_needs_a_process_per_gmi():
    cfg = preset("classic")
    cfg.placement, cfg.gmi.num_gmis, cfg.gmi.reduction = "serial", 2, "ring"
    cfg.profile.tool, cfg.profile.all_ranks = "torch", True
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert "gmi.reduction='ring' with placement='serial'" in msg
    assert "placement='serial' profiles one GMI" in msg
    cfg.gmi.reduction, cfg.profile.tool, cfg.profile.all_ranks = "mpr", "none", False
    validate(cfg)


def test_norm_clips_are_validated():
    cfg = preset("mujoco")
    cfg.norm.obs_clip, cfg.norm.reward_clip = 0.0, -1.0
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert "norm.obs_clip=0.0 must be > 0" in str(err.value)
    assert "norm.reward_clip=-1.0 must be > 0" in str(err.value)


def test_a_run_too_short_to_pass_learning_starts_is_refused():
    cfg = preset("mujoco", "HalfCheetah-v5", algo="td3")  # learning_starts 10,000
    cfg.total_timesteps = 3000
    with pytest.raises(ConfigError, match=r"algo.learning_starts=10,000 env steps, but each GMI "
                       r"takes 3,000: nothing would be trained"):
        validate(cfg)
    cfg.gmi.num_gmis, cfg.total_timesteps = 2, 30_000  # 15,000 steps each: it trains
    validate(cfg)


@pytest.mark.parametrize("algo, name", [("td3", "gmi-humanoid"), ("sac", "gmi-ant"),
                                        ("ddpg", "classic"), ("dqn", "cartpole")])
def test_a_minibatch_larger_than_the_warm_replay_is_refused_for_every_off_policy_algorithm(
        algo, name):
    """The replay holds learning_starts transitions, rounded up to whole iterations, at the
    first gradient step: a larger minibatch would draw the same few again and again."""
    cfg = preset(name, algo=algo)
    a, num_envs = cfg.algo, cfg.env.num_envs
    assert a.validate(num_envs, 1) == []  # the preset itself holds
    spi = a.steps_per_iteration(num_envs)
    a.learning_starts, a.minibatch_size = spi, spi + 1  # one iteration warm: one short
    assert a.validate(num_envs, 1) == [
        f"algo.minibatch_size={spi + 1} is more than the {spi} transitions the replay holds at "
        f"the first gradient step (algo.learning_starts={spi}, in whole iterations of {spi} env "
        f"steps): raise --algo.learning-starts to {spi + 1} or lower --algo.minibatch-size"]
    a.learning_starts = spi + 1  # two iterations warm: it holds the minibatch
    assert a.validate(num_envs, 1) == []
    if not name.startswith("gmi-"):  # (the GPU presets' devices are refused here)
        a.learning_starts = spi
        with pytest.raises(ConfigError, match="transitions the replay holds at the first"):
            validate(cfg)


def test_a_reducer_address_without_its_reduction_is_refused():
    cfg = preset("classic")
    cfg.gmi.num_gmis, cfg.gmi.switch_addr, cfg.gmi.ps_addr = 2, "127.0.0.1:9", "127.0.0.1:8"
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert "gmi.switch_addr set, but gmi.reduction='auto': add --gmi.reduction switch" in str(
        err.value)
    assert "gmi.ps_addr set, but gmi.reduction='auto': add --gmi.reduction ps" in str(err.value)
    cfg.gmi.reduction, cfg.gmi.ps_addr = "switch", None
    validate(cfg)
    cfg.gmi.switch_addr = "nosuch.invalid:9"  # said before the run dir, not by GMI 0 later
    with pytest.raises(ConfigError, match="nosuch.invalid does not resolve here"):
        validate(cfg)
    cfg.placement = "ray"  # (a cluster's GMIs resolve it on their nodes)
    try:
        validate(cfg)
    except ConfigError as e:  # (other rules of a Ray run may hold here)
        assert "does not resolve" not in str(e)


def test_serial_gmis_on_emulated_devices_name_the_reduction_they_cannot_run(tmp_path):
    from gmi_drl.runner.placement import make_placement

    cfg = preset("classic")
    cfg.gmi.num_gmis, cfg.gmi.num_devices, cfg.placement = 2, 2, "serial"
    validate(cfg)  # auto: which reduction only the layout tells
    with pytest.raises(ConfigError, match="placement='serial': .* not mrr; give --gmi.reduction "
                       "mpr, or --placement local"):
        make_placement(cfg, 1000)


def test_learning_starts_at_the_last_step_is_accepted_and_trains_once(tmp_path):
    """Validation lets it through because the last iteration's update trains (env_steps >=
    learning_starts): one critic loss is logged, at the last step."""
    import csv

    from gmi_drl.train import train

    cfg = preset("classic", "Pendulum-v1", algo="td3")  # one env step per iteration
    cfg.total_timesteps = cfg.algo.learning_starts = 300
    cfg.compile, cfg.log.tensorboard, cfg.log.log_every = False, False, 1
    cfg.placement, cfg.run_dir = "serial", str(tmp_path / "run")
    validate(cfg)
    train(cfg)
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv"))
            if r["name"] == "losses/critic_loss"]
    assert [int(r["global_step"]) for r in rows] == [300], rows


def test_the_auto_preset_of_a_warp_task_is_its_own():
    """A user naming only the task gets the Table 6 network and the warp engine's settings."""
    cfg = preset("auto", "FrankaCabinet-gmi-v0")
    assert cfg.preset == "gmi-frankacabinet" and cfg.env.engine == "warp"
    assert cfg.model.actor_hidden == "256:128:64"
    assert preset("auto", "Ant-gmi-v0", "a2c").preset == "classic"  # a2c has no gmi-* preset
    assert preset("auto", "Hopper-v5").preset == "mujoco"


def test_a_preset_may_carry_its_algorithms_name():
    """``gmi-humanoid-sac`` (as the preset is named where no command names the algorithm) is
    SAC's ``gmi-humanoid``, through the CLI too; another algorithm's name is refused."""
    from gmi_drl.cli import _train_config

    for algo in ("sac", "td3"):
        for task in ("humanoid", "ant"):
            cfg = preset(f"gmi-{task}-{algo}", algo=algo)
            assert cfg.preset == f"gmi-{task}" and cfg.algo_name == algo
            assert cfg == preset(f"gmi-{task}", algo=algo)
    cfg, _ = _train_config("sac", ["--preset", "gmi-humanoid-sac"])
    assert cfg.preset == "gmi-humanoid" and cfg.env.task_id == "Humanoid-gmi-v0"
    with pytest.raises(ConfigError, match="preset='gmi-ant-td3' is td3's: gmi-drl train td3 "
                                          "--preset gmi-ant-td3"):
        preset("gmi-ant-td3", algo="sac")
    assert preset("gmi-ant-ppo", algo="ppo").preset == "gmi-ant"  # (every algorithm's)
    with pytest.raises(ConfigError, match="preset='gmi-ant-sac-sac' must be one of"):
        preset("gmi-ant-sac-sac", algo="sac")  # (one suffix)


def test_an_algorithm_without_a_preset_for_the_tasks_family_says_so(caplog):
    with caplog.at_level("WARNING", logger="gmi_drl.config"):
        cfg = preset("auto", "Hopper-v5", "a2c")
    assert cfg.preset == "classic"
    assert ("a2c has no preset for mujoco tasks: Hopper-v5 starts from its 'classic' preset "
            "(settings made for CartPole-v1)") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gmi_drl.config"):
        assert preset("auto", "Ant-gmi-v0", "a2c").preset == "classic"  # its family: classic
    assert "a2c has no preset for Ant-gmi-v0: Ant-gmi-v0 starts from" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gmi_drl.config"):
        assert preset("auto", "Anymal-gmi-v0", "td3").preset == "classic"
    assert "(settings made for Pendulum-v1)" in caplog.text  # DDPG/TD3's classic preset
    caplog.clear()
    with caplog.at_level("WARNING", logger="gmi_drl.config"):
        assert preset("auto", "Hopper-v5", "ppo").preset == "mujoco"
        assert preset("auto", "Ant-gmi-v0", "ppo").preset == "gmi-ant"
        assert preset("auto", "Humanoid-gmi-v0", "sac").preset == "gmi-humanoid"
        assert preset("auto", "CartPole-v1", "a2c").preset == "classic"
    assert not caplog.text


def test_an_unbounded_gradient_norm_is_written_as_strict_json_and_read_back(tmp_path):
    import json
    import math

    from gmi_drl.config import load_config_file

    cfg = preset("classic", algo="dqn")  # CleanRL's DQN: max_grad_norm inf
    assert math.isinf(cfg.algo.max_grad_norm)
    text = json.dumps(to_dict(cfg), allow_nan=False)  # raises on an Infinity token
    assert json.loads(text)["algo"]["dqn"]["max_grad_norm"] == "inf"
    assert from_dict(json.loads(text)) == cfg
    # a config.json written before, with Python's Infinity token, still loads
    old = tmp_path / "config.json"
    old.write_text(text.replace('"inf"', "Infinity"))
    assert load_config_file(str(old)).algo.max_grad_norm == math.inf
    # the text form is read back only where the field is a float
    data = json.loads(text)
    data["env"]["task_id"] = "inf"
    assert from_dict(data).env.task_id == "inf"
    data["algo"]["dqn"]["learning_rate"] = "-inf"
    with pytest.raises(ConfigError, match="learning_rate=-inf must be a finite number"):
        from_dict(data)


@pytest.mark.parametrize("algo, flags, needle", [
    ("ppo", ["--env.num-envs", "1", "--algo.num-steps", "8", "--algo.num-minibatches", "8"],
     "leaves minibatches of 1 sample"),
    ("appo", ["--env.num-envs", "1", "--algo.num-steps", "1", "--algo.fragments-per-batch", "1",
              "--algo.num-minibatches", "1"], "leaves minibatches of one sample"),
    ("a3c", ["--env.num-envs", "1", "--algo.num-steps", "1", "--algo.fragments-per-batch", "1",
             "--algo.normalize-advantage"], "normalize_advantage needs a batch of more than one"),
])
def test_advantages_normalised_over_one_sample_are_refused(algo, flags, needle):
    """Their std is 0 (NaN with torch's unbiased std): every update would be NaN."""
    from gmi_drl.cli import _train_config  # parses the flags as `gmi-drl train`, validates

    with pytest.raises(ConfigError, match=needle):
        _train_config(algo, flags)
    if algo != "a3c":  # the same batch without normalisation is fine
        _train_config(algo, [*flags, "--algo.no-norm-adv"])


def test_every_broken_rule_is_named_at_once_a_non_finite_field_once():
    from gmi_drl.cli import _train_config

    with pytest.raises(ConfigError) as err:
        _train_config("ppo", ["--algo.gamma", "1.5", "--algo.learning-rate", "inf",
                              "--env.num-envs", "0", "--seed", str(2**64),
                              "--env.task-id", "cartpole-v1"])
    lines = str(err.value).splitlines()[1:]
    # the fields that do not hold on their own first (in declaration order), then the rules
    assert [ln.split("=")[0].strip() for ln in lines] == [
        "algo.learning_rate", "algo.gamma", "env.num_envs", "env.task_id", "seed"]
    assert "algo.learning_rate=inf must be a finite number" in lines[0]  # not also "> 0"
    assert "(did you mean 'CartPole-v1'?)" in lines[3]
    assert f"seed={2**64} must be in [0, 2**62 - 0]" in lines[4]  # (num_envs 0: no envs)
    # ALE's seeds are 31-bit: the last env of the run must get one
    _train_config("dqn", ["--env.task-id", "Pong-v5", "--preset", "atari", "--seed",
                          str(2**31 - 8), "--env.num-envs", "8"])
    with pytest.raises(ConfigError, match=r"seed=2147483641 must be in \[0, 2\*\*31 - 8\] \(env "
                       r"i of the run's 8 is seeded seed \+ i, and Pong-v5's engine takes seeds "
                       r"below 2\*\*31\)"):
        _train_config("dqn", ["--env.task-id", "Pong-v5", "--preset", "atari", "--seed",
                              str(2**31 - 7), "--env.num-envs", "8"])


def _outside(symbol: str, bound):
    """A value just outside the bound ``value <symbol> bound``."""
    return {">": bound, ">=": bound - 1, "<": bound, "<=": bound + 1}[symbol]


def test_every_declared_bound_of_every_section_and_algorithm_is_checked():
    """Each field's bounds are declared beside it and checked by one function: a value just
    outside each bound is named (and only that field), the defaults are inside."""
    import dataclasses
    import typing

    from gmi_drl.algos import ALGORITHMS
    from gmi_drl.config import field_errors
    from gmi_drl.config.bounds import _bounds

    checked = 0
    for name, (algo_cls, _) in ALGORITHMS.items():
        cfg = preset("classic", algo=name)
        assert field_errors(cfg) == []
        sections = [(f"{s}.", getattr(cfg, s)) for s in
                    ("algo", "env", "model", "norm", "log", "checkpoint", "gmi", "ray", "async_")]
        for prefix, section in [("", cfg), *sections]:
            hints = typing.get_type_hints(type(section), include_extras=True)
            for f in dataclasses.fields(section):
                for symbol, bound in _bounds(hints[f.name]):
                    before = getattr(section, f.name)
                    setattr(section, f.name, _outside(symbol, bound))
                    errors = field_errors(cfg)
                    setattr(section, f.name, before)
                    field = prefix.replace("async_", "async") + f.name
                    assert [(e.field, e.kind) for e in errors] == [(field, "bound")], errors
                    checked += 1
    assert checked > 150


def test_bounds_read_as_the_messages_say():
    from dataclasses import dataclass
    from typing import Annotated

    from annotated_types import Ge, Gt, Interval, MinLen

    from gmi_drl.config import field_errors

    @dataclass
    class Section:
        rate: Annotated[float, Gt(0)] = 1.0
        count: Annotated[int, Ge(1)] = 1
        share: Annotated[float, Interval(gt=0, lt=1)] | None = None
        gamma: Annotated[float, Interval(ge=0, le=1)] = 0.5
        tau: Annotated[float, Interval(gt=0, le=1)] = 0.5
        flag: bool = False

    assert field_errors(Section()) == [] and field_errors(Section(share=0.5)) == []
    bad = Section(rate=0.0, count=0, share=1.0, gamma=-0.1, tau=0, flag=1)
    assert [e.message for e in field_errors(bad, "x.")] == [
        "x.rate=0.0 must be > 0", "x.count=0 must be >= 1",
        "x.share=1.0 must be in (0, 1) or None", "x.gamma=-0.1 must be in [0, 1]",
        "x.tau=0 must be in (0, 1]", "x.flag=1 must be true or false"]
    assert [e.message for e in field_errors(Section(count=True, rate=float("nan")))] == [
        "rate=nan must be a finite number", "count=True must be an int"]

    @dataclass
    class Unchecked:
        name: Annotated[str, MinLen(1)] = "a"

    with pytest.raises(TypeError, match="checks the bounds Gt, Ge, Lt, Le and Interval only"):
        field_errors(Unchecked())


def test_a_field_its_bound_names_is_not_named_again_by_a_rule():
    cfg = preset("classic", algo="appo")
    cfg.async_.fragments_per_transfer, cfg.async_.env_splits = 0, 0  # (the channels' rules too)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert [ln.strip() for ln in str(err.value).splitlines()[1:]] == [
        "async.fragments_per_transfer=0 must be >= 1",
        "async.env_splits=0 must be >= 1"]
