# Quickstart: `make demo` and `make test` each set up the virtual environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
# On CPU machines take the CPU build of torch; an already-installed torch is kept.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.gnnfuse-installed

.PHONY: setup demo test bench-cpu clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if python3 -c "import torch" 2>/dev/null; then \
	    echo "reusing the torch of $$(command -v python3)"; python3 -m venv --system-site-packages $(VENV); \
	  else python3 -m venv $(VENV); fi; \
	fi
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

demo: setup
	$(PY) examples/train.py --model gcn --dataset Cora --device cpu --epochs 200

test: setup
	$(PY) -m pytest -q

bench-cpu: setup
	$(PY) -m benchmarks --suite cpu

clean:
	rm -rf $(VENV) build *.egg-info
