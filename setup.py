"""Build of gmi-drl's native MuJoCo core (`gmi_drl.envs._mujoco_core`); metadata is in pyproject.toml.

The core links against the MuJoCo library the `mujoco` wheel ships (headers included). It is an
optional extension: where it cannot be built, the pure NumPy MuJoCo path runs instead.
"""

import os

import mujoco
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

_MUJOCO_DIR = os.path.dirname(mujoco.__file__)
_LIB = next(f for f in os.listdir(_MUJOCO_DIR) if f.startswith("libmujoco.so"))

setup(
    ext_modules=[
        Pybind11Extension(
            "gmi_drl.envs._mujoco_core",
            ["csrc/mujoco_core.cpp"],
            include_dirs=[os.path.join(_MUJOCO_DIR, "include")],
            library_dirs=[_MUJOCO_DIR],
            # `import mujoco` has loaded this soname before the core is imported
            extra_link_args=[f"-l:{_LIB}", f"-Wl,-rpath,{_MUJOCO_DIR}"],
            extra_compile_args=["-O3"],
            cxx_std=17,
            optional=True,
        )
    ],
    cmdclass={"build_ext": build_ext},
)
