# make test: create or reuse .venv, install what is missing, run the test suite on CPU.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specar-installed

.PHONY: test test-long test-floor demo bench gpu-check venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch only when none is importable: the CPU wheel pinned for our machines.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

# --rootdir=tests: the repository root is itself a package (specar); pytest would import its
# __init__.py under the checkout folder's name, which fails for names like "ci-clone"
# the cases marked `long` (high-power statistical cases, slow runs: pyproject.toml's markers) wait for test-long
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q --rootdir=tests -m "not long"

test-long: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q --rootdir=tests -m long

# the main job: images from the embedded demo model, AR vs the default backend, in output/
demo: $(STAMP)
	$(PY) -m specar demo --out output

# all backends side by side on the demo model, one run (2 threads, as docs/BENCHMARKS.md)
bench: $(STAMP)
	mkdir -p output
	$(PY) -m specar bench --threads 2 --json output/bench.json

# the CUDA path in one command (docs/BENCHMARKS.md "GPU check"): needs a Python whose torch sees the GPU, GPU_PY
# (default: the venv's, else python3); specar is imported from this checkout through a link in a temporary folder,
# so nothing is installed. GPU_CHECK_ARGS: more options (e.g. --dry-run on a machine without a GPU).
GPU_PY ?= $(shell test -x $(PY) && echo $(PY) || echo $(PYTHON))
GPU_CHECK_OUT ?= output/gpu-check
GPU_CHECK_ARGS ?=
gpu-check:
	d=$$(mktemp -d) && ln -s "$(CURDIR)" "$$d/specar" && \
	PYTHONPATH="$$d$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) -m specar gpu-check --out "$(GPU_CHECK_OUT)" $(GPU_CHECK_ARGS); \
	rc=$$?; rm -f "$$d/specar"; rmdir "$$d"; exit $$rc

clean:
	rm -rf $(VENV)

# the family loaders on the oldest transformers we support (hf_files.TRANSFORMERS_FLOOR): its own venv,
# the tiny Janus-Pro / Emu3 / Chameleon folders in the released checkpoints' format, their loader tests
FLOOR_TRANSFORMERS ?= 4.56.2
FLOOR_VENV ?= .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
test-floor: $(STAMP)
	test -x $(FLOOR_PY) || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -c "import torch" 2>/dev/null || $(FLOOR_PY) -m pip install -q torch==2.13.0
	$(FLOOR_PY) -m pip install -q -e ".[test]" "transformers==$(FLOOR_TRANSFORMERS)" protobuf sentencepiece
	rm -rf output/floor-models && OMP_NUM_THREADS=1 $(PY) devtools/floor_models.py output/floor-models
	SPECAR_FLOOR_MODELS=$(CURDIR)/output/floor-models OMP_NUM_THREADS=1 $(FLOOR_PY) -m pytest -q --rootdir=tests \
		tests/test_transformers_floor.py
