# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# pip's torch build for this platform: on Linux from PyPI the CUDA one (several GB). For the
# CPU-only wheel: make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH  := torch==2.13.0
TORCH_INDEX ?=

.PHONY: demo test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[dev,bench,ray,gpu]"
	touch $@

DEMO_DIR := runs/demo-$(shell date +%Y%m%d-%H%M%S)

demo: $(VENV)/.installed
	$(VENV)/bin/gmi-drl train ppo --env.task-id Hopper-v5 --preset demo --run-dir $(DEMO_DIR)
	@echo; cat $(DEMO_DIR)/summary.md

test: $(VENV)/.installed
	$(PY) -m pytest -q -x --durations=10

clean:
	rm -rf $(VENV) runs build *.egg-info
