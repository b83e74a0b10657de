"""Use a fast BLAS for MLX's CPU backend on Linux.

The Linux ``mlx[cpu]`` wheel links a slow bundled reference BLAS. Loading an OpenBLAS with
``RTLD_GLOBAL`` *before* ``mlx.core`` is imported makes the dynamic linker resolve MLX's
``cblas_*`` symbols to it (figures: docs/install.md). This module must be imported before
anything imports ``mlx.core``; ``autocurricula/__init__.py`` does that.

Control with ``AUTOCURRICULA_BLAS``: unset/"auto" searches the usual places, "none" keeps the
bundled BLAS, a path loads that library. Note: the preload also serves torch's BLAS calls in
the same process, which slows torch on CPU; set "none" where torch matters.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import sys
import sysconfig

_CANDIDATES = (
    # Debian/Ubuntu: apt-get install libopenblas0-pthread
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    # Fedora/RHEL/Arch
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

# What was loaded (path) or why not; read by `autocurricula env` and the benches.
ACTIVE: dict = {"library": None, "reason": "not attempted"}
_LIB: list = []  # the loaded library (ctypes handle), for set_threads


def _pip_candidates() -> list[str]:
    # cmeel-openblas (PyPI) installs under <prefix>/cmeel.prefix/lib
    out = []
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], sys.prefix}:
        out += glob.glob(os.path.join(base, "cmeel.prefix", "lib", "libopenblas.so*"))
    return sorted(out)


def preload() -> dict:
    """Load a fast BLAS globally if possible; returns ``ACTIVE`` describing the outcome."""
    if ACTIVE["reason"] != "not attempted":
        return ACTIVE
    if not sys.platform.startswith("linux"):
        ACTIVE.update(reason="not needed (macOS uses Accelerate)" if sys.platform == "darwin" else "unsupported platform")
        return ACTIVE
    choice = os.environ.get("AUTOCURRICULA_BLAS", "auto").strip()
    if choice.lower() == "none":
        ACTIVE.update(reason="disabled by AUTOCURRICULA_BLAS=none")
        return ACTIVE
    if "mlx.core" in sys.modules:
        ACTIVE.update(reason="mlx.core was imported before autocurricula; bundled BLAS in use")
        return ACTIVE
    paths = [choice] if choice.lower() != "auto" else list(_CANDIDATES) + _pip_candidates()
    errors = []
    for path in paths:
        if not os.path.exists(path):
            continue
        try:
            _LIB.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
        except OSError as exc:  # e.g. cmeel's build without libgfortran.so.5 on the system
            errors.append(f"{path}: {exc}")
            continue
        ACTIVE.update(library=os.path.realpath(path), reason="preloaded")
        return ACTIVE
    ACTIVE.update(reason="no OpenBLAS found; install libopenblas0-pthread (Debian) or run `bash run.sh setup`"
                  + (f" ({'; '.join(errors)})" if errors else ""))
    return ACTIVE


def set_threads(n: int) -> bool:
    """Run the preloaded OpenBLAS's matmuls on ``n`` threads (a server sharing the machine with a
    trainer leaves it cores this way). False when no OpenBLAS was preloaded (macOS's Accelerate,
    the bundled BLAS), where the setting does not apply."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"BLAS threads must be a positive integer, got {n!r}")
    fn = getattr(_LIB[0], "openblas_set_num_threads", None) if _LIB else None
    if fn is None:
        return False
    fn(ctypes.c_int(n))
    ACTIVE["threads"] = n
    return True


def use_threads(n: int) -> int | None:
    """:func:`set_threads`, warning when it cannot apply; returns the count before, to restore."""
    before = get_threads()
    if not set_threads(n):
        logging.getLogger("autocurricula").warning(
            "threads=%d has no effect: %s is in use, not a preloaded OpenBLAS", n, describe())
    return before


def get_threads() -> int | None:
    """The preloaded OpenBLAS's thread count (None without one)."""
    fn = getattr(_LIB[0], "openblas_get_num_threads", None) if _LIB else None
    return int(fn()) if fn is not None else None


def describe() -> str:
    """One line naming the BLAS MLX's CPU backend uses."""
    if ACTIVE["library"]:
        threads = f", {ACTIVE['threads']} threads" if "threads" in ACTIVE else ""
        return f"OpenBLAS ({ACTIVE['library']}{threads})"
    if sys.platform == "darwin":
        return "Accelerate"
    return f"bundled reference BLAS ({ACTIVE['reason']})"


@contextlib.contextmanager
def threads_during(n: int | None):
    """BLAS threads set to ``n`` inside the block and restored after it; ``None`` leaves them."""
    before = use_threads(n) if n is not None else None
    try:
        yield
    finally:
        if before is not None:
            set_threads(before)
