# Two entry points: `make demo` (install + the main job) and `make test` (install + lint + tests, both tiers);
# `make test-fast` runs the tests not marked slow (no whole training runs), for the inner loop.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.14.1 torchvision==0.29.1
# pytest-xdist processes for `make test` (tests/conftest.py gives each one torch thread); 0: one process
TEST_WORKERS ?= 2

.PHONY: install demo test test-fast lint format bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: install
	$(VENV)/bin/vitlab train

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

test: lint
	$(PY) -m pytest -n $(TEST_WORKERS)

test-fast: install
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow"

format: install
	$(VENV)/bin/ruff check --fix src tests benchmarks
	$(VENV)/bin/ruff format src tests benchmarks

bench: install
	$(VENV)/bin/vitlab bench --model vit_s16 --vs timm

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist src/*.egg-info
