"""Builds the optional libjpeg-turbo window decoder (prefetch/decode/_jpegwindow.c); the rest of the
package is pure Python and described in pyproject.toml.

The extension needs a C compiler and libjpeg's headers (Debian: libjpeg-dev, which is
libjpeg-turbo). It is `optional`: where it cannot be built, the install still succeeds and crops
are decoded by the fallbacks in prefetch.decode._window (slower, the same crop boxes).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "prefetch.decode._jpegwindow",
            sources=["prefetch/decode/_jpegwindow.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        )
    ]
)
