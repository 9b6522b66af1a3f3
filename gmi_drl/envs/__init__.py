"""gmi-drl's environment engine: EnvPool's batched `send`/`recv` API over native and generic envs.

    pool = gmi_drl.envs.make("Hopper-v5", num_envs=16, env_batch_size=8, seed=0)
    obs, info = pool.reset()
    pool.send(actions, info["env_id"]); obs, rew, term, trunc, info = pool.recv()

    envs = gmi_drl.envs.make_vec("Hopper-v5", num_envs=8)   # a gymnasium.vector.VectorEnv
    env = gmi_drl.envs.make_dm("Hopper-v5", num_envs=8)     # batched dm_env TimeSteps

    # a GPU simulator: every world in one MuJoCo Warp model, torch tensors on the device
    pool = gmi_drl.envs.make("Ant-gmi-v0", 4096, device="cuda:0")   # same_step autoreset
"""

from gmi_drl.envs.dm import DmEnv, make_dm
from gmi_drl.envs.gym_vector import GymVectorEnv, make_vec
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.registry import engines, list_tasks, make, register, register_cpp, task_spec
from gmi_drl.envs.spec import AutoresetMode, EnvSpec

__all__ = ["AutoresetMode", "DmEnv", "EnvPool", "EnvSpec", "GymVectorEnv", "engines",
           "list_tasks", "make", "make_dm", "make_vec", "register", "register_cpp", "task_spec"]
