"""Replication: re-run a protocol here and compare with someone's bundle, claim by claim."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .bundle import staged_bundle
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


def compare_bundles(original: Path, replication: Path, *, out: Path | None = None,
                    tolerance: float = 0.25) -> tuple[Path, dict, list[dict]]:
    """Replication report for two existing bundles; returns (report directory, summary, claims
    compared claim by claim)."""
    ensure_bundle(original)
    ensure_bundle(replication)
    results_a, manifest_a = load_bundle_results(original)
    results_b, manifest_b = load_bundle_results(replication)
    comparison = compare_results(results_a, results_b, tolerance=tolerance)
    claims = compare_claims(verify_bundle(original).claims, verify_bundle(replication).claims)
    summary = summarise(comparison)
    out = out or Path("reports") / f"compare-{original.name}-vs-{replication.name}"
    with staged_bundle(out) as staging:
        write_comparison(staging, comparison, claims, environment_differences(manifest_a, manifest_b), summary,
                         (str(original), str(replication)))
        (staging / "manifest.json").write_text('{"anistat_comparison": 1}\n')
    return out, summary, claims


def replicate(protocol_path: Path, original: Path, *, out: Path | None = None,
              log: Callable[[str], None] | None = None, overwrite: bool = False) -> ReplicationOutcome:
    """`anistat verify PROTOCOL --against BUNDLE`: re-run, then compare with the original.
    An existing re-run bundle at `out` is replaced only with `overwrite=True`."""
    from .pipeline import run
    from .protocol import load_protocol

    ensure_bundle(original)
    protocol = load_protocol(protocol_path)
    replication_out = out or Path("reports") / f"{protocol.name}-replication"
    run(protocol, replication_out, log=log, overwrite=overwrite)
    report_dir = replication_out.parent / f"{replication_out.name}-comparison"
    _, summary, claims = compare_bundles(original, replication_out, out=report_dir,
                                         tolerance=protocol.replication.tolerance)
    return ReplicationOutcome(report_dir, replication_out, claims, summary)
