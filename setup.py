"""Build of gmi-drl's native env cores and the switch's data plane; metadata is in pyproject.toml.

- `gmi_drl.envs._cartpole_pool`: CartPole-v1 as a whole pool in C++.
- `gmi_drl.envs._mujoco_core`: the planar MuJoCo tasks on a C++ thread pool, linked against the
  MuJoCo library the `mujoco` wheel ships (headers included).
- `gmi_drl.envs._atari_core`: Atari on a C++ thread pool over ale-py's emulators. The ale-py
  wheel ships no headers, so the build fetches the source distribution of the pinned ale-py
  version from PyPI (checked against its sha256; or the file named by ``GMI_DRL_ALE_SDIST``) and
  compiles against its headers; nothing of it is kept but the headers under ``build/``.
- `gmi_drl.envs._cpp_examples`: envs written against the C++ env template (csrc/env_template.h):
  Pendulum-v1 and the template's contract checks; `template_env` builds a module of one's own.
- `gmi_drl.comm.switch._plane`: the aggregation switch's data plane (recvmmsg/sendmmsg).
- `gmi_drl.envs._xla_ffi`: a pool's send/recv as XLA FFI handlers (`EnvPool.xla()`), compiled
  against the headers of jax's FFI API, so only where ``jax`` is importable at build time (the
  ``jax`` extra; ``make test`` installs it, then builds this module in place).

All are optional: where one cannot be built, the install still succeeds and its tasks run on
their NumPy engines (Atari: on ale-py's vector env; the switch: on its Python data plane), with
the reason printed here.
"""

import hashlib
import io
import os
import re
import sys
import tarfile
import urllib.parse
import urllib.request

import mujoco
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

_MUJOCO_DIR = os.path.dirname(mujoco.__file__)
_LIB = next(f for f in os.listdir(_MUJOCO_DIR) if f.startswith("libmujoco.so"))

# No FMA contraction: the cores reproduce Gymnasium's float64 operations exactly.
_FLAGS = ["-O3", "-ffp-contract=off"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# Must equal the `ale-py` pin in pyproject.toml: the core calls into that version's binary.
ALE_PY_VERSION = "0.12.1"
_ALE_SDIST = f"ale_py-{ALE_PY_VERSION}.tar.gz"
_ALE_SDIST_SHA256 = "c503d574c5983e1063b451201ccb779d935919c0f6bf116fb0f4f8aa4c86d249"
_INDEX = os.environ.get("GMI_DRL_PYPI_SIMPLE", "https://pypi.org/simple")


def _fetch_ale_sdist() -> bytes:
    """The ale-py sdist's bytes, from ``GMI_DRL_ALE_SDIST`` or PyPI's simple index."""
    path = os.environ.get("GMI_DRL_ALE_SDIST")
    if path:
        with open(path, "rb") as f:
            data = f.read()
    else:
        with urllib.request.urlopen(f"{_INDEX}/ale-py/", timeout=60) as r:
            page = r.read().decode()
        m = re.search(r'href="([^"#]*' + re.escape(_ALE_SDIST) + r')[#"]', page)
        if m is None:
            raise RuntimeError(f"{_ALE_SDIST} is not listed at {_INDEX}/ale-py/")
        url = urllib.parse.urljoin(f"{_INDEX}/ale-py/", m.group(1))  # links may be relative
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != _ALE_SDIST_SHA256:
        raise RuntimeError(f"{_ALE_SDIST} has sha256 {digest}, expected {_ALE_SDIST_SHA256}")
    return data


def _ale_include_dir() -> str | None:
    """A directory with ale-py's C++ headers of `ALE_PY_VERSION`, or None (reason printed)."""
    root = os.path.join(_HERE, "build", f"ale-py-{ALE_PY_VERSION}-include")
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    try:
        data = _fetch_ale_sdist()
        prefix = f"ale_py-{ALE_PY_VERSION}/src/"
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                name = member.name
                if (member.isfile() and name.startswith(prefix + "ale/")
                        and name.endswith((".h", ".hpp", ".hxx")) and ".." not in name):
                    dest = os.path.join(root, name[len(prefix):])
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with open(dest, "wb") as f:
                        f.write(tar.extractfile(member).read())
            with tar.extractfile(prefix + "ale/version.hpp.in") as f:
                version = f.read().decode()
        major, minor, patch = ALE_PY_VERSION.split(".")
        for key, value in (("ALE_VERSION", ALE_PY_VERSION), ("ALE_VERSION_MAJOR", major),
                           ("ALE_VERSION_MINOR", minor), ("ALE_VERSION_PATCH", patch),
                           ("ALE_VERSION_GIT_SHA", "")):
            version = version.replace(f"@{key}@", value)
        with open(os.path.join(root, "ale", "version.hpp"), "w") as f:
            f.write(version)
        # preprocessed_env.hpp includes OpenCV for its .cpp; the class itself uses no OpenCV type.
        os.makedirs(os.path.join(root, "opencv2"), exist_ok=True)
        with open(os.path.join(root, "opencv2", "opencv.hpp"), "w") as f:
            f.write("// empty: the declarations gmi-drl compiles against use no OpenCV type\n")
        open(done, "w").close()
        return root
    except Exception as e:  # no network, a changed index: Atari runs on ale-py's vector env
        print(f"gmi-drl: not building the Atari core: ale-py {ALE_PY_VERSION} headers "
              f"unavailable ({e!r})", file=sys.stderr)
        return None


def _atari_core() -> list:
    include = _ale_include_dir()
    if include is None:
        return []
    # csrc/atari_core.cpp's GMI_ALE_SYMBOLS: every ale-py function it calls, each redirected to
    # the core's own forwarder (bound at run time through a local dlopen handle)
    with open(os.path.join(_HERE, "csrc", "atari_core.cpp")) as f:
        symbols = re.findall(r"^\s*X\(\w+, (_Z\w+),", f.read(), re.M)
    return [Pybind11Extension(
        "gmi_drl.envs._atari_core",
        ["csrc/atari_core.cpp"],
        depends=["csrc/py_buffers.h", "csrc/work_queue.h"],
        include_dirs=[include, os.path.join(include, "ale")],
        define_macros=[("GMI_ALE_PY_VERSION", f'"{ALE_PY_VERSION}"')],
        # Not linked against ale-py: calls go through pointers bound to the loaded module
        extra_link_args=[f"-Wl,--wrap={s}" for s in symbols] + ["-ldl"],
        extra_compile_args=["-O3"],
        cxx_std=17,
        optional=True,
    )]


def _xla_ffi() -> list:
    """`gmi_drl.envs._xla_ffi`, where jax (its FFI headers) is importable; else none (reason
    printed, and `EnvPool.xla()` says how to build it)."""
    try:
        import jax.ffi
        include = jax.ffi.include_dir()
    except Exception as e:  # the optional `jax` extra is not installed (or too old for jax.ffi)
        print(f"gmi-drl: not building gmi_drl.envs._xla_ffi (pool.xla()): jax's FFI headers are "
              f"unavailable ({e!r}); install the jax extra, then `python setup.py build_ext "
              "--inplace`", file=sys.stderr)
        return []
    # -isystem: no warnings from jax's headers
    return [Pybind11Extension("gmi_drl.envs._xla_ffi", ["csrc/xla_ffi.cpp"],
                              extra_compile_args=["-O3", "-isystem", include], cxx_std=17,
                              optional=True)]


_TEMPLATE = ["csrc/env_template.h", "csrc/episodes.h", "csrc/py_buffers.h", "csrc/work_queue.h"]


def template_env(name: str, sources: list[str], **kwargs) -> Pybind11Extension:
    """The extension ``name`` of envs written against ``csrc/env_template.h`` (optional, as
    the other cores; docs/add-a-cpp-env.md)."""
    return Pybind11Extension(name, sources, depends=_TEMPLATE + kwargs.pop("depends", []),
                             include_dirs=["csrc"], extra_compile_args=_FLAGS, cxx_std=17,
                             optional=True, **kwargs)


setup(
    ext_modules=[
        template_env("gmi_drl.envs._cpp_examples", ["csrc/examples/cpp_examples.cpp"],
                     depends=["csrc/examples/pendulum.h", "csrc/examples/faults.h"]),
        Pybind11Extension("gmi_drl.envs._cartpole_pool", ["csrc/cartpole_pool.cpp"],
                          depends=["csrc/episodes.h"],
                          extra_compile_args=_FLAGS, cxx_std=17, optional=True),
        Pybind11Extension(
            "gmi_drl.envs._mujoco_core",
            ["csrc/mujoco_core.cpp"],
            depends=["csrc/episodes.h", "csrc/py_buffers.h", "csrc/work_queue.h"],
            include_dirs=[os.path.join(_MUJOCO_DIR, "include")],
            library_dirs=[_MUJOCO_DIR],
            # `import mujoco` has loaded this soname before the core is imported
            extra_link_args=[f"-l:{_LIB}", f"-Wl,-rpath,{_MUJOCO_DIR}"],
            extra_compile_args=_FLAGS,
            cxx_std=17,
            optional=True,
        ),
        *_atari_core(),
        *_xla_ffi(),
        Pybind11Extension("gmi_drl.comm.switch._plane", ["csrc/switch_plane.cpp"],
                          extra_compile_args=["-O3"], cxx_std=17, optional=True),
    ],
    cmdclass={"build_ext": build_ext},
)
