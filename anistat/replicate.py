"""Replication: re-run a protocol here and compare with someone's bundle, claim by claim."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .bundle import check_destination, staged_bundle
from .errors import AnistatInputError
from .verify import (
    compare_claims,
    compare_results,
    ensure_bundle,
    environment_differences,
    load_bundle_results,
    summarise,
    verify_bundle,
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


def compare_bundles(
    original: Path, replication: Path, *, out: Path | None = None, tolerance: float = 0.25
) -> tuple[Path, dict, list[dict]]:
    """Replication report for two existing bundles; returns (report directory, summary, claims
    compared claim by claim)."""
    ensure_bundle(original)
    ensure_bundle(replication)
    out = out or Path("reports") / f"compare-{original.name}-vs-{replication.name}"
    check_destination(out)  # before any work: a folder that cannot be replaced is said at once
    results_a, manifest_a = load_bundle_results(original)
    results_b, manifest_b = load_bundle_results(replication)
    comparison = compare_results(results_a, results_b, tolerance=tolerance)
    if comparison.empty:
        raise AnistatInputError(
            f"{original} and {replication} have no result row in common (same model, checkpoint, site, rank, "
            "proxy, control and metric, with an estimate in both); compare two bundles of the same protocol"
        )
    claims = compare_claims(verify_bundle(original).claims, verify_bundle(replication).claims)
    summary = summarise(comparison)
    with staged_bundle(out) as staging:
        write_comparison(
            staging,
            comparison,
            claims,
            environment_differences(manifest_a, manifest_b),
            summary,
            (str(original), str(replication)),
        )
        (staging / "manifest.json").write_text('{"anistat_comparison": 1}\n')
    return out, summary, claims


def replicate(
    protocol_path: Path,
    original: Path,
    *,
    out: Path | None = None,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> ReplicationOutcome:
    """`anistat verify PROTOCOL --against BUNDLE`: re-run, then compare with the original.
    An existing re-run bundle at `out` is replaced only with `overwrite=True`."""
    from .pipeline import run
    from .protocol import load_protocol

    ensure_bundle(original)
    protocol = load_protocol(protocol_path)
    replication_out = out or Path("reports") / f"{protocol.name}-replication"
    report_dir = replication_out.parent / f"{replication_out.name}-comparison"
    check_destination(report_dir)  # before the re-run (run checks its own --out first)
    run(protocol, replication_out, log=log, overwrite=overwrite)
    _, summary, claims = compare_bundles(
        original, replication_out, out=report_dir, tolerance=protocol.replication.tolerance
    )
    return ReplicationOutcome(report_dir, replication_out, claims, summary)
