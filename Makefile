# make test  - create or reuse .venv, install (and Debian's chromium for the browser test), run the whole test suite
# make demo  - create or reuse .venv, install, run the whole loop through Airflow on this machine, print a summary
# make lint  - ruff (lint and format check) and mypy on tasks/: what `make test` runs first
# make format - ruff's fixes and formatter over the tree
# make up    - start the local stack (Airflow UI 127.0.0.1:8080, MLflow 127.0.0.1:5000) and keep it running
# make up STACK=prod - the same on Postgres, Celery (Redis broker, two workers) and an S3 run dir (moto)
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-test.txt 2>/dev/null | sha1sum | cut -c1-12)
export PYTHONPATH := $(CURDIR)
export RAY_TRAIN_V2_ENABLED := 1
export RAY_USAGE_STATS_ENABLED := 0
export PYTHONWARNINGS := ignore::FutureWarning,ignore::DeprecationWarning

.PHONY: venv chromium redis lint format test test-unit demo demo-cli serve up down bench clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-test.txt
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	# uv with pip's package sources and resolution (pip itself if uv fails): about 15 s instead of 3 min.
	# The CPU torch is pinned by its local version: a bare `torch` would pull several GB of CUDA wheels.
	$(VENV)/bin/python scripts/venv_install.py torch==2.13.0+cpu -r requirements.txt -r requirements-test.txt
	$(VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	$(VENV)/bin/python -c "import torch, vllm, ray, transformers; print('venv ok: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__)"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# the production-shaped stack's Celery broker (make up STACK=prod and its e2e tests)
redis:
	@command -v redis-server >/dev/null || { echo "installing Debian redis-server for the prod stack"; \
	  (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) || \
	  { echo "could not install redis-server: run 'apt-get install redis-server' as root"; exit 1; }; }

# the browser test drives Debian's Chromium through Playwright (never a downloaded browser)
chromium:
	@test -x /usr/bin/chromium || { echo "installing Debian chromium for the browser test"; \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) || \
	  { echo "could not install chromium: run 'apt-get install chromium chromium-driver' as root"; exit 1; }; }

# seconds: the checks fail fast, before the half hour of tests (config: pyproject.toml [tool.ruff], [tool.mypy])
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: venv lint chromium redis
	$(VENV)/bin/python -m pytest -q --durations=30 tests

test-unit: venv
	$(VENV)/bin/python -m pytest -q tests/unit

demo: venv
	$(VENV)/bin/python scripts/demo.py

# the same stage functions in one process, without Airflow (tasks/stages/demo.py)
demo-cli: venv
	$(VENV)/bin/python -m tasks demo

# the registry's champion behind vLLM's OpenAI-compatible server on 127.0.0.1 (PORT=8000), tool parser on
serve: venv
	$(VENV)/bin/python -m tasks serve --port $(or $(PORT),8000)

up: venv $(if $(filter prod,$(STACK)),redis)
	$(VENV)/bin/python scripts/stack.py up --kind $(or $(STACK),local)

down:
	$(VENV)/bin/python scripts/stack.py down

bench: venv
	# TRL for the peer comparison, pinned apart from the project's requirements (it adds only itself and datasets)
	$(VENV)/bin/python scripts/venv_install.py -r bench/requirements-peers.txt -c requirements.txt -c requirements-test.txt
	$(VENV)/bin/python bench/rl_step.py --quick
	$(VENV)/bin/python bench/signals.py --quick
	$(VENV)/bin/python bench/peers.py

clean:
	rm -rf runs .stack .pytest_cache
