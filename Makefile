# gpumem: the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test lint contracts pytest clean validate

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
	$(VENV)/bin/ruff check gpumem_gui tests benchmarks
	$(VENV)/bin/ruff format --check gpumem_gui tests benchmarks

contracts: install
	$(VENV)/bin/lint-imports

pytest: install
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

test: lint contracts pytest

validate: install
	$(PY) validation/validate.py --out docs/validation.md

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache .hypothesis
