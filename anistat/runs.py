"""`anistat runs [DIR]`: the bundles under a folder, read-only.

A bundle is a folder whose manifest.json carries the ``anistat_bundle`` marking key; the folders
under ``DIR`` are searched to :data:`MAX_DEPTH` levels (hidden folders such as the resume cache
``.anistat-cache`` and symbolic links are not entered, and a bundle's own sub-folders are not
searched). Only manifest.json and claims.json are read; nothing is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: How many folder levels below DIR are searched for bundles.
MAX_DEPTH = 4


@dataclass(frozen=True)
class BundleListing:
    """One bundle found: ``path`` (as found under DIR), ``name`` (the protocol's), ``finished_at``
    (the manifest's UTC time), ``models`` (their names), ``units`` (measured units),
    ``failed_units``, ``claims_passed`` / ``claims_failed`` (claims.json's verdicts; 0 / 0 without
    claims) and ``size_bytes`` (every file of the folder)."""

    path: str
    name: str
    finished_at: str
    models: tuple[str, ...]
    units: int
    failed_units: int
    claims_passed: int
    claims_failed: int
    size_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "models": list(self.models)}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _of_type(value: Any, kind: type) -> Any:
    """``value`` when it is a ``kind`` (dict, list), else an empty one: a damaged manifest lists
    as far as it can be read."""
    return value if isinstance(value, kind) else kind()


def _folder_size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def bundle_listing(folder: Path) -> BundleListing | None:
    """The listing of the bundle at ``folder`` (None when its manifest is not a bundle's)."""
    manifest = _json(folder / "manifest.json")
    if not isinstance(manifest, dict) or "anistat_bundle" not in manifest:
        return None
    protocol: dict[str, Any] = _of_type(manifest.get("protocol"), dict)
    models: list[Any] = _of_type(protocol.get("models"), list)
    claims: list[Any] = _of_type(_json(folder / "claims.json"), list)
    verdicts = [bool(c.get("passed")) for c in claims if isinstance(c, dict)]
    units: list[Any] = _of_type(manifest.get("units"), list)
    return BundleListing(
        path=str(folder),
        name=str(protocol.get("name", folder.name)),
        finished_at=str(manifest.get("finished_at", "")),
        models=tuple(str(m.get("name", "?")) for m in models if isinstance(m, dict)),
        units=len(units),
        failed_units=int(manifest.get("failed_units", 0) or 0),
        claims_passed=sum(verdicts),
        claims_failed=len(verdicts) - sum(verdicts),
        size_bytes=_folder_size(folder),
    )


def find_bundles(root: Path, max_depth: int = MAX_DEPTH) -> list[BundleListing]:
    """Every bundle at or below ``root`` (to ``max_depth`` levels), newest first."""
    found: list[BundleListing] = []
    pending = [(Path(root), 0)]
    while pending:
        folder, depth = pending.pop()
        listing = bundle_listing(folder) if (folder / "manifest.json").is_file() else None
        if listing is not None:
            found.append(listing)
            continue
        if depth >= max_depth:
            continue
        try:
            children = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in children:
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                pending.append((Path(entry.path), depth + 1))
    return sorted(found, key=lambda b: (b.finished_at, b.path), reverse=True)


def size_text(size: int) -> str:
    """Bytes in binary units (``1.5 MiB``)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def runs_table(listings: list[BundleListing]) -> str:
    """The listings as a fixed-width text table (one line per bundle)."""
    head = ("name", "finished (UTC)", "models", "units", "claims ok/failed", "size", "path")
    rows = [
        (
            b.name,
            b.finished_at.replace("T", " ")[:19],
            ", ".join(b.models),
            str(b.units) + (f" ({b.failed_units} failed)" if b.failed_units else ""),
            f"{b.claims_passed}/{b.claims_failed}",
            size_text(b.size_bytes),
            b.path,
        )
        for b in listings
    ]
    widths = [max([len(head[i]), *(len(r[i]) for r in rows)]) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *rows])
