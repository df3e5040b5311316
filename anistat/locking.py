"""One writer per folder: an OS-level lock (``fcntl.flock``) on a small lock file.

`anistat run` holds one lock for its bundle folder (``--out``) and one for its per-unit cache,
from the preflight to the end of the run. A second run that wants either refuses at once with
one line naming the holder (its pid, host, start time and command line, read from the lock
file), or waits for it (``--wait``).

Why flock: the kernel drops the lock when the holder's last file descriptor closes — at exit,
on a crash, on SIGKILL — so a killed run never blocks the next one and there is no stale lock
to guess about. The lock file itself is removed by its holder when the lock is released; a
file left by a killed run is harmless (the next run locks it). A lock taken on a file that was
removed meanwhile is dropped and taken again on the new file (the inode check in `acquire`), so
two runs can never both hold "the" lock.

Base layer: imports nothing else from anistat; a refusal is a `LockHeld`, which the caller
turns into its one-line input error.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

try:  # POSIX; on Windows the lock is a no-op (documented in docs/troubleshooting.md)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class LockHeld(Exception):
    """The lock is held by another process; the message names it and the ways out."""


def bundle_lock_path(out: Path) -> Path:
    """The lock file of the bundle folder `out`: hidden, beside it (not in it: the folder is
    replaced as a whole when the bundle is published)."""
    parent = out.parent if str(out.parent) else Path(".")
    return parent / f".{out.name}.anistat-lock"


def cache_lock_path(cache: Path) -> Path:
    """The lock file of a run's per-unit cache folder (inside it: it goes when the cache goes)."""
    return cache / "lock"


def holder(path: Path) -> dict:
    """What the lock file at `path` says of its holder (empty when unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(record: dict) -> str:
    """`pid 123 on host, started 2026-…, command "anistat run …"` (what is known)."""
    parts = [f"pid {record.get('pid', '?')}"]
    if record.get("host"):
        parts[0] += f" on {record['host']}"
    if record.get("started_at"):
        parts.append(f"started {record['started_at']}")
    if record.get("command"):
        parts.append(f"command '{record['command']}'")
    return ", ".join(parts)


def is_locked(path: Path) -> bool:
    """Whether a live process holds the lock at `path` now (a probe that takes and drops it)."""
    if fcntl is None or not path.is_file():
        return False
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(descriptor)  # closing drops the probe's lock
    return False


@contextlib.contextmanager
def exclusive(path: Path, what: str, *, wait: bool = False, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock at `path` for the body (`what` names the locked thing in messages, e.g.
    ``the bundle folder reports/x``). Taken: refuse at once with one line naming the holder, or
    with `wait` block until it is free (saying so once through `log`)."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    try:
        created = _make_parents(path.parent)
    except OSError as error:
        raise LockHeld(f"cannot lock {what}: cannot create {error.filename} ({error.strerror})") from None
    try:
        descriptor = _acquire(path, what, wait, log)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a waiter re-checks the inode and retries
        os.close(descriptor)
        _remove_empty(created)


def _make_parents(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; return the ones created, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):
            created.mkdir()
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a lock created, deepest first, while they are empty (nothing left behind
    by a run that wrote nothing)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _acquire(path: Path, what: str, wait: bool, log: Callable[[str], None] | None) -> int:
    said = False
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise LockHeld(f"cannot lock {what}: cannot create {path} ({error.strerror})") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            record = holder(path)
            if not wait:
                os.close(descriptor)
                raise LockHeld(
                    f"{what} is in use by another anistat run ({describe_holder(record)}); wait for it to "
                    "finish (or pass --wait), or choose another --out / --cache-dir"
                ) from None
            if not said and log is not None:
                log(f"waiting for {what}: in use by {describe_holder(record)}")
                said = True
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # blocks until the holder ends
        if _same_file(descriptor, path):
            _record_holder(descriptor)
            return descriptor
        os.close(descriptor)  # the holder removed the file we locked: lock the new one
        time.sleep(0.01)


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except OSError:
        return False
    held = os.fstat(descriptor)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _record_holder(descriptor: int) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
    }
    data = (json.dumps(record) + "\n").encode("utf-8")
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, data, 0)
