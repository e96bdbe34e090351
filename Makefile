# gpumem: the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TRACE_STAMP := $(VENV)/.installed-trace
# the peers' scratch environments (make peers), read by validate and bench
PEERS_VENV ?= /tmp/peers-venv
GT_VENV    ?= /tmp/gt-venv
PEER_ENV   := GPUMEM_PEERS_VENV=$(PEERS_VENV) GPUMEM_GT_VENV=$(GT_VENV)

.PHONY: install install-trace run test lint contracts pytest clean validate bench peers readme trace-check trace-references fuzz

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# the tests also run trace mode in-process: torch (the CPU wheel on disk), transformers and peft
$(TRACE_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,trace]'
	touch $(TRACE_STAMP)

install-trace: $(TRACE_STAMP)

run: install
	$(VENV)/bin/gpumem-gui

lint: install
	$(VENV)/bin/ruff check gpumem_gui tests benchmarks validation packaging
	$(VENV)/bin/ruff format --check gpumem_gui tests benchmarks validation packaging

contracts: install
	$(VENV)/bin/lint-imports

pytest: install-trace prometheus
	GPUMEM_REQUIRE_TRACE=1 QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

test: lint contracts pytest

# the fuzz suite at length: tests/test_fuzz_*.py with 40x the examples `make test` runs, random instead of
# derandomized, failures kept in .hypothesis/ and replayed first (tests/fuzz_strategies.py)
fuzz: install
	GPUMEM_FUZZ=long QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q tests/test_fuzz_*.py

# the cluster tests run the real Prometheus (tests/prometheus_harness.py): the Debian package, 2.42 in bookworm
.PHONY: prometheus
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  apt_install='apt-get install -y prometheus || { apt-get update && apt-get install -y prometheus; }'; \
	  if [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive sh -c "$$apt_install"; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
	    sudo -n env DEBIAN_FRONTEND=noninteractive sh -c "$$apt_install"; \
	  else echo "make prometheus: the tests need the prometheus binary; install it with" \
	    "'sudo apt-get install -y prometheus' (Debian/Ubuntu package prometheus)" >&2; exit 1; fi; }

validate: install
	$(PEER_ENV) $(PY) validation/validate.py --out docs/validation.md

# the README's table of run flags, generated from the run models' field declarations
readme: install
	$(PY) -c "from gpumem_gui.cli.flags import update_readme; update_readme('README.md')"

# trace mode against every reference measurement point (tests/reference/trace/groundtruth_check.json), and the
# traced reference points the accuracy tests use (tests/reference/trace/{inference,train}.json)
trace-check: install-trace
	$(PY) validation/trace_groundtruth.py

trace-references: install-trace
	$(PY) validation/trace_references.py --python $(PY)

# docs/performance.md and the README's speed block, all measured in one run (~15 min; benchmarks/README.md)
bench: install
	$(PEER_ENV) $(PY) benchmarks/report.py --out docs/performance.md --readme README.md

# scratch environments for the peers that validate.py and report.py compare against (needs PyPI):
# llm-analysis, and accelerate + transformers on the CPU build of torch
peers:
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet 'llm-analysis==0.2.2'
	test -x $(GT_VENV)/bin/python || $(PYTHON) -m venv $(GT_VENV)
	$(GT_VENV)/bin/python -m pip install --quiet 'torch==2.13.0' 'transformers==5.24.0' 'accelerate==1.15.0' 'peft==0.21.2' safetensors

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache .hypothesis

# ---- packaging/: the installable Linux binary (README "Installable binary") ----------------------------
.PHONY: package package-test

# dist/gpumem-<version>-linux-x86_64.tar.gz and dist/gpumem_<version>_amd64.deb, from a clean build venv
package:
	PYTHON=$(PYTHON) bash packaging/build.sh

# build, then unpack the archive into an empty folder and smoke-test it against the source install
package-test: package install
	$(PY) packaging/smoke_test.py
	$(PY) benchmarks/bench_frozen_start.py --runs 5
