# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# CPU wheel where no NVIDIA driver is present; the default (CUDA) build otherwise.
TORCH  := torch==2.13.0

.PHONY: demo test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
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
