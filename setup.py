"""Builds the optional libjpeg-turbo window decoder, `prefetch.decode._jpegwindow`, from the C
sources in prefetch/decode/_c/; the rest of the package is pure Python and described in
pyproject.toml.

The extension needs a C compiler and libjpeg's headers (Debian: libjpeg-dev, which is
libjpeg-turbo). It is `optional`: where it cannot be built, the install still succeeds and crops
are decoded by the fallbacks in prefetch.decode._window (slower, the same crop boxes). On Linux
the test suite fails without it (tests/conftest.py says why).

`JPEGWINDOW_SOURCES` and `JPEGWINDOW_HEADERS` are the one list of its files: the Makefile's
`sanitize` target builds it through this file (`setup.py build_ext`), and its install target is
remade when any file of prefetch/decode/_c/ changes.
"""

from setuptools import Extension, setup

_C = "prefetch/decode/_c/"

# The extension's C files, one job each (prefetch/decode/_c/binding.c names them all).
JPEGWINDOW_SOURCES = [
    _C + "binding.c",
    _C + "libjpeg_window.c",
    _C + "header_walk.c",
    _C + "entropy_floor.c",
    _C + "generator.c",
    _C + "boxes.c",
    _C + "chunk.c",
]
JPEGWINDOW_HEADERS = [
    _C + "libjpeg_window.h",
    _C + "header_walk.h",
    _C + "entropy_floor.h",
    _C + "generator.h",
    _C + "boxes.h",
    _C + "chunk.h",
]

JPEGWINDOW = Extension(
    "prefetch.decode._jpegwindow",
    sources=JPEGWINDOW_SOURCES,
    depends=JPEGWINDOW_HEADERS,  # rebuilt when one changes, and shipped in the sdist
    libraries=["jpeg"],
    # Hidden: the files' functions are shared between them but not exported by the module
    # (PyInit__jpegwindow is, by PyMODINIT_FUNC).
    extra_compile_args=["-O2", "-Wall", "-fvisibility=hidden"],
    optional=True,
)

setup(ext_modules=[JPEGWINDOW])
