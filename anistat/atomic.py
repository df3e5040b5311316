"""The one atomic-file helper of anistat (bundles, manifests, cached unit artifacts).

Base layer: imports nothing else from anistat, so every stage may use it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, write: Callable[[Any], Any]) -> None:
    """Call ``write(binary_stream)`` on a temporary file in ``path``'s directory, then rename it
    to ``path`` (one ``os.replace``): readers and crashes see the old file or the new one, never
    half of one. The temporary file is removed if ``write`` fails (even on Ctrl-C). The file
    gets mode 0644."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8, byte for byte (no newline translation), atomically."""
    atomic_write_bytes(path, lambda stream: stream.write(text.encode("utf-8")))
