# Two commands do all set-up on a fresh machine:
#   make demo   train a small Keras CNN from an image folder fed by prefetch
#   make test   lint, type-check, build the docs strictly and run the test suite
# Both create .venv and install what they need into it. `make docs` builds the documentation
# site (the guides and the API reference generated from docstrings) into site/.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: demo test docs clean

$(VENV)/.installed: pyproject.toml setup.py prefetch/_jpegwindow.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[tf,torch,test,fast,docs,remote,plot]"
	touch $@

demo: $(VENV)/.installed
	$(PY) demos/train_keras.py $(ARGS)

test: $(VENV)/.installed
	$(PY) -m ruff check prefetch tests demos benchmarks
	$(PY) -m ruff format --check prefetch tests demos benchmarks
	$(PY) -m mypy
	$(PY) -m mkdocs build --strict --quiet
	$(PY) -m pytest $(ARGS)

docs: $(VENV)/.installed
	$(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
