"""Builds the native extensions; all other metadata lives in pyproject.toml."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("HIXL_DEBUG") == "1"
CSRC = "native/hixl_native/csrc"


def native_extension(name: str, c_sources: list[str], libraries: tuple[str, ...] = ()) -> Extension:
    """One Cython module of hixl_native plus its C sources, with the shared flags."""
    return Extension(
        f"hixl_native.{name}",
        sources=[f"native/hixl_native/{name}.pyx", *(f"{CSRC}/{c}" for c in c_sources)],
        include_dirs=[CSRC],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-unused-function"]
        + (["-g", "-O0", "-DHIXL_DEBUG=1"] if DEBUG else []),
        define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
        libraries=["pthread", *libraries],
    )


extensions = [
    # pools, mappings, copies and the TCP data plane
    native_extension("_core", ["extents.c", "pool.c", "mapping.c", "copy.c", "region_table.c",
                               "crc32c.c", "tcp_wire.c", "tcp_server.c", "tcp_link.c",
                               "link_threads.c",
                               "completion.c", "xmem.c", "copy_pool.c", "ring.c",
                               "native_lane.c"],
                     # libcrypto: the data plane's connection MACs (HMAC-SHA256)
                     libraries=("crypto",)),
    # the ACL/HCCL shim: loads CANN with dlopen at run time, so it builds anywhere
    native_extension("_ascend", ["acl_shim.c"], libraries=("dl",)),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": "3",
            "embedsignature": True,
            "linetrace": DEBUG,
        },
        annotate=DEBUG,
    )
)
