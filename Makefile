# Two commands do all set-up on a fresh machine:
#   make demo   train a small Keras CNN from an image folder fed by prefetch
#   make test   lint, type-check, build the docs strictly and run the test suite
# Both create .venv and install what they need into it. `make docs` builds the documentation
# site (the guides and the API reference generated from docstrings) into site/. `make sanitize`
# runs the differential JPEG corpus against the compiled decoder built with AddressSanitizer and
# UBSan (Linux and gcc; see docs/decoders.md, "Two paths, one result").

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: demo test docs sanitize clean

# The editable install is a .pth with the checkout's path, so that a folder named `prefetch` in
# the current directory (the checkout itself, seen from its parent) cannot shadow the install the
# way it shadows setuptools' import hook (issue 28.10). setuptools writes that .pth by default
# for the flat layout pyproject.toml declares (`package-dir = {"" = "."}`), so no editable_mode
# is set here: `editable_mode=compat`, which did it before, "is transitional and will be
# removed" (issue 35.6). The flat layout stays (no src/ folder: decided in issue 26).
# The compiled window decoder's sources: every file of _c/ (setup.py lists the ones it builds).
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

# The compiled decoder built with AddressSanitizer and UBSan into a copy of the package
# (SANITIZE_DIR: the checkout's own build is never replaced), from the C sources setup.py lists
# (no file name here), then SANITIZE_TESTS run against the copy: tests/test_differential.py with
# SANITIZE_COUNT corpus files, and the header walk's C twin against walk_jpeg on 3,000 mutated
# headers (header_walk.c reads every file's bytes before libjpeg does). Python is not built
# with ASan, so libasan is preloaded and leak checks are off (Python's own allocations live to
# exit). Worker processes inherit all of it. ASan writes
# its reports to SANITIZE_DIR/reports (a file per process); UBSan's go to stderr (gcc's UBSan
# inside a preloaded ASan ignores log_path), so pytest runs uncaptured (-s) into
# SANITIZE_DIR/pytest.log and its "runtime error:" lines are counted too. Fails on a failed test
# or on any report.
SANITIZE_DIR ?= build/sanitize
SANITIZE_COUNT ?= 3000
SANITIZE_TESTS ?= tests/test_differential.py \
	tests/test_header_walk.py::test_the_c_walk_reports_what_the_python_walk_reports
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g
SANITIZE_ENV = PYTHONPATH=$(abspath $(SANITIZE_DIR)) PREFETCH_CORPUS_COUNT=$(SANITIZE_COUNT) \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
	ASAN_OPTIONS=detect_leaks=0:log_path=$(abspath $(SANITIZE_DIR))/reports/asan \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

sanitize: $(VENV)/.installed
	rm -rf $(SANITIZE_DIR)
	$(PY) -c "import shutil; shutil.copytree('prefetch', '$(SANITIZE_DIR)/prefetch', \
		ignore=shutil.ignore_patterns('*.so', '__pycache__'))"
	CFLAGS="$(SANITIZE_FLAGS)" LDFLAGS="-fsanitize=address,undefined" $(PY) setup.py -q \
		build_ext --force --build-lib $(SANITIZE_DIR) --build-temp $(SANITIZE_DIR)/temp
	mkdir -p $(SANITIZE_DIR)/reports
	cd $(SANITIZE_DIR) && $(SANITIZE_ENV) $(abspath $(PY)) -c "import os, prefetch.decode._jpegwindow \
		as built; assert built.__file__.startswith(os.getcwd()), built.__file__; print(built.__file__)"
	cd $(SANITIZE_DIR) && { $(SANITIZE_ENV) $(abspath $(PY)) -m pytest -q -s -p no:cacheprovider \
		$(addprefix $(CURDIR)/,$(SANITIZE_TESTS)) $(ARGS) 2>&1; echo $$? > status; } | tee pytest.log; \
		cat reports/* 2>/dev/null; \
		reports=$$(( $$(ls reports | wc -l) + $$(grep -c "runtime error:" pytest.log) )); \
		echo "make sanitize: $(SANITIZE_COUNT) corpus files, pytest exit status $$(cat status)," \
			"$$reports sanitizer reports (in $(SANITIZE_DIR)/reports and pytest.log)"; \
		test "$$(cat status)" -eq 0 && test $$reports -eq 0

# Everything the install, the tools and the builds leave in the checkout: the venv, the tool
# caches (pytest's, mypy's, ruff's, import-linter's and grimp's), the docs site, setuptools'
# build/ and *.egg-info, and the compiled decoder built into the package (the next install
# builds it again).
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .grimp_cache site \
		build *.egg-info prefetch/decode/*.so
