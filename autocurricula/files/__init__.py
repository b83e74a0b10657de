"""Files the package writes: atomic replacement and append-only logs that never follow a planted link."""

from autocurricula.files.atomic import atomic_write, open_append

__all__ = ["atomic_write", "open_append"]
