# Every target creates .venv itself: on a fresh machine `make test` (or `make run`) is all it takes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --constraint constraints.txt

.PHONY: run test test-long lint proto lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamp files re-run the install when the dependencies change.
$(VENV)/.run: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) --editable .
	touch $@

# The development install: editable, plus the package tree that type checkers and IDEs read (dev/link_tree.py).
$(VENV)/.dev: $(BIN)/python pyproject.toml constraints.txt dev/link_tree.py
	$(PIP) --editable '.[dev,pettingzoo,atari,minigrid]'
	$(BIN)/python dev/link_tree.py $(VENV)
	touch $@

# The main job: learner + inference server + env clients on this machine, until CartPole is solved.
run: $(VENV)/.run
	$(BIN)/rlgate up --env CartPole-v1

# First the system packages some tests need (.ci/system-packages: chromium, promtool, node, npm), where this
# user may install them; without them those tests skip, saying why.
# The tests run on one worker more than there are cores, at most 4 (pytest-xdist; tests/conftest.py says why):
# they are independent (ports 0, their own folders), and many wait on processes starting rather than on the CPU.
# Two at a time, the slow ones first (tests/conftest.py): xdist's default hands each worker up to a quarter of the
# suite at once, and one worker then sat idle for minutes while the other worked through its queue of
# multi-process tests.
# compileall first: where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), no process writes the
# bytecode of rlgate's own modules, and each of the suite's ~500 processes compiled them again (up to ~1 CPU-s
# each). It never stops the run (`-`): a file that does not compile is the tests' to report.
test:
	@.ci/system-packages
	@$(MAKE) --no-print-directory $(VENV)/.dev
	@-$(BIN)/python -m compileall -q $(VENV)/rlgate-tree/rlgate $(VENV)/rlgate-tree/rlgate/*/ tests
	$(BIN)/pytest --numprocesses auto --maxschedchunk 2

# The full-size acceptance runs the suite leaves out (marked long): 256 streams x 60 s, 10,000 fuzzed messages.
test-long: $(VENV)/.dev
	$(BIN)/pytest -m long

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Regenerate the committed stubs from proto/rlgate/v1/*.proto (tests/core/test_proto_drift.py fails when they differ).
proto: $(VENV)/.dev
	$(BIN)/python -m grpc_tools.protoc -Iproto \
		--plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc \
		--python_out=proto --grpc_python_out=proto --mypy_out=proto --mypy_grpc_out=proto \
		proto/rlgate/v1/*.proto

# The image's dependency locks: every package pinned with its hashes, for the image's Python (3.11) on x86_64
# Linux. requirements/cpu.txt takes CPU torch from PyTorch's CPU index (TORCH_CPU_FROM="--find-links DIR" takes
# it from a folder holding its wheel instead); requirements/cuda.txt takes PyPI's torch, built with CUDA.
# tests/deploy/test_lock.py fails when pyproject.toml's dependencies or constraints.txt's pins leave them behind.
TORCH_CPU_FROM ?= --extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match
LOCK := $(BIN)/uv pip compile pyproject.toml --constraint constraints.txt --generate-hashes --quiet \
	--python-version 3.11 --python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock"

lock: $(VENV)/.dev
	$(LOCK) $(TORCH_CPU_FROM) --output-file requirements/cpu.txt
	$(LOCK) --output-file requirements/cuda.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
