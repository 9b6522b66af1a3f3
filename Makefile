# The set-up commands of the README: `make demo`, `make test` and `make test-all`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# pip's torch build for this platform: on Linux from PyPI the CUDA one (several GB). For the
# CPU-only wheel: make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH  := torch==2.13.0
TORCH_INDEX ?=
# the optional dependencies the tests use (`make demo` needs none of them)
TEST_EXTRAS := dev bench ray gpu dm jax
# test processes (pytest-xdist): three keep two cores busy while tests wait on processes,
# sockets and timers; the tests that share the Ray cluster run in one of them
PYTEST := $(PY) -m pytest -q -n 3 --dist loadgroup --durations=10

.PHONY: demo test test-all clean

# gmi-drl (its C++ cores built) and torch: all that `make demo` needs
$(VENV)/.core: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -e .   # (setuptools warns of editable installs)
	touch $@

# the test extras' requirements, read from pyproject.toml (pip install -e ".[extras]" would
# build the C++ cores a second time); then, with the build requirements, the in-place build of
# what needs a test extra at build time: gmi_drl.envs._xla_ffi (jax's FFI headers; the cores
# built by `pip install -e .` are up to date and not rebuilt)
$(VENV)/.installed: $(VENV)/.core
	$(PY) -c 'import tomllib; t = tomllib.load(open("pyproject.toml", "rb")); extras = t["project"]["optional-dependencies"]; print("\n".join([*t["build-system"]["requires"], *(r for e in "$(TEST_EXTRAS)".split() for r in extras[e])]))' > $(VENV)/test-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/test-requirements.txt
	PYTHONWARNINGS=ignore $(PY) setup.py -q build_ext --inplace
	touch $@

DEMO_DIR := runs/demo-$(shell date +%Y%m%d-%H%M%S)

demo: $(VENV)/.core
	$(VENV)/bin/gmi-drl train ppo --env.task-id Hopper-v5 --preset demo --run-dir $(DEMO_DIR)
	@echo; cat $(DEMO_DIR)/summary.md

# every test but those marked slow (pyproject.toml's markers)
test: $(VENV)/.installed
	$(PYTEST) -x -m "not slow"

# every test: what CI runs (.ci/run)
test-all: $(VENV)/.installed
	$(PYTEST)

clean:
	rm -rf $(VENV) runs build *.egg-info
