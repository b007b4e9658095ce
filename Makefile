# make test: create or reuse .venv, install what is missing, run the test suite on CPU.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specar-installed

.PHONY: test demo bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch only when none is importable: the CPU wheel pinned for our machines.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

# --rootdir=tests: the repository root is itself a package (specar); pytest would import its
# __init__.py under the checkout folder's name, which fails for names like "ci-clone"
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q --rootdir=tests

# the main job: images from the embedded demo model, AR vs the fastest lossless backend, in output/
demo: $(STAMP)
	$(PY) -m specar demo --out output

# all backends side by side on the demo model, one run (2 threads, as docs/BENCHMARKS.md)
bench: $(STAMP)
	mkdir -p output
	$(PY) -m specar bench --threads 2 --json output/bench.json

clean:
	rm -rf $(VENV)
