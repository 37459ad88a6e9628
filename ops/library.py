"""Locates the kernel library and hands it to ONNX Runtime.

The only module that knows the library's file name or how ORT loads it. ONNX Runtime is
imported lazily: it is an optional dependency (extras ``infer`` and ``train``), and the rest
of the package (schemas, graph builders) works without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime

LIBRARY_FILENAME = "libortlstm_ops.so"

_INSTALL_HINT = "pip install 'ortlstm[infer]' (onnxruntime) or 'ortlstm[train]' (onnxruntime-training-cpu)"


def library_path() -> str:
    """Returns the path of the built kernel library, ``libortlstm_ops.so``.

    Every directory of this package's ``__path__`` is searched: in an editable install the
    Python sources stay in the checkout while the built library sits in site-packages.

    Raises:
        FileNotFoundError: The library was not built; the message says how to build it.
    """
    package = importlib.import_module(__package__ or "ortlstm.ops")
    searched = [Path(entry) for entry in package.__path__]
    for directory in searched:
        candidate = directory / LIBRARY_FILENAME
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"{LIBRARY_FILENAME} not found in {', '.join(map(str, searched))}. The kernel library is "
        "built when the package is installed: run `pip install .` or `pip install -e .` in the "
        "ortlstm checkout (a C++17 compiler and network access to deb.debian.org are needed)."
    )


def _import_onnxruntime() -> ModuleType:
    try:
        return importlib.import_module("onnxruntime")
    except ModuleNotFoundError as error:
        if error.name != "onnxruntime":
            raise
        raise ImportError(f"ortlstm needs ONNX Runtime, which it does not install: {_INSTALL_HINT}") from error


def _load_blas() -> None:
    # Builds against scipy-openblas32 (every default build: on x86-64 next to oneMKL, which is
    # inside the library) load it at run time. Importing scipy_openblas32 loads
    # libscipy_openblas.so with RTLD_GLOBAL, so the kernel library resolves it even where its
    # RUNPATH does not lead to it (the two packages installed in different site directories, or
    # an in-place build). A library that needs it and lacks it fails to load in ORT with the name
    # of the missing libscipy_openblas.so.
    with contextlib.suppress(ImportError):
        importlib.import_module("scipy_openblas32")


BLAS_BACKEND_VARIABLE = "ORTLSTM_BLAS_BACKEND"
"""Environment variable that forces the GEMM backend: ``mkl``, ``openblas`` or ``openblas+mkl`` (unset: by CPU)."""


def blas_backend() -> str:
    """Returns the GEMM backend the kernel library uses in this process, e.g. ``"mkl"``.

    On x86-64 the library links oneMKL and OpenBLAS and chooses once per process, when it is first
    registered with ONNX Runtime: ``"mkl"`` on Intel CPUs; ``"openblas+mkl"`` on AMD and others,
    OpenBLAS except GEMMs of fewer than 16 rows, which run on oneMKL (measured:
    docs/benchmarks.md), but not one-row GEMMs on CPUs with AVX-512 (Zen 4); unless the
    environment variable ``ORTLSTM_BLAS_BACKEND`` forces one
    (``mkl``, ``openblas`` or ``openblas+mkl``).
    Called before any session registered it, this makes (and fixes) the same choice. Builds with
    one BLAS always return it (``"system"`` for ``-DORTLSTM_BLAS=system``). Needs no ONNX Runtime.

    Raises:
        FileNotFoundError: The kernel library was not built.
        ValueError: ``ORTLSTM_BLAS_BACKEND`` names no backend this build links.
    """
    _load_blas()
    # The same path ORT loads, so the same (already loaded) copy and its choice.
    library = ctypes.CDLL(library_path())
    query = library.OrtLstmBlasBackend
    query.restype = ctypes.c_char_p
    query.argtypes = []
    name = query()
    if name is None:
        raise ValueError(
            f"{BLAS_BACKEND_VARIABLE}={os.environ.get(BLAS_BACKEND_VARIABLE, '')!r}: not a GEMM backend of this "
            "build of ortlstm (expected mkl, openblas or openblas+mkl, or unset for the choice by CPU)"
        )
    return name.decode()


BF16_GEMM_VARIABLE = "ORTLSTM_BF16_GEMM"
"""Environment variable that forces the bf16 GEMM backend: ``mkl``, ``onednn`` or ``fallback`` (unset: by CPU)."""


def bf16_gemm_backend() -> str:
    """Returns the backend of the ``matmul_precision="bfloat16"`` GEMMs in this process.

    ``"mkl"`` (oneMKL's ``cblas_gemm_bf16bf16f32``) on Intel CPUs with bf16 units (AVX512-BF16 or
    AMX) when the build links oneMKL; ``"onednn"`` (oneDNN's matmul, from the onednn-cpu-gomp wheel's
    ``libdnnl.so.3``, loaded by this call or the first bf16 GEMM) on other CPUs with bf16 units, e.g.
    AMD Zen 4, whose bf16 units oneMKL does not use; else, or when oneDNN does not load (a warning
    says why), ``"fallback"``: the bfloat16 operands widened to float32 and the float32 GEMM (the
    same numbers within summation order, slower than float32). The environment variable
    ``ORTLSTM_BF16_GEMM`` forces one; ``ORTLSTM_ONEDNN_LIBRARY`` names the ``libdnnl.so.3`` to load.
    Fixed at the first call or registration.

    Raises:
        FileNotFoundError: The kernel library was not built.
        ValueError: ``ORTLSTM_BF16_GEMM`` names no backend this build has.
    """
    _load_blas()
    query = ctypes.CDLL(library_path()).OrtLstmBf16GemmBackend
    query.restype = ctypes.c_char_p
    query.argtypes = []
    name = query()
    if name is None:
        raise ValueError(
            f"{BF16_GEMM_VARIABLE}={os.environ.get(BF16_GEMM_VARIABLE, '')!r}: not a bf16 GEMM backend of this "
            "build of ortlstm (expected mkl, onednn or fallback, or unset for the choice by CPU)"
        )
    return name.decode()


def session_options(**options: object) -> onnxruntime.SessionOptions:
    """Returns ``onnxruntime.SessionOptions`` with the ortlstm kernel library registered.

    The result works for ``InferenceSession`` and for ``onnxruntime.training.api.Module``.

    Args:
        **options: ``SessionOptions`` attributes to set, e.g. ``intra_op_num_threads=2``.

    Raises:
        ImportError: ONNX Runtime is not installed.
        FileNotFoundError: The kernel library was not built.
        TypeError: An option is not a ``SessionOptions`` attribute, or has the wrong type.
    """
    ort = _import_onnxruntime()
    _load_blas()
    result = ort.SessionOptions()
    for name, value in options.items():
        if not isinstance(getattr(type(result), name, None), property):
            raise TypeError(f"session_options(): {name!r} is not an onnxruntime.SessionOptions attribute")
        setattr(result, name, value)
    result.register_custom_ops_library(library_path())
    return result
