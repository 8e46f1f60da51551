# `make test` and `make bench` each do all the set-up on a fresh Debian/Ubuntu machine:
# create .venv, install tfx_vec with its extras, install PoCL (OpenCL on the CPU) when run as
# root with apt, then run.  Re-running skips what is already done.
#
# On an idle 2-core machine `make test` (what CI runs, through .ci/run) takes about 30 minutes,
# the install included (most of it the NUTS and multi-worker tests), and `make bench` about 15;
# up to twice that on a busy machine.  `make bench` runs every
# benchmark at small sizes and writes benchmarks/results/quick/; full-size runs are
# `python -m benchmarks NAME`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tfx_vec-installed
PYTEST_ARGS ?=

.PHONY: test bench system-deps clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

# Debian's PoCL runs OpenCL kernels (work-groups, local memory, barriers) on the CPU.
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  if ! dpkg -s pocl-opencl-icd ocl-icd-libopencl1 >/dev/null 2>&1; then \
	    (apt-get update -qq || true) && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pocl-opencl-icd ocl-icd-libopencl1 clinfo >/dev/null; \
	  fi; \
	else echo "system-deps: not root with apt; install pocl-opencl-icd yourself for the OpenCL tests"; fi

$(STAMP): setup.py | $(PY)
	$(PY) -m pip install --quiet -e ".[test,bench,opencl]"
	touch $@

test: system-deps $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 tests $(PYTEST_ARGS)

bench: system-deps $(STAMP)
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) build *.egg-info
