"""Build of gmi-drl's native env cores; metadata is in pyproject.toml.

`gmi_drl.envs._cartpole_pool`: CartPole-v1 as a whole pool in C++. `gmi_drl.envs._mujoco_core`:
the planar MuJoCo tasks on a C++ thread pool, linked against the MuJoCo library the `mujoco`
wheel ships (headers included). Both are optional extensions: where one cannot be built, the NumPy engine of its tasks runs instead.
"""

import os

import mujoco
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

_MUJOCO_DIR = os.path.dirname(mujoco.__file__)
_LIB = next(f for f in os.listdir(_MUJOCO_DIR) if f.startswith("libmujoco.so"))

# No FMA contraction: the cores reproduce Gymnasium's float64 operations exactly.
_FLAGS = ["-O3", "-ffp-contract=off"]

setup(
    ext_modules=[
        Pybind11Extension("gmi_drl.envs._cartpole_pool", ["csrc/cartpole_pool.cpp"],
                          depends=["csrc/episodes.h"],
                          extra_compile_args=_FLAGS, cxx_std=17, optional=True),
        Pybind11Extension(
            "gmi_drl.envs._mujoco_core",
            ["csrc/mujoco_core.cpp"],
            depends=["csrc/episodes.h"],
            include_dirs=[os.path.join(_MUJOCO_DIR, "include")],
            library_dirs=[_MUJOCO_DIR],
            # `import mujoco` has loaded this soname before the core is imported
            extra_link_args=[f"-l:{_LIB}", f"-Wl,-rpath,{_MUJOCO_DIR}"],
            extra_compile_args=_FLAGS,
            cxx_std=17,
            optional=True,
        )
    ],
    cmdclass={"build_ext": build_ext},
)
