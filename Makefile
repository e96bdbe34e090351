# gpumem: the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test lint contracts pytest clean validate bench

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/gpumem-gui

lint: install
	$(VENV)/bin/ruff check gpumem_gui tests benchmarks validation packaging
	$(VENV)/bin/ruff format --check gpumem_gui tests benchmarks validation packaging

contracts: install
	$(VENV)/bin/lint-imports

pytest: install
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

test: lint contracts pytest

validate: install
	$(PY) validation/validate.py --out docs/validation.md

# core speed table (benchmarks/README.md); app timings: benchmarks/bench_ui.py, soak_poller.py
bench: install
	$(PY) benchmarks/bench_core.py --markdown

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
