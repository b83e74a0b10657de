"""Files the package writes whole: :func:`atomic_write`, the one way a file is replaced.

A fixed temporary name (``x.json.tmp``) can be planted as a symlink by anyone who can write the
folder: the writer then writes through it (to a file of the planter's choosing) and the rename
puts the link in the file's place. :func:`atomic_write` instead creates a fresh file with a random
name in the target's folder (``tempfile.mkstemp``: ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600),
writes and fsyncs it, gives it ``mode``, and renames it over the target (``os.replace`` replaces a
link at the target itself, never what it points to). A reader sees the old file or the new one,
never half of one; after a crash, at worst a ``.<name>.*.tmp`` file is left beside it.
:func:`open_append` opens an append-only log without following a link in its place. Bottom
layer: no MLX, nothing of the package.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "open_append"]


def atomic_write(path: str | Path, data: str | bytes, *, mode: int = 0o644, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``data`` (text is encoded with ``encoding``) atomically, as the module
    docstring says; ``mode``: the new file's permissions (mkstemp's 0600 would hide a run's files
    from a dashboard run by another user). Returns ``path``."""
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), mode)
        if not hasattr(os, "fchmod"):  # Windows: only the read-only bit means anything there
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_folder(path.parent)
    return path


def open_append(path: str | Path, encoding: str = "utf-8"):
    """``path`` opened for appending text (created 0644 if missing), refusing a symlink in its place
    (``O_NOFOLLOW``: an ``OSError`` instead of writing through a planted link); the append-only
    logs (metrics.jsonl, match_history.jsonl) use it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o644), "a", encoding=encoding)


def _sync_folder(folder: Path) -> None:
    """fsync the folder, so that the rename survives a power cut (POSIX; nothing on Windows)."""
    if os.name == "nt":
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
