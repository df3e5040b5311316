"""Verification: is a bundle intact, do its claims hold?

* `verify_bundle(bundle)` — every file's sha256 against the manifest (a tampered `results.csv`
  is detected), every copy of the results against the others (results.parquet against
  results.csv, claims.json against the claims re-evaluated from results.csv: an edit made
  together with its digest is caught too), then the protocol's claims re-evaluated;
  `verify_bundle(bundle, claims=load_claims(path))` evaluates *new* claims (a claims file) against
  the bundle instead — no re-run; the outcome says where the claims came from.

Every function reads a bundle through one `anistat.bundle.Bundle` (loaded once); comparing two
bundles is `anistat.comparison`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .bundle import Bundle, as_bundle
from .claims import compare_claims, evaluate_claims
from .errors import AnistatInputError
from .protocol import ClaimSpec, format_validation_error, read_yaml


@dataclass
class BundleCheck:
    """The outcome of `anistat verify BUNDLE`: integrity problems (every file against the sha256 in
    the manifest, and re-evaluated claims that disagree with claims.json), the claim records and
    where the claims came from. :meth:`to_json` is what `verify --json` prints."""

    bundle: Path
    integrity_ok: bool
    problems: list[str]
    claims: list[dict[str, Any]]
    recorded_claims: list[dict[str, Any]] = field(default_factory=list)
    claims_source: str = "the bundle's protocol"
    files_checked: int = 0

    @property
    def claims_ok(self) -> bool:
        return all(c["passed"] for c in self.claims)

    @property
    def ok(self) -> bool:
        return self.integrity_ok and self.claims_ok

    def to_json(self) -> dict[str, Any]:
        """One JSON document for scripts: ``ok``, ``integrity`` (``ok``, ``files_checked``,
        ``problems``), ``claims_source`` and ``claims`` — each claim the same record claims.json
        holds (id, statement, status, passed, rule, decided_by, interval, p_value, failed,
        evidence, selected_rows)."""
        return {
            "bundle": str(self.bundle),
            "ok": self.ok,
            "integrity": {
                "ok": self.integrity_ok,
                "files_checked": self.files_checked,
                "problems": list(self.problems),
            },
            "claims_source": self.claims_source,
            "claims_ok": self.claims_ok,
            "claims": self.claims,
        }


#: Numbers of results.parquet and results.csv agree to this relative tolerance (the CSV holds
#: ten significant digits: ``float_format="%.10g"``).
COPY_RELATIVE_TOLERANCE = 1e-8


def results_copy_problems(bundle: Bundle) -> list[str]:
    """The bundle's results.parquet against its results.csv (``bundle.results``, as
    :func:`anistat.bundle.read_results` read it): the same columns in the same order, the same rows, numbers equal to
    :data:`COPY_RELATIVE_TOLERANCE` (NaN matching NaN), text exactly. One line naming the first
    difference (column, row and both values); [] when they agree or there is no parquet copy.

    The sha256 digests catch an edited file; this catches a file edited *with* its digest, so a
    careless edit of one copy of the results cannot pass `anistat verify` while the other copy
    still holds the run's numbers."""
    path, csv = bundle.path / "results.parquet", bundle.results
    if not path.is_file():
        return []
    try:
        parquet = pd.read_parquet(path)
    except ImportError:  # no pyarrow here: the copy cannot be read, only its digest checked
        return []
    except Exception as error:  # noqa: BLE001 - a damaged file: named, one line
        return [f"results.parquet: cannot be read ({' '.join(str(error).split())[:200]})"]
    where = "results.parquet differs from results.csv"
    if list(parquet.columns) != list(csv.columns):
        extra = [c for c in parquet.columns if c not in csv.columns]
        missing = [c for c in csv.columns if c not in parquet.columns]
        detail = (
            f"column(s) only in the parquet: {extra}"
            if extra
            else f"column(s) only in the csv: {missing}"
            if missing
            else "the columns are in another order"
        )
        return [f"{where}: {detail}"]
    if len(parquet) != len(csv):
        return [f"{where}: {len(parquet)} rows in the parquet, {len(csv)} in the csv"]
    for column in csv.columns:
        a, b = csv[column].reset_index(drop=True), parquet[column].reset_index(drop=True)
        numeric = (
            pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b) and not pd.api.types.is_bool_dtype(a)
        )
        if numeric:
            x = a.astype("float64").to_numpy(na_value=np.nan)
            y = b.astype("float64").to_numpy(na_value=np.nan)
            with np.errstate(invalid="ignore"):
                same = (np.isnan(x) & np.isnan(y)) | (x == y) | (np.abs(x - y) <= COPY_RELATIVE_TOLERANCE * np.abs(y))
        else:
            text_a = a.astype(object).where(a.notna(), "").astype(str)
            text_b = b.astype(object).where(b.notna(), "").astype(str)
            same = (text_a == text_b).to_numpy()
        if not same.all():
            row = int(np.flatnonzero(~same)[0])
            label = ", ".join(
                f"{k} {csv.at[row, k]}"
                for k in ("model", "checkpoint", "site", "rank", "proxy", "control", "metric")
                if k in csv.columns and not pd.isna(csv.at[row, k])
            )
            return [
                f"{where}: column {column}, row {row + 1} ({label}): {_cell(a.iloc[row])} in the csv, "
                f"{_cell(b.iloc[row])} in the parquet ({int((~same).sum())} value(s) differ)"
            ]
    return []


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "(empty)"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.10g}"
    text = str(value)
    return repr(text if len(text) <= 40 else text[:40] + "…")


def load_claims(path: Path) -> tuple[ClaimSpec, ...]:
    """Claims from a YAML file: a list of claims, or a mapping with a `claims:` list (so a whole
    protocol file works too). Each claim is validated like a protocol's; errors are one line."""
    from pydantic import ValidationError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AnistatInputError(f"{path}: claims file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise AnistatInputError(f"{path}: cannot read the claims file ({error})") from None
    data = read_yaml(text, str(path))
    if isinstance(data, dict):
        data = data.get("claims")
    if not isinstance(data, list) or not data:
        raise AnistatInputError(f"{path}: expected a non-empty list of claims (or a mapping with a 'claims' list)")
    claims = []
    for index, item in enumerate(data):
        try:
            claims.append(ClaimSpec.model_validate(item))
        except ValidationError as error:
            raise AnistatInputError(format_validation_error(error, f"{path}: claims[{index}]")) from None
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise AnistatInputError(f"{path}: claim ids must be unique, got {ids}")
    return tuple(claims)


def check_claims_against_table(
    claims: tuple[ClaimSpec, ...] | list[ClaimSpec], table: pd.DataFrame, source: str
) -> None:
    """One clear line (exit 2) for a claim whose metric, `where` key or `where` value does not
    occur in the bundle's table, naming the valid choices — instead of a claim that silently
    selects nothing."""
    from .claims import select_rows

    metrics = sorted(table["metric"].dropna().astype(str).unique())
    columns = [c for c in table.columns if not str(c).startswith("_")]
    for index, claim in enumerate(claims):
        label = f"{source}: claims[{index}] '{claim.id}'"
        if claim.metric not in metrics:
            raise AnistatInputError(
                f"{label}: metric '{claim.metric}' is not in this bundle; valid metrics: {', '.join(metrics)}"
            )
        for key, wanted in claim.where.items():
            if key not in columns:
                raise AnistatInputError(
                    f"{label}: where key '{key}' is not a result column; valid keys: {', '.join(columns)}"
                )
            for value in wanted if isinstance(wanted, list) else [wanted]:
                probe = ClaimSpec(id=claim.id, metric=claim.metric, where={key: value})
                if select_rows(table, probe).empty:
                    present = table.loc[table["metric"] == claim.metric, key].dropna().astype(str).unique()
                    raise AnistatInputError(
                        f"{label}: where.{key} = {value!r}: no '{claim.metric}' row of this "
                        f"bundle has it; values: {', '.join(sorted(present)[:20])}"
                    )


def verify_bundle(
    bundle: Bundle | Path, claims: tuple[ClaimSpec, ...] | None = None, claims_source: str | None = None
) -> BundleCheck:
    """Integrity, then claims: the bundle's own (`claims=None`) or the given ones, evaluated
    against the bundle's tables without re-running anything (then claims.json, which records
    the protocol's claims, is not compared). A path is read with :meth:`Bundle.load`."""
    from .claims import claim_table

    bundle = as_bundle(bundle)
    problems = [str(problem) for problem in bundle.integrity] + results_copy_problems(bundle)
    if claims is not None:
        source = claims_source or "the given claims"
        check_claims_against_table(claims, claim_table(bundle.results, bundle.frequency), source)
        evaluated = evaluate_claims(bundle.results, claims, bundle.frequency, stats=bundle.protocol.stats)
        return BundleCheck(
            bundle.path,
            not problems,
            problems,
            evaluated,
            [],
            claims_source=source,
            files_checked=bundle.files_recorded,
        )
    protocol = bundle.protocol  # its claims evaluated afresh against the tables: claims.json's records
    claims_now = evaluate_claims(bundle.results, protocol.claims, bundle.frequency, stats=protocol.stats)
    recorded = bundle.claims
    if recorded or bundle.has_claims_file:
        if [c.get("id") for c in recorded] != [c["id"] for c in claims_now]:
            problems.append(
                f"claims.json: records claims {[c.get('id') for c in recorded]} but the protocol's are "
                f"{[c['id'] for c in claims_now]}"
            )
        for claim in compare_claims(recorded, claims_now):
            if not claim["agree"] and "missing" not in (claim["original"], claim["replication"]):
                problems.append(
                    f"claims.json: claim '{claim['id']}' recorded as {claim['original']} "
                    f"but re-evaluates from results.csv as {claim['replication']}"
                )
    return BundleCheck(bundle.path, not problems, problems, claims_now, recorded, files_checked=bundle.files_recorded)
