"""Builds hixl-bench's native ceilings; all other metadata lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

# Self-contained: the ceilings include only their own header, nothing of hixl_native.
# The C sources live beside the package, not inside it: a directory of the
# package without Python modules would be an undeclared package to setuptools.
CSRC = "csrc"

setup(
    ext_modules=cythonize(
        [
            # cold single-thread memcpy and raw loopback TCP, measured next to hixl's figures
            Extension(
                "hixl_bench._ceiling",
                sources=["hixl_bench/_ceiling.pyx", f"{CSRC}/bench_ceiling.c"],
                include_dirs=[CSRC],
                extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-unused-function"],
                libraries=["pthread"],
            ),
        ],
        compiler_directives={"language_level": "3", "embedsignature": True},
    )
)
