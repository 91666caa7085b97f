# make test  - create or reuse .venv, install, run the whole test suite
# make demo  - create or reuse .venv, install, run the whole loop on this machine and print a summary
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-test.txt 2>/dev/null | sha1sum | cut -c1-12)
export PYTHONPATH := $(CURDIR)
export RAY_TRAIN_V2_ENABLED := 1
export RAY_USAGE_STATS_ENABLED := 0
export PYTHONWARNINGS := ignore::FutureWarning,ignore::DeprecationWarning

.PHONY: venv test test-unit demo bench clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-test.txt
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# the CPU build first: a bare `torch` requirement would pull several GB of CUDA wheels
	$(VENV)/bin/pip install -q torch==2.13.0+cpu
	$(VENV)/bin/pip install -q -r requirements.txt -r requirements-test.txt
	$(VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	$(VENV)/bin/python -c "import torch, vllm, ray, transformers; print('venv ok: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__)"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

test: venv
	$(VENV)/bin/python -m pytest -q tests

test-unit: venv
	$(VENV)/bin/python -m pytest -q tests/unit

demo: venv
	$(VENV)/bin/python -m tasks demo

bench: venv
	$(VENV)/bin/python bench/rl_step.py --quick
	$(VENV)/bin/python bench/signals.py --quick

clean:
	rm -rf runs .pytest_cache
