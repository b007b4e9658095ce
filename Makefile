# make test: create or reuse .venv, install what is missing, run the test suite on CPU.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specar-installed

.PHONY: test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch only when none is importable: the CPU wheel pinned for our machines.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(PY) -m pytest -q

clean:
	rm -rf $(VENV)
