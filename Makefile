# tlt: the two set-up commands of the README are `make quickstart` and `make test`.
PYTHON ?= python
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install quickstart test test-slow lint

# torch first and pinned: an unpinned torch pulled in by another package would download a multi-GB CUDA build.
install:
	$(PYTHON) -m pip install --quiet torch==2.13.0
	$(PYTHON) -m pip install --quiet -e ".[dev,eval]"

quickstart: install
	tlt train configs/quickstart.yaml

test: install
	$(PYTHON) -m pytest -q

test-slow: install
	$(PYTHON) -m pytest -q -m slow

lint:
	ruff check tlt eval tests && ruff format --check tlt eval tests
