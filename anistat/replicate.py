"""Replication: re-run a protocol here and compare with someone's bundle, claim by claim."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .bundle import Bundle, check_destination, staged_bundle
from .errors import AnistatInputError
from .report.comparison import ComparisonInputs
from .verify import (
    compare_claims,
    compare_results,
    environment_differences,
    reevaluated_claims,
    summarise,
    write_comparison,
)


@dataclass
class ReplicationOutcome:
    report_dir: Path
    replication_bundle: Path
    claims: list[dict]
    summary: dict

    @property
    def ok(self) -> bool:
        return all(c["agree"] and c["replication"] == "pass" for c in self.claims)


def _bundle_at(path: Path) -> None:
    """The one-line refusal of a folder that is not a bundle, before any work."""
    if not (path / "manifest.json").is_file():
        raise AnistatInputError(f"{path}: not an anistat bundle (no manifest.json)")


def compare_bundles(
    original: Bundle | Path, replication: Bundle | Path, *, out: Path | None = None, tolerance: float = 0.25
) -> tuple[Path, dict, list[dict]]:
    """Replication report for two existing bundles (a path is read with :meth:`Bundle.load`,
    after the destination is checked); returns (report directory, summary, claims compared
    claim by claim)."""
    for given in (original, replication):
        if not isinstance(given, Bundle):
            _bundle_at(given)
    paths = [b.path if isinstance(b, Bundle) else b for b in (original, replication)]
    out = out or Path("reports") / f"compare-{paths[0].name}-vs-{paths[1].name}"
    check_destination(out)  # before any work: a folder that cannot be replaced is said at once
    a, b = (given if isinstance(given, Bundle) else Bundle.load(given) for given in (original, replication))
    comparison = compare_results(a.results, b.results, tolerance=tolerance)
    if comparison.empty:
        raise AnistatInputError(
            f"{a.path} and {b.path} have no result row in common (same model, checkpoint, site, rank, "
            "proxy, control and metric, with an estimate in both); compare two bundles of the same protocol"
        )
    claims = compare_claims(reevaluated_claims(a), reevaluated_claims(b))
    summary = summarise(comparison)
    inputs = ComparisonInputs(
        comparison=comparison,
        claims=tuple(claims),
        environment=tuple(environment_differences(a.manifest, b.manifest)),
        summary=summary,
        titles=(str(a.path), str(b.path)),
    )
    with staged_bundle(out) as staging:
        write_comparison(staging, inputs)
        (staging / "manifest.json").write_text('{"anistat_comparison": 1}\n')
    return out, summary, claims


def replicate(
    protocol_path: Path,
    original: Bundle | Path,
    *,
    out: Path | None = None,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
    cache_dir: Path | None = None,
    wait: bool = False,
    trust_remote_code: bool = False,
) -> ReplicationOutcome:
    """`anistat verify PROTOCOL --against BUNDLE`: re-run, then compare with the original (read
    once, before the re-run, when given as a path). An existing re-run bundle at `out` is
    replaced only with `overwrite=True`; `cache_dir`, `wait` and `trust_remote_code` are
    `anistat.pipeline.run`'s (the consent is checked before the original is read)."""
    from .pipeline import run
    from .protocol import load_protocol, require_remote_code_consent

    protocol = load_protocol(protocol_path)
    require_remote_code_consent(protocol, trust_remote_code)
    if not isinstance(original, Bundle):
        original = Bundle.load(original)
    replication_out = out or Path("reports") / f"{protocol.name}-replication"
    report_dir = replication_out.parent / f"{replication_out.name}-comparison"
    check_destination(report_dir)  # before the re-run (run checks its own --out first)
    run(
        protocol,
        replication_out,
        log=log,
        overwrite=overwrite,
        cache_dir=cache_dir,
        wait=wait,
        trust_remote_code=trust_remote_code,
    )
    _, summary, claims = compare_bundles(
        original, replication_out, out=report_dir, tolerance=protocol.replication.tolerance
    )
    return ReplicationOutcome(report_dir, replication_out, claims, summary)
