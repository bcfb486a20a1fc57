"""Builds the optional libjpeg-turbo window decoder (prefetch/_jpegwindow.c); the rest of the
package is pure Python and described in pyproject.toml.

The extension needs a C compiler and libjpeg's headers (Debian: libjpeg-dev, which is
libjpeg-turbo). It is `optional`: where it cannot be built, the install still succeeds and crops
are decoded by the fallbacks in prefetch.window_decode (slower, the same crop boxes).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "prefetch._jpegwindow",
            sources=["prefetch/_jpegwindow.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        )
    ]
)
