# make test: create or reuse .venv, install what is missing, run the test suite on CPU.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specar-installed

.PHONY: test test-long test-floor test-installed test-comfyui test-ui demo bench gpu-check venv clean

venv: $(STAMP)

# torch, installed only when a venv has none, by one installer for every target (tooling/install_torch.py): on
# Linux without an NVIDIA GPU PyTorch's CPU build (about 200 MB), else pip's configured index (PyPI: the CUDA build on
# Linux, about 2.5 GB with its NVIDIA libraries); TORCH_CUDA=1 / TORCH_INDEX=<url> choose for it (TORCH_CPU=1: the
# CPU build anywhere). INSTALL_TORCH python: that python's torch.
TORCH       ?= torch==2.13.0
TORCH_CPU   ?=
TORCH_CUDA  ?=
TORCH_INDEX ?= $(if $(TORCH_CPU),https://download.pytorch.org/whl/cpu,)
INSTALL_TORCH := TORCH_INDEX="$(TORCH_INDEX)" TORCH_CUDA="$(TORCH_CUDA)" $(PY) tooling/install_torch.py

$(STAMP): pyproject.toml requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(INSTALL_TORCH) $(PY) "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,glm-image]"  # glm-image: diffusers, so the tests decode GLM-Image through its DiT
	touch $(STAMP)

# --rootdir=tests: the repository root is itself a package (specar); pytest would import its
# __init__.py under the checkout folder's name, which fails for names like "ci-clone"
# the cases marked `long` (high-power statistical cases, slow runs: pyproject.toml's markers) wait for test-long.
# TEST_WORKERS pytest-xdist processes (default: one per core, at most 4), one thread each; whole files per worker
# (--dist loadfile: a file's module fixtures, e.g. a shared compiled model, stay in one process). torch.compile's
# kernels go to a folder in the venv, so a second run of this checkout compiles nothing (TORCHINDUCTOR_CACHE_DIR
# set by the caller wins).
# test-long: the same workers, whole files each. One process with two threads kept one core mostly idle (load 1.1 over
# a fresh run's test-long, 2026-12-07): its models are small, their products do not use both threads.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST := TORCHINDUCTOR_CACHE_DIR=$${TORCHINDUCTOR_CACHE_DIR:-$(abspath $(VENV))/torchinductor} $(PY) -m pytest -q --rootdir=tests
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "not long"

test-long: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m long --durations=25

# tests/ against the wheel instead of the checkout (the tests import `specar` and their support package `support`,
# nothing else of the checkout; the tests of the checkout's own files skip): the wheel unpacked into .venv-build/,
# tests/ copied beside it, pytest run there with the unpacked wheel first on the path. INSTALLED_TESTS: what pytest
# runs there (default the copy, suite; e.g. suite/test_api.py)
INSTALLED := .venv-build/installed
INSTALLED_TESTS ?= suite
test-installed: $(STAMP)
	rm -rf $(INSTALLED) && $(PY) -m pip wheel . --no-deps --no-build-isolation -q -w $(INSTALLED)/wheel
	$(PY) -m zipfile -e $(INSTALLED)/wheel/*.whl $(INSTALLED)/site && cp -r tests $(INSTALLED)/suite
	cd $(INSTALLED) && PYTHONPATH=$(abspath $(INSTALLED))/site OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(abspath $(PY)) \
		-m pytest -q -p no:cacheprovider --import-mode=importlib --rootdir=suite -n $(TEST_WORKERS) --dist loadfile \
		-m "not long" $(INSTALLED_TESTS)

# the pack in a real ComfyUI server (tests/comfyui/): COMFYUI_DIR, a folder made by ../shared/comfyui/setup.sh, or
# COMFYUI_VERSION (0.3.64, 0.33.0; FRONTEND=<version>: that comfyui-frontend-package instead of the release's:
# setup.sh makes output/comfyui-<version>[-frontend-<version>]); skipped with one line without either. -s: the tests
# print what they measured (speed-ups over AR through the server, import time, memory)
test-comfyui: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q -rs -s --rootdir=tests tests/comfyui

# the main job: images from the embedded demo model, AR vs the default backend, in output/. Its own install (make
# bench's too): torch (INSTALL_TORCH) and the package without extras (no pytest, no diffusers), pip's progress shown
DEMO_STAMP := $(VENV)/.specar-demo-installed
$(DEMO_STAMP): pyproject.toml requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(INSTALL_TORCH) $(PY) "$(TORCH)"
	@echo "Installing specar and what it needs (transformers, accelerate, safetensors, numpy, pillow, pyyaml)"
	$(PY) -m pip install --progress-bar on -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m specar demo --out output

# all backends side by side on the demo model, one run (threads: the cores other processes leave free; BENCH_ARGS:
# more options, e.g. --threads 2 as docs/BENCHMARKS.md)
BENCH_ARGS ?=
bench: $(DEMO_STAMP)
	mkdir -p output
	$(PY) -m specar bench --json output/bench.json $(BENCH_ARGS)

# the CUDA path in one command (docs/BENCHMARKS.md "GPU check"; the maintainers' tooling, `python -m specar.tooling`):
# needs a Python whose torch sees the GPU, GPU_PY (default: the venv's, else python3); specar is imported from this
# checkout through a link in a temporary folder, so nothing is installed. GPU_CHECK_ARGS: more options (e.g.
# --dry-run on a machine without a GPU, --plan-only for the plan and its predicted seconds).
GPU_PY ?= $(shell test -x $(PY) && echo $(PY) || echo $(PYTHON))
GPU_CHECK_OUT ?= output/gpu-check
GPU_CHECK_ARGS ?=
gpu-check:
	d=$$(mktemp -d) && ln -s "$(CURDIR)" "$$d/specar" && \
	PYTHONPATH="$$d$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) -m specar.tooling gpu-check --out "$(GPU_CHECK_OUT)" $(GPU_CHECK_ARGS); \
	rc=$$?; rm -f "$$d/specar"; rmdir "$$d"; exit $$rc

clean:
	rm -rf $(VENV) .venv-build

# the family loaders on the oldest transformers we support (hf_files.TRANSFORMERS_FLOOR): its own venv,
# the tiny Janus-Pro / Emu3 / Chameleon folders in the released checkpoints' format, their loader tests
FLOOR_TRANSFORMERS ?= 4.56.2
FLOOR_VENV ?= .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
test-floor: $(STAMP)
	test -x $(FLOOR_PY) || $(PYTHON) -m venv $(FLOOR_VENV)
	$(INSTALL_TORCH) $(FLOOR_PY) "$(TORCH)"
	$(FLOOR_PY) -m pip install -q -e ".[test]" "transformers==$(FLOOR_TRANSFORMERS)" protobuf sentencepiece
	rm -rf output/floor-models && OMP_NUM_THREADS=1 $(PY) tests/support/floor_models.py output/floor-models
	SPECAR_FLOOR_MODELS=$(CURDIR)/output/floor-models OMP_NUM_THREADS=1 $(FLOOR_PY) -m pytest -q --rootdir=tests \
		tests/test_transformers_floor.py

# the browser check (tooling/ui_check.js): in each ComfyUI given (COMFYUI_DIR_0364, COMFYUI_DIR_0330, COMFYUI_DIR:
# folders with this pack in custom_nodes/, e.g. made by ../shared/comfyui/setup.sh, FRONTEND=<version> for another web
# frontend; COMFYUI_PYTHONPATH: its stubs/; .ci/run gives all three it tests in COMFYUI_DIR)
# both example workflows from the template browser, run in headless Chromium (playwright-core on NODE_PATH);
# screenshots in output/ui-<folder>/; UI_FIGURES=docs/figures also writes the docs' figures (the last folder's)
UI_PORT ?= 8210
UI_FIGURES ?=
test-ui:
	@dirs="$(strip $(COMFYUI_DIR_0364) $(COMFYUI_DIR_0330) $(COMFYUI_DIR))"; port=$(UI_PORT); rc=0; \
	[ -n "$$dirs" ] || { echo "test-ui skipped: set COMFYUI_DIR (or COMFYUI_DIR_0364, COMFYUI_DIR_0330) to a ComfyUI"; exit 0; }; \
	for d in $$dirs; do PYTHONPATH="$(COMFYUI_PYTHONPATH)" node tooling/ui_check.js "$$d" $$port \
	  "output/ui-$$(basename $$d)" $(if $(UI_FIGURES),--figures $(UI_FIGURES)) || rc=1; port=$$((port + 1)); done; exit $$rc
