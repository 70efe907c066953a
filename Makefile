VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint demo calibrate clean system-deps

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

system-deps:
	./scripts/system-deps.sh

test: lint system-deps
	$(VENV)/bin/pytest -q

demo: $(STAMP)
	$(VENV)/bin/specrouter demo

calibrate: $(STAMP)
	$(PY) -m loadtests.calibrate

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
