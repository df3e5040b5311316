"""The output bundle: atomic writing, the manifest, file integrity.

A bundle is written into a hidden temporary directory beside its destination and moved into
place with one rename, so a crash never leaves a half bundle. An existing destination is
replaced only if it is itself an anistat bundle (has `manifest.json`) or empty — anything else
is the user's and is never touched. Every file name is fixed by anistat, so nothing can be
written outside the chosen directory.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from .errors import AnistatInputError



def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, str]:
    """Versions of everything that can change a number, as manifest fields."""
    from importlib import metadata

    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for package in ("anistat", "torch", "transformers", "tokenizers", "numpy", "scipy", "statsmodels",
                    "pandas", "pydantic", "matplotlib", "seaborn"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    if versions["anistat"] == "not installed":  # running from a source tree without pip install
        from . import __version__

        versions["anistat"] = f"{__version__} (source tree)"
    return versions


def sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file in the bundle except the manifest itself (relative POSIX paths)."""
    digests = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            digests[path.relative_to(directory).as_posix()] = sha256_file(path)
    return digests


def check_destination(out: Path) -> None:
    """Refuse to replace a directory that is not an anistat bundle (or to write into a file)."""
    if out.name in ("", ".", ".."):
        raise AnistatInputError(f"--out {out}: name the bundle directory itself (e.g. {Path(out, 'bundle')})")
    if out.exists() and not out.is_dir():
        raise AnistatInputError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise AnistatInputError(f"--out {out}: directory exists, is not empty and is not an anistat bundle; "
                                "choose another --out")
    # Nothing is created here (a run that fails later must leave no trace): the nearest existing
    # ancestor must be a writable directory; staged_bundle creates the missing parents.
    ancestor = out.parent if str(out.parent) else Path(".")
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise AnistatInputError(f"--out {out}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise AnistatInputError(f"--out {out}: directory {ancestor} is not writable")


@contextlib.contextmanager
def staged_bundle(out: Path) -> Iterator[Path]:
    """Yield a temporary directory to fill; on success it atomically becomes `out`."""
    check_destination(out)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        recover_stale_staging(out)
        staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(out), suffix=".partial", dir=parent))
    except OSError as error:
        raise AnistatInputError(f"--out {out}: cannot write in {parent} ({error.strerror})") from None
    try:
        yield staging
        os.chmod(staging, 0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _swap_into_place(staging, out, parent)


def _staging_prefix(out: Path) -> str:
    """`.NAME.HOST-PID.`: hidden, beside `out`, and owned by a process that can be checked."""
    host = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40] or "host"
    return f".{out.name}.{host}-{os.getpid()}."


def recover_stale_staging(out: Path) -> None:
    """Clean up after a process killed (SIGKILL, power loss) while writing `out`: its staging
    directory is removed and a retired old bundle is put back if `out` went missing. Only
    directories of dead processes on this host are touched; a concurrent writer's are left alone."""
    parent = out.parent if str(out.parent) else Path(".")
    host_prefix = _staging_prefix(out).rsplit("-", 1)[0] + "-"
    for path in sorted(parent.glob(f".{glob.escape(out.name)}.*")):
        if not path.is_dir() or path.suffix not in (".partial", ".old") or not path.name.startswith(host_prefix):
            continue
        owner = path.name[len(host_prefix):].split(".", 1)[0]
        if not owner.isdigit() or _process_alive(int(owner)):
            continue
        if path.suffix == ".old" and (path / "bundle").is_dir() and not out.exists():
            os.replace(path / "bundle", out)
        shutil.rmtree(path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def _swap_into_place(staging: Path, out: Path, parent: Path) -> None:
    """Move the finished staging directory to `out`; an older bundle there is retired first and,
    if anything goes wrong in between (even Ctrl-C), put back — it is never lost or left hidden."""
    retired: Path | None = None
    try:
        if out.exists():
            check_destination(out)  # still a bundle (or empty) at the moment of replacing it
            retired = Path(tempfile.mkdtemp(prefix=_staging_prefix(out), suffix=".old", dir=parent))
            os.replace(out, retired / "bundle")
        os.replace(staging, out)
    except BaseException:
        if retired is not None and (retired / "bundle").exists() and not out.exists():
            os.replace(retired / "bundle", out)
        if retired is not None:
            with contextlib.suppress(OSError):
                retired.rmdir()  # only when the old bundle is back in place
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same directory + rename): a reader or a crash never
    sees half a file. NaN/Inf are refused (not JSON)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=_json_default) + "\n")


def atomic_write_text(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _json_default(value: Any):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_manifest(bundle: Path) -> dict[str, Any]:
    path = bundle / "manifest.json"
    if not bundle.is_dir():
        raise AnistatInputError(f"{bundle}: bundle directory not found")
    if not path.is_file():
        raise AnistatInputError(f"{bundle}: not an anistat bundle (no manifest.json)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise AnistatInputError(f"{path}: manifest is not valid JSON ({error})") from None
    except OSError as error:
        raise AnistatInputError(f"{path}: cannot read the manifest ({error.strerror})") from None
    if not isinstance(manifest, dict):
        raise AnistatInputError(f"{path}: the manifest must be a JSON object, got {type(manifest).__name__}")
    return manifest


def command_line() -> str:
    return " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if sys.argv else ""
