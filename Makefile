# sparsegnn developer commands.  `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU machines get the CPU build of PyTorch; set TORCH_SPEC (e.g. TORCH_SPEC=torch) for a CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q -e ".[chem]" || echo "make: RDKit (extra [chem]) could not be installed; the RDKit tests will skip" >&2
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m sparsegnn info
	$(PY) -m sparsegnn train --dataset cora --model gcn

test: $(VENV)/.installed
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
