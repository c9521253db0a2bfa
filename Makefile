# sparsegnn developer commands.  `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU machines get the CPU build of PyTorch; set TORCH_SPEC (e.g. TORCH_SPEC=torch) for a CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test test-slow test-all docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,chem,parallel]" || { \
	  $(PY) -m pip install -q -e ".[test]" && \
	  { $(PY) -m pip install -q -e ".[chem]" || echo "make: RDKit (extra [chem]) could not be installed; the RDKit tests will skip" >&2; } && \
	  { $(PY) -m pip install -q -e ".[parallel]" || echo "make: pytest-xdist (extra [parallel]) could not be installed; the tests run in one process" >&2; }; }
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m sparsegnn info
	$(PY) -m sparsegnn train --dataset cora --model gcn

# Two test processes where pytest-xdist installed and the machine has two cores or more.
XDIST = $$($(PY) -c "import os, xdist; print('-n 2' if (os.cpu_count() or 1) > 1 else '')" 2>/dev/null)

# The suite without the long runs (marked slow): a few minutes on two cores.
test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" $(XDIST)

# The long runs: interpreter sweeps over every tuner config, training to accuracy, several processes.
test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow $(XDIST)

test-all: test test-slow

# The documentation, built strictly (any warning fails) into site/; the docs extra installs on first use.
$(VENV)/.docs-installed: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info site
