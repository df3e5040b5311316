"""Replication: re-run a protocol here and compare with someone's bundle, claim by claim, and the
replication report of two bundles (`anistat compare`) — both read the one comparison of
:func:`anistat.comparison.compare`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .bundle import Bundle, as_bundle, check_destination, staged_bundle, utc_now
from .comparison import DEFAULT_TOLERANCE, Tolerance, compare
from .errors import AnistatInputError
from .report.comparison import ComparisonInputs, render_comparison_html, render_comparison_tex


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
    original: Bundle | Path,
    replication: Bundle | Path,
    *,
    out: Path | None = None,
    tolerance: float = DEFAULT_TOLERANCE.agreement,
) -> tuple[Path, dict, list[dict]]:
    """Replication report for two existing bundles (a path is read with :meth:`Bundle.load`),
    written to ``out`` (checked before the comparison); returns (report directory, summary,
    claims compared claim by claim)."""
    a, b = as_bundle(original), as_bundle(replication)
    out = out or Path("reports") / f"compare-{a.path.name}-vs-{b.path.name}"
    check_destination(out)  # before the comparison: a folder that cannot be replaced is said at once
    comparison = compare(a, b, Tolerance(agreement=tolerance))
    if comparison.rows.empty:
        raise AnistatInputError(
            f"{a.path} and {b.path} have no result row in common (same model, checkpoint, site, rank, "
            "proxy, control and metric, with an estimate in both); compare two bundles of the same protocol"
        )
    summary = comparison.agreement()
    inputs = ComparisonInputs(
        comparison=comparison.rows,
        claims=comparison.claims,
        environment=comparison.environment,
        summary=summary,
        titles=(str(a.path), str(b.path)),
    )
    with staged_bundle(out) as staging:
        write_comparison(staging, inputs)
        (staging / "manifest.json").write_text('{"anistat_comparison": 1}\n')
    return out, summary, list(comparison.claims)


def write_comparison(out: Path, inputs: ComparisonInputs) -> list[Path]:
    """comparison.csv / .json / .html / .tex into `out` (an existing directory); the HTML and the
    LaTeX are rendered by :mod:`anistat.report.comparison`."""
    inputs.comparison.to_csv(out / "comparison.csv", index=False, float_format="%.10g", lineterminator="\n")
    (out / "comparison.json").write_text(
        json.dumps(
            {
                "original": inputs.titles[0],
                "replication": inputs.titles[1],
                "summary": dict(inputs.summary),
                "claims": [dict(c) for c in inputs.claims],
                "environment": [dict(r) for r in inputs.environment],
                "written_at": utc_now(),
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    (out / "comparison.html").write_text(render_comparison_html(inputs))
    (out / "comparison.tex").write_text(render_comparison_tex(inputs))
    return [out / n for n in ("comparison.csv", "comparison.json", "comparison.html", "comparison.tex")]


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
    original = as_bundle(original)
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
