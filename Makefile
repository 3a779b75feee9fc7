# Quickstart: `make demo` (a GCN trained on Cora, CPU) and `make test` each set up .venv first.
# `make demo` installs only what the demo needs (gnnfuse, PyG, tqdm; no Triton); `make test` adds
# the test tools and Triton (its kernels are tested on CPU under TRITON_INTERPRET=1).
VENV ?= .venv
PY := $(VENV)/bin/python
# On CPU machines take the CPU build of torch; an already-installed torch is kept.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup venv demo test docs typecheck package-check bench-cpu build-ext anchors clean

venv: $(VENV)/.torch

setup: $(VENV)/.installed-test,triton

$(VENV)/.torch:
	@if [ ! -x $(PY) ]; then \
	  if python3 -c "import torch" 2>/dev/null; then \
	    echo "reusing the torch of $$(command -v python3)"; python3 -m venv --system-site-packages $(VENV); \
	  else python3 -m venv $(VENV); fi; \
	fi
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	@touch $@

# One stamp per set of extras, redone when pyproject.toml changes.
$(VENV)/.installed-%: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e ".[$*]"
	@touch $@

demo: $(VENV)/.installed-examples
	$(PY) examples/train.py --model gcn --dataset Cora --device cpu --epochs 200

test: $(VENV)/.installed-test,triton
	$(PY) -m pytest -q

# API reference (pdoc) into docs/api; fails on any warning.
docs: $(VENV)/.installed-docs,pyg
	@rm -rf docs/api
	$(PY) -m pdoc -o docs/api gnnfuse gnnfuse.datasets gnnfuse.testing 2>&1 | tee $(VENV)/docs.log
	@! grep -i "warn" $(VENV)/docs.log
	@echo "API reference: docs/api/index.html"

typecheck: $(VENV)/.installed-dev
	$(PY) -m mypy --follow-imports=silent gnnfuse setup.py

# sdist + wheel, the wheel installed into a clean venv, a smoke test (also run by the slow tests).
package-check: $(VENV)/.installed-test,triton
	$(PY) -m pytest -q -m slow tests/test_packaging.py

# Compile the CPU kernels now instead of on first use.
build-ext: $(VENV)/.installed-examples
	$(PY) -m gnnfuse build

bench-cpu: $(VENV)/.installed-examples
	$(PY) -m benchmarks --suite cpu

# torch_scatter 2.1.2 as a benchmark anchor, built from source against this torch (no wheel for every
# torch; about 10 minutes on 2 cores) into .anchors/, outside the venv: installed there, stock PyG
# would switch to it and stop being the stock anchor. Use with PYTHONPATH=.:.anchors.
anchors: $(VENV)/.installed-test,triton
	MAX_JOBS=2 FORCE_ONLY_CPU=1 $(PY) -m pip install -q --no-deps --no-build-isolation --target .anchors torch-scatter==2.1.2

clean:
	rm -rf $(VENV) build dist *.egg-info docs/api .anchors
