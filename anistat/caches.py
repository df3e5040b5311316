"""`anistat cache list|clean`: the per-unit caches of runs, what state each is in, and removing
the ones no run will use again.

A run keeps every finished unit in a cache folder (`anistat.pipeline.cache_dir`:
``<root>/<bundle name>-<protocol sha256[:16]>-a<artifact format>/``, the root chosen by
``--cache-dir``, else ``$ANISTAT_CACHE_DIR``, else ``.anistat-cache`` beside the bundle folder)
and removes it when its bundle is written (unless ``--keep-cache``). A cache's state:

* ``in use`` — a run holds its lock now (never removed);
* ``finished`` — the bundle it was for exists and was written from this protocol (its units
  are in the bundle; kept by ``--keep-cache`` or by a run stopped after publishing);
* ``stale`` — written by an anistat whose unit format differs, or its bundle folder now holds a
  bundle of another protocol: no run will resume from it;
* ``resumable`` — an interrupted run's units: rerunning the same protocol into the same
  ``--out`` resumes from them.

`clean` removes finished and stale caches (with ``all_resumable`` also resumable ones), never
one in use, and only folders that hold nothing but a cache's own files — never a bundle.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .collect.artifact import ARTIFACT_FORMAT
from .errors import AnistatInputError
from .locking import cache_lock_path, is_locked
from .pipeline import CACHE_DIR_VARIABLE, cache_size

#: `<bundle name>-<16 hex>-a<format>`: the name of a cache folder
_CACHE_NAME = re.compile(r"(?P<bundle>.+)-(?P<sha>[0-9a-f]{16})-a(?P<format>\d+)")
#: What a cache folder holds (anything else: not a cache, never removed)
_CACHE_ENTRIES = {"units", "run.json", "lock"}


@dataclass(frozen=True)
class CacheEntry:
    """One cache folder: its path, state, size, finished units and what it was for."""

    path: Path
    state: str
    bytes: int
    units: int
    protocol: str
    out: str


def default_root(where: Path | None) -> Path:
    """The cache root to list: `where` itself when it is one (holds cache folders), else its
    `.anistat-cache`; without `where`, $ANISTAT_CACHE_DIR, else reports/.anistat-cache (the
    default bundles' root)."""
    if where is None:
        chosen = os.environ.get(CACHE_DIR_VARIABLE)
        return Path(chosen).expanduser() if chosen else Path("reports") / ".anistat-cache"
    if (where / ".anistat-cache").is_dir():
        return where / ".anistat-cache"
    return where


def list_caches(root: Path) -> list[CacheEntry]:
    """Every cache folder in `root`, sorted by name (an empty list when there is no root)."""
    if root.exists() and not root.is_dir():
        raise AnistatInputError(f"{root}: is not a directory")
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        match = _CACHE_NAME.fullmatch(path.name)
        if not match or not path.is_dir() or path.is_symlink():
            continue
        if not {entry.name for entry in path.iterdir()} <= _CACHE_ENTRIES:
            continue
        record = _run_record(path)
        units = path / "units"
        found.append(
            CacheEntry(
                path=path,
                state=_state(path, match, record),
                bytes=cache_size(path),
                units=len(list(units.glob("*.json"))) if units.is_dir() else 0,
                protocol=str(record.get("protocol", "?")),
                out=str(record.get("out", "?")),
            )
        )
    return found


def _run_record(path: Path) -> dict:
    try:
        record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _state(path: Path, match: re.Match, record: dict) -> str:
    if is_locked(cache_lock_path(path)):
        return "in use"
    if int(match["format"]) != ARTIFACT_FORMAT:
        return "stale"
    out = record.get("out")
    if not isinstance(out, str):
        return "resumable"
    try:
        manifest = json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return "resumable"
    sha = manifest.get("protocol_sha256") if isinstance(manifest, dict) else None
    if not isinstance(sha, str):
        return "resumable"
    return "finished" if sha[:16] == match["sha"] else "stale"


def clean_caches(root: Path, *, all_resumable: bool = False) -> list[CacheEntry]:
    """Remove the finished and stale caches in `root` (and the resumable ones with
    `all_resumable`); never one in use. Returns those removed; the root goes when empty."""
    removable = {"finished", "stale"} | ({"resumable"} if all_resumable else set())
    removed = []
    for entry in list_caches(root):
        if entry.state in removable and not is_locked(cache_lock_path(entry.path)):
            shutil.rmtree(entry.path)
            removed.append(entry)
    try:
        root.rmdir()
    except OSError:
        pass
    return removed
