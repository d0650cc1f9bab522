# Two entry points: `make demo` and `make test`. Both create (or reuse) .venv,
# installing torch==2.13.0 first so that nothing pulls a CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.seqrec-installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo serve-demo pretrained test lint typecheck unit clean docs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[text,serve,tune,dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/seqrec data fetch ml-100k
	$(VENV)/bin/seqrec data prepare ml-100k
	$(VENV)/bin/seqrec train --dataset ml-100k --config configs/ml-100k-sasrec.toml --out runs/demo-ml-100k-sasrec --overwrite
	$(VENV)/bin/seqrec recommend runs/demo-ml-100k-sasrec --user 1 -k 10 --exclude-seen

# The demo recipe with positions counted from the start, so that sessions keep a KV cache
# (benchmarks/positions.py compares it with the default); the run is reused once trained.
SERVE_RUN ?= runs/serve-demo-ml-100k-sasrec
PORT ?= 8000
serve-demo: setup
	$(VENV)/bin/seqrec data fetch ml-100k
	$(VENV)/bin/seqrec data prepare ml-100k
	test -f $(SERVE_RUN)/results.json || $(VENV)/bin/seqrec train --dataset ml-100k \
	  --config configs/ml-100k-sasrec.toml --set 'model.positions_from="start"' --out $(SERVE_RUN)
	$(VENV)/bin/seqrec serve $(SERVE_RUN) --port $(PORT) --catalogue-log $(SERVE_RUN)/catalogue.jsonl

# The pre-trained text model (configs/pretrain.toml: Amazon Games titles, the domain that transferred
# best to Scientific) from ../shared/data; Scientific stays out (a target). Weights stay local: the data's terms.
# A finished $(PRETRAINED) is kept (it takes a quarter of an hour or more, and its zero-shot runs live in it):
# `make pretrained OVERWRITE=1` trains it again.
SHARED_DATA ?= ../shared/data
PRETRAINED ?= runs/pretrained
pretrained: setup
	for d in amazon-games-2018; do \
	  $(VENV)/bin/seqrec data prepare $$d --source $(SHARED_DATA) || exit 1; done
	if [ "$(OVERWRITE)" != 1 ] && [ -f $(PRETRAINED)/results.json ]; then \
	  echo "$(PRETRAINED) is there (make pretrained OVERWRITE=1 trains it again)"; \
	else $(VENV)/bin/seqrec pretrain --config configs/pretrain.toml --out $(PRETRAINED) --overwrite; fi

# docs/cli.md and docs/api.md from the argument parser and the docstrings (tests/test_docs.py checks
# they are current); docs/results.md and the README's headline table come from `python benchmarks/report.py`
docs: setup
	$(PY) docs/gen_reference.py

lint: setup
	$(VENV)/bin/ruff check seqrec tests benchmarks docs

typecheck: setup
	$(VENV)/bin/mypy

# the test files spread over JOBS processes (pytest-xdist; a file's tests stay in one process, so its
# module fixtures are built once): most tests wait on imports, subprocesses and small models, not cores;
# the slowest 25 are listed at the end (where the suite's ten minutes go)
JOBS ?= 2
unit: setup
	$(PY) -m pytest -n $(JOBS) --dist loadfile --durations=25

test: lint typecheck unit

clean:
	rm -rf $(VENV) runs .mypy_cache .ruff_cache .pytest_cache
