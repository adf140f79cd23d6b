"""Builds the native extension; all other metadata lives in pyproject.toml."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("HIXL_DEBUG") == "1"

csrc = "native/hixl_native/csrc"
extension = Extension(
    "hixl_native._core",
    sources=[
        "native/hixl_native/_core.pyx",
        f"{csrc}/pool.c",
        f"{csrc}/mapping.c",
        f"{csrc}/copy.c",
        f"{csrc}/region_table.c",
        f"{csrc}/tcp_wire.c",
        f"{csrc}/tcp_server.c",
        f"{csrc}/tcp_link.c",
        f"{csrc}/completion.c",
    ],
    include_dirs=[csrc],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-unused-function"]
    + (["-g", "-O0", "-DHIXL_DEBUG=1"] if DEBUG else []),
    define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
    libraries=["pthread"],
)

setup(
    ext_modules=cythonize(
        [extension],
        compiler_directives={
            "language_level": "3",
            "embedsignature": True,
            "linetrace": DEBUG,
        },
        annotate=DEBUG,
    )
)
