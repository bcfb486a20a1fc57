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

# The editable install is a .pth with the checkout's path, so that a folder named `prefetch` in
# the current directory (the checkout itself, seen from its parent) cannot shadow the install the
# way it shadows setuptools' import hook (issue 28.10). setuptools writes that .pth by default
# for the flat layout pyproject.toml declares (`package-dir = {"" = "."}`), so no editable_mode
# is set here: `editable_mode=compat`, which did it before, "is transitional and will be
# removed" (issue 35.6). The flat layout stays (no src/ folder: decided in issue 26).
# The compiled window decoder's sources (their list is setup.py's JPEGWINDOW_SOURCES and _HEADERS).
JPEGWINDOW_FILES := $(wildcard prefetch/decode/_c/*.c prefetch/decode/_c/*.h)

$(VENV)/.installed: pyproject.toml setup.py $(JPEGWINDOW_FILES)
	@echo "Installing prefetch (editable) into $(VENV) with what the demo, the tests and the docs need:"
	@echo "TensorFlow and Keras, PyTorch (CPU), simplejpeg and OpenCV, pytest, ruff, mypy, mkdocs, fsspec,"
	@echo "matplotlib."
	@echo "The first time this downloads several hundred MB (TensorFlow is most of it) and takes 1 to 3"
	@echo "minutes; pip shows each download and the installation's progress. Later runs skip it."
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar on -e ".[tf,torch,test,fast,docs,remote,plot]"
	touch $@

demo: $(VENV)/.installed
	$(PY) demos/train_keras.py $(ARGS)

test: $(VENV)/.installed
	$(PY) -m ruff check prefetch tests demos benchmarks
	$(PY) -m ruff format --check prefetch tests demos benchmarks
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m mkdocs build --strict --quiet
	$(PY) -m pytest $(ARGS)

docs: $(VENV)/.installed
	$(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
