"""The `anistat` command line (typer).

Nothing of the user's is ever deleted: a command that replaces a folder (`run --overwrite`,
`verify --against`, `compare`, `calibrate`, `report`'s re-rendered outputs) first checks that it
holds only what anistat wrote, and otherwise refuses in one line naming the unknown files.

Exit codes, one meaning each (`anistat.errors`, the table in docs/cli.md): 0 success; 1 a claim
failed (`run`, `verify`, `verify --against`); 2 input or environment the user can fix, or an
interrupted run (nothing half-written: no bundle, no staging directory; finished units stay in
the cache, the message says where, and a rerun resumes); 3 a verification or reproduction
mismatch (`verify`: a file differs from the manifest; `diff`: the rerun does not reproduce;
`verify --against`: a claim's verdict differs); 4 `run` wrote its bundle but some units failed
(e.g. NaN/Inf gradients; status=failed with the reason in results.csv, the report and the
manifest); 70 an internal error (a bug): one line naming the log file that holds the traceback.
Errors are always exactly one line on stderr, never a traceback. Results (tables, verdicts,
`--json`) go to stdout; progress, notes and warnings to stderr.
"""

from __future__ import annotations

import atexit
import gc
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import typer

from . import vocabulary as vocab
from .errors import (
    EXIT_CLAIM_FAILED,
    EXIT_INTERNAL_ERROR,
    EXIT_MISMATCH,
    EXIT_USER_ERROR,
    AnistatError,
    AnistatInputError,
    IncompleteRun,
    RunInterrupted,
)

if TYPE_CHECKING:  # the CLI imports the statistics lazily
    from .stats.calibrate import CalibrationResult
    from .stats.family_calibration import FamilyCalibration

app = typer.Typer(
    name="anistat",
    help="Test whether activation-derived low-rank directions capture a language model's true training "
    "gradients better than matched random controls.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


#: = anistat.comparison.DEFAULT_TOLERANCE.relative (a test keeps them equal; the CLI imports pandas lazily)
DEFAULT_RELATIVE = 0.01


def _or_list(names) -> str:
    """``a, b or c``: the names of a vocabulary table, for help text."""
    names = list(names)
    return f"{', '.join(names[:-1])} or {names[-1]}"


#: Help text of the options whose choices are a vocabulary table.
_SCENARIO_HELP = (
    "Scenarios (repeatable): " + ", ".join(f"{s.name} ({s.sentence})" for s in vocab.SCENARIOS.values()) + "."
)


def _echo(message: str) -> None:
    """A result line (stdout)."""
    typer.echo(message)


def _progress(message: str) -> None:
    """A progress, note or warning line (stderr: stdout carries only results)."""
    typer.echo(message, err=True)


#: `--trust-remote-code`, the caller's own consent to a protocol's `trust_remote_code: true`
TRUST_REMOTE_CODE_HELP = (
    "Allow models whose protocol entry sets trust_remote_code: true to run their own Python code. "
    "Without it such a protocol is refused before any model code is imported."
)
CACHE_DIR_HELP = (
    "Folder for the per-unit cache (default: $ANISTAT_CACHE_DIR, else .anistat-cache beside the bundle folder)."
)
WAIT_HELP = "If another run holds the bundle folder or the cache, wait for it instead of refusing."
MODEL_HELP = (
    "Measure this model with the default protocol, no YAML file needed (repeatable): a save_pretrained folder, "
    "a folder of checkpoint folders as PATH@step1000,step2000, or a hub id with revisions as ID@REV,REV."
)
DATA_HELP = "With --model: the corpus, a text or .jsonl file, a save_to_disk folder or a dataset NAME[:CONFIG] (default: the built-in one)."
RANKS_HELP = "With --model: the proxy ranks, comma-separated (e.g. 8,32; default: the protocol's default)."


def _ranks_option(ranks: str | None) -> list[int] | None:
    """``--ranks 8,32`` as integers (one line on stderr, exit 2, for anything else)."""
    if ranks is None:
        return None
    try:
        values = [int(part) for part in ranks.split(",") if part.strip()]
    except ValueError:
        raise AnistatInputError(f"--ranks {ranks}: expected comma-separated integers, e.g. 8,32") from None
    if not values:
        raise AnistatInputError("--ranks: name at least one rank, e.g. 8,32")
    return values


def _chosen_protocol(protocol: Path | None, models: list[str], data: str | None, ranks: str | None, out: Path | None):
    """The protocol a command measures: the file ``protocol``, or one built from ``--model``
    (`anistat.protocol.protocol_from_options`, named after ``--out``'s folder when given), with
    the YAML text that re-runs it (None for a protocol file)."""
    from .protocol import load_protocol, protocol_from_options, protocol_yaml

    if protocol is not None and (models or data is not None or ranks is not None):
        raise AnistatInputError("give either a protocol file or --model (with --data, --ranks), not both")
    if protocol is not None:
        return load_protocol(protocol), None
    if not models:
        raise AnistatInputError("name a protocol file, or a model with --model PATH_OR_HUB_ID (see --help)")
    built = protocol_from_options(models, data=data, ranks=_ranks_option(ranks), name=out.name if out else None)
    command = " ".join(
        ["anistat run", *(f"--model {m}" for m in models)]
        + ([f"--data {data}"] if data is not None else [])
        + ([f"--ranks {ranks}"] if ranks is not None else [])
    )
    return built, protocol_yaml(built, command)


@app.command()
def run(
    protocol: Path | None = typer.Argument(None, help="Protocol YAML file (or measure a model with --model)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Bundle directory (default: reports/<name>/)."),
    model: list[str] = typer.Option([], "--model", "-m", metavar="PATH_OR_HUB_ID", help=MODEL_HELP),
    data: str | None = typer.Option(None, "--data", metavar="FILE_OR_DATASET", help=DATA_HELP),
    ranks: str | None = typer.Option(None, "--ranks", metavar="K,K", help=RANKS_HELP),
    device: str | None = typer.Option(None, help="auto | cpu | cuda | mps (overrides the protocol)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
    keep_cache: bool = typer.Option(False, help="Keep the per-unit cache after success."),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace an existing bundle at --out. Only a folder holding nothing but what "
        "anistat wrote is replaced (the files its manifest lists and the fixed names of a bundle); any other file "
        "there (e.g. your notes) makes the run refuse before it starts: move it out or choose another --out.",
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        max=1024,
        help="CPU threads for torch and numpy's BLAS (overrides the protocol's threads; default: OMP_NUM_THREADS, "
        "else the idle usable CPUs). Built-in models always train on one thread.",
    ),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    wait: bool = typer.Option(False, "--wait", help=WAIT_HELP),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_REMOTE_CODE_HELP),
) -> None:
    """Run a protocol end to end and write its bundle.

    Without a protocol file, `--model` (with `--data`, `--ranks`) builds one from the defaults;
    the bundle then holds it as protocol.yaml, which `anistat run BUNDLE/protocol.yaml` re-runs.
    Every model and claim is checked first (the same preflight as `anistat validate`), before
    any model is trained or loaded. Exit codes: 0 done; 1 a claim failed; 2 invalid input or
    interrupted (nothing written; finished units stay in the cache the message names, and a
    rerun resumes from them); 4 bundle written but some units failed (see results.csv)."""
    from .pipeline import run as run_pipeline
    from .timing import StageTimer, summary

    if device is not None and device not in ("auto", "cpu", "cuda", "mps"):
        raise AnistatInputError(f"--device must be auto, cpu, cuda or mps, got '{device}'")
    chosen, built_yaml = _chosen_protocol(protocol, model, data, ranks, out)
    with StageTimer(include_start_up=True).activate():  # the manifest's stages count the process's start-up
        result = run_pipeline(
            chosen,
            out,
            bundle_files=None if built_yaml is None else {"protocol.yaml": built_yaml},
            device=device,
            threads=threads,
            log=None if quiet else _progress,
            keep_cache=keep_cache,
            overwrite=overwrite,
            cache_dir=cache_dir,
            wait=wait,
            trust_remote_code=trust_remote_code,
        )
    if quiet:  # the log said so already; a missing file of the bundle is said even with -q
        for name, reason in result.manifest.get("omitted_files", {}).items():
            _progress(f"note: {name} was not written: {reason}")
    if built_yaml is not None:
        _echo(
            f"protocol: {result.out / 'protocol.yaml'} (edit it, or run it again: anistat run {result.out / 'protocol.yaml'})"
        )
    failed_claims = [c for c in result.claims if not c["passed"]]
    for claim in result.claims:
        _echo_claim(claim)
    if not quiet and result.manifest.get("stages"):  # the last line: where the time went
        _echo(summary(result.manifest["stages"]))
    if result.failed_units:
        failed = [u for u in result.manifest.get("units", []) if u.get("status") != "ok"]
        first = f"; first: {failed[0]['id']}: {failed[0]['note']}" if failed else ""
        raise IncompleteRun(
            f"{result.failed_units} unit(s) failed; the bundle {result.out} was written with their rows marked "
            f"status=failed (see the 'note' column of results.csv){first}"
        )
    if failed_claims:
        raise typer.Exit(EXIT_CLAIM_FAILED)


def _echo_claim(record: dict) -> None:
    """A claim's verdict, the interval beside it, what decided it and, on a FAIL, what failed."""
    from .report import claim_outcome

    outcome = claim_outcome(record)
    _echo(f"claim {outcome.id}: {outcome.status.upper()} — {outcome.statement}")
    _echo(
        f"  {outcome.interval}"
        + (f" — {outcome.interval_of}" if outcome.interval_of else "")
        + (f"; decided by: {outcome.decided_by}" if outcome.decided_by else "")
    )
    if outcome.p_value:
        _echo(f"  {outcome.p_value}")
    for reason in outcome.failed:
        _echo(f"  failed: {reason}")


@app.command()
def validate(
    protocol: Path | None = typer.Argument(None, help="Protocol YAML file (or check a model with --model)."),
    model: list[str] = typer.Option([], "--model", "-m", metavar="PATH_OR_HUB_ID", help=MODEL_HELP),
    data: str | None = typer.Option(None, "--data", metavar="FILE_OR_DATASET", help=DATA_HELP),
    ranks: str | None = typer.Option(None, "--ranks", metavar="K,K", help=RANKS_HELP),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_REMOTE_CODE_HELP),
) -> None:
    """Check a protocol as `anistat run` would, without training or loading a model; print its
    name and sha256. With `--model` (and `--data`, `--ranks`), the protocol `anistat run` would
    build from the same options.

    Beyond the schema: local checkpoint folders exist (relative paths are relative to the
    protocol file), local/hub configs are read (no weights) to check ranks, controls, layers and
    site names against each model, each local checkpoint's tensor shapes (from its safetensors
    headers) against its config, and claims against the rows the run will write. A model that
    would run its own code (`trust_remote_code: true`) is refused unless --trust-remote-code is
    given, and named when it is; too few documents for the intervals is a warning."""
    from .preflight import preflight
    from .protocol import OPTIONS_SOURCE, require_remote_code_consent

    loaded, _ = _chosen_protocol(protocol, model, data, ranks, None)
    require_remote_code_consent(loaded, trust_remote_code)
    checked = preflight(loaded, for_run=False)
    _echo(f"{protocol or OPTIONS_SOURCE}: valid protocol '{loaded.name}' (sha256 {loaded.sha256()})")
    for planned in checked.models:
        sites = [s.name for s in planned.sites]
        shown = ", ".join(sites[:6]) + (f", … ({len(sites)} sites)" if len(sites) > 6 else "")
        _echo(
            f"  {planned.name}: {planned.source}, d={planned.hidden_size}, {planned.num_layers} layers, "
            f"{len(planned.checkpoints)} checkpoint(s), sites {shown}"
        )
    for note in checked.notes:
        _echo(f"  {note}")
    for spec in loaded.models:
        if spec.trust_remote_code:
            _echo(
                f"  {spec.name}: runs the model's own Python code (trust_remote_code, allowed by --trust-remote-code)"
            )
    for warning in checked.warnings:
        _progress(f"warning: {warning}")


@app.command()
def schema(out: Path | None = typer.Option(None, "--out", "-o", help="Write to a file instead of stdout.")) -> None:
    """Print the protocol's JSON Schema (for editor autocompletion)."""
    from .protocol import protocol_schema

    text = json.dumps(protocol_schema(), indent=2) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        _write_new_file(out, text, force=True)


@app.command()
def init(
    path: Path = typer.Argument(Path("anistat.yaml"), help="Where to write the starter protocol."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented starter protocol."""
    from .protocol import STARTER_PROTOCOL

    _write_new_file(path, STARTER_PROTOCOL, force=force)
    _echo(f"wrote {path}; next: anistat validate {path} && anistat run {path}")


@app.command()
def report(
    bundle: Path = typer.Argument(..., help="A bundle directory written by `anistat run`."),
    precision: int | None = typer.Option(None, min=1, max=8, help="Significant digits in tables."),
    metrics: str | None = typer.Option(None, help="Comma-separated metrics for the tables."),
    transpose: bool = typer.Option(False, help="Transposed table layout."),
    pdf: bool = typer.Option(
        True, help="Compile report.pdf when pdflatex is installed (--no-pdf keeps an existing report.pdf as it is)."
    ),
    allow_edited_data: bool = typer.Option(
        False,
        "--allow-edited-data",
        help="Re-render even though data files differ from the sha256 in the "
        "manifest; the manifest then records the edit and `verify` keeps reporting it.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
) -> None:
    """Re-render report.html, tables.tex and report.tex from results.csv + manifest.json alone.

    The bundle's integrity is checked first: data that differ from the manifest's sha256 are
    refused (exit 2) unless --allow-edited-data is given."""
    from .rerender import rerender

    written = rerender(
        bundle,
        precision=precision,
        metrics=metrics,
        transpose=transpose,
        compile_pdf=pdf,
        allow_edited_data=allow_edited_data,
        log=None if quiet else _progress,
    )
    _echo(f"re-rendered {len(written)} file(s) in {bundle}")


@app.command()
def plan(
    bundle: Path | None = typer.Argument(None, help="Pilot bundle: a small `anistat run` of the protocol to plan."),
    out: Path = typer.Option(Path("reports/plan"), "--out", "-o", help="Output directory."),
    ratio: float = typer.Option(
        ..., "--ratio", help="The effect to plan for: population energy ratio to the Haar expectation k/d (> 1)."
    ),
    half_width: float | None = typer.Option(
        None, "--half-width", help="Target half-width of the energy ratio's CI (ratio scale)."
    ),
    power: float = typer.Option(0.8, "--power", help="Target power of the data test and of the exact test."),
    alpha: float | None = typer.Option(None, "--alpha", help="Family level (default: the pilot's, else 0.05)."),
    multiplicity: str | None = typer.Option(
        None,
        "--multiplicity",
        help=f"{_or_list(vocab.MULTIPLICITY)} (default: the pilot's, else {vocab.DEFAULT_MULTIPLICITY}).",
    ),
    family_size: int | None = typer.Option(
        None, "--family-size", help="Tests in the family, m (default: the pilot's tests, else the ranks)."
    ),
    dim: int | None = typer.Option(None, "--dim", help="Stated inputs: hidden width d."),
    rank: list[int] = typer.Option([], "--rank", help="Stated inputs: rank k (repeatable)."),
    relative_sd: float | None = typer.Option(
        None, "--relative-sd", help="Stated inputs: per-document relative SD tau of the energy fraction."
    ),
    cv_proxy: float | None = typer.Option(None, "--cv-proxy", help="Stated inputs: CV of per-document proxy energy."),
    cv_total: float | None = typer.Option(None, "--cv-total", help="Stated inputs: CV of per-document total energy."),
    correlation: float = typer.Option(0.0, "--correlation", help="Stated inputs: correlation of the two energies."),
    participation_ratio: float | None = typer.Option(
        None, "--participation-ratio", help="Stated inputs: gradients' (Σλ)²/Σλ² (default d: isotropic)."
    ),
    pilot_documents: int | None = typer.Option(
        None, "--pilot-documents", help="Stated inputs: documents the law was estimated from (upper limit)."
    ),
    sequences_per_document: float = typer.Option(1.0, "--sequences-per-document", help="Stated inputs."),
    variance_confidence: float = typer.Option(
        0.8, "--variance-confidence", help="Confidence of the upper limit of the pilot's variance."
    ),
    conservative: bool = typer.Option(
        False, "--conservative", help="Size the protocol at the upper limit of the pilot's variance."
    ),
) -> None:
    """Plan a study: documents (test sequences) for a CI half-width and for the power of the data
    test and of the exact test at the family's corrected threshold, per unit kind, and the Haar
    draws; writes plan.csv, plan.html and (from a pilot bundle) a ready-to-run protocol.yaml."""
    from .bundle import check_destination
    from .plan import StatedInputs, plan_from_bundle, plan_from_inputs, terminal_text, write_plan

    given = dict(
        ratio=ratio,
        half_width=half_width,
        power=power,
        alpha=alpha,
        multiplicity=multiplicity,
        family_size=family_size,
        variance_confidence=variance_confidence,
    )
    stated = dim is not None or bool(rank) or relative_sd is not None or cv_proxy is not None
    if (bundle is None) == (not stated):
        raise AnistatInputError("give a pilot BUNDLE or stated inputs (--dim, --rank, --relative-sd), not both")
    check_destination(out)
    if bundle is not None:
        result = plan_from_bundle(bundle, given, conservative)
    else:
        if dim is None:
            raise AnistatInputError("stated inputs need --dim (the hidden width)")
        inputs = StatedInputs(
            dim,
            tuple(rank),
            relative_sd,
            cv_proxy,
            cv_total,
            correlation,
            participation_ratio,
            pilot_documents,
            sequences_per_document,
        )
        result = plan_from_inputs(inputs, given, conservative)
    written = write_plan(out, result)
    _echo(terminal_text(result))
    _echo(f"wrote {out}/ ({', '.join(written)})")


@app.command()
def calibrate(
    out: Path = typer.Option(Path("reports/calibration"), "--out", "-o", help="Output directory."),
    n_simulations: int = typer.Option(
        2000, min=10, max=1_000_000, help="Simulated studies per scenario and condition."
    ),
    seed: int = typer.Option(0, min=0, help="Seed of the simulation."),
    scenario: list[str] = typer.Option(
        list(vocab.SCENARIOS),
        "--scenario",
        help=_SCENARIO_HELP,
    ),
    n_documents: int = typer.Option(60, min=3, max=100_000, help="Documents per simulated study (the goals)."),
    coverage_documents: list[int] = typer.Option(
        [30, 200], "--coverage-documents", help="Other study sizes (repeatable) whose coverage is reported."
    ),
    family_simulations: int = typer.Option(
        1000,
        min=0,
        max=1_000_000,
        help="Simulated many-unit studies for Holm's FWER and BH's FDR with shared draws (0: skip).",
    ),
    ci_method: str = typer.Option(
        vocab.DEFAULT_CI_METHOD,
        help=f"CI method: {_or_list(vocab.CI_METHODS)}.",
    ),
    jobs: int = typer.Option(1, min=1, max=256, help="Worker processes (results do not depend on it)."),
) -> None:
    """Simulation study of the statistics engine under realistic nulls: type-I error of the exact
    test (all draws and sequential) and of the paper's normal-control convention, the data test,
    CI coverage at several study sizes, power, and multiplicity with draws shared by many units."""
    from .bundle import check_destination, staged_bundle, write_json
    from .calibration_report import write_calibration_report
    from .stats import run_calibration
    from .stats.family_calibration import run_family_calibration

    unknown = [s for s in scenario if s not in vocab.SCENARIOS]
    if unknown:
        raise AnistatInputError(f"--scenario must be among {', '.join(vocab.SCENARIOS)}, got '{unknown[0]}'")
    if ci_method not in vocab.CI_METHODS:
        raise AnistatInputError(f"--ci-method must be one of {', '.join(vocab.CI_METHODS)}, got '{ci_method}'")
    if any(n < 3 for n in coverage_documents):
        raise AnistatInputError("--coverage-documents must be at least 3")
    check_destination(out)  # before the simulation: a folder that cannot be replaced is said at once
    result = run_calibration(
        n_simulations=n_simulations,
        seed=seed,
        scenarios=tuple(scenario),
        n_documents=n_documents,
        coverage_documents=tuple(coverage_documents),
        n_jobs=jobs,
        ci_method=ci_method,
    )
    family = run_family_calibration(family_simulations, seed) if family_simulations else None
    with staged_bundle(out) as staging:
        write_calibration_report(result, staging, family)
        write_json(
            staging / "manifest.json",
            {
                "anistat_calibration": 3,
                "seed": seed,
                "n_simulations": n_simulations,
                "ci_method": ci_method,
                "settings": result.settings,
                "family_simulations": family_simulations,
            },
        )
    _echo_calibration_summary(result, family, scenario, n_documents, coverage_documents)
    _echo(f"wrote {out}/")


def _echo_calibration_summary(
    result: CalibrationResult,
    family: FamilyCalibration | None,
    scenario: list[str],
    n_documents: int,
    coverage_documents: list[int],
) -> None:
    """The calibration's summary lines: the uninformative proxy's rejection rates at the goal
    study size, the mean energy-ratio coverage per study size and scenario, each goal's verdict,
    and the family-wise error rates with shared draws."""
    import numpy as np

    from .stats.calibrate import RANDOM_PROXY, describe_goal
    from .stats.ratio_intervals import RATIO_INTERVAL_METHODS

    for row in result.conditions:
        if row["condition"] == RANDOM_PROXY and row["documents"] == n_documents:
            # ± is the 95 % Monte-Carlo margin of each rate (1.96 binomial standard errors)
            _echo(
                f"{row['scenario']}, uninformative proxy: P(p <= {result.settings['alpha']:g}) exact test "
                f"{row['rejection_exact']:.4f} ± {1.96 * row['rejection_exact_se']:.4f} (sequential "
                f"{row['rejection_exact_sequential']:.4f}), paper's normal controls "
                f"(20) {row['rejection_paper_normal_20']:.4f} ± {1.96 * row['rejection_paper_normal_20_se']:.4f}"
                " (not exact)"
            )
    for size in dict.fromkeys([n_documents, *coverage_documents]):
        rows = [r for r in result.conditions if r["documents"] == size]
        for name in scenario:
            mean = float(
                sum(r["coverage_ratio_normal_document"] for r in rows if r["scenario"] == name)
                / max(1, sum(r["scenario"] == name for r in rows))
            )
            methods = ", ".join(
                f"{method} {np.mean([r[f'coverage_method_{method}'] for r in rows if r['scenario'] == name]):.3f}"
                for method in RATIO_INTERVAL_METHODS
            )
            _echo(f"{name}, {size} documents: mean coverage of the energy ratio (normal) {mean:.4f}; haar: {methods}")
    for name, check in result.checks.items():
        _echo(describe_goal(name, check))
    if family is not None:
        for row in family.rows:
            if row["condition"].startswith("shared") and row["stop_after"]:
                fwer = "all null" in row["condition"]
                value, se = (row["fwer_holm"], row["fwer_holm_se"]) if fwer else (row[vocab.FDR_BH], row["fdr_bh_se"])
                _echo(
                    f"{row['condition']}: {'FWER (Holm)' if fwer else 'FDR (BH)'} {value:.4f} ± {1.96 * se:.4f} "
                    f"(bound {family.settings['alpha']:g})"
                )


@app.command()
def verify(
    target: Path = typer.Argument(..., help="A bundle, or a protocol to re-run (with --against)."),
    against: Path | None = typer.Option(None, "--against", help="Original bundle to compare a re-run with."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Where the re-run's bundle goes."),
    claims: Path | None = typer.Option(
        None,
        "--claims",
        help="Evaluate the claims in this YAML file (a list, or a protocol's 'claims:') against "
        "the bundle instead of its protocol's; nothing is re-run.",
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="With --against: replace an existing re-run bundle (only if it holds nothing but "
        "what anistat wrote; a file you added there makes the command refuse before the re-run).",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the integrity check and every claim record (the "
        "same records as claims.json) as one JSON document on stdout.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help=CACHE_DIR_HELP),
    wait: bool = typer.Option(False, "--wait", help=WAIT_HELP),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_REMOTE_CODE_HELP),
) -> None:
    """Check a bundle's integrity and claims, or re-run a protocol and compare with a bundle.

    Exit codes: 0 intact and every claim passes; 1 a claim fails; 3 a file differs from the
    manifest (or, with --against, a claim's verdict differs from the original's); 2 invalid
    input."""
    from .verify import load_claims, verify_bundle

    if claims is not None and against is not None:
        raise AnistatInputError(
            "--claims evaluates claims against an existing bundle; it cannot be combined with --against"
        )
    if as_json and against is not None:
        raise AnistatInputError(
            "--json reports a bundle's verification; with --against the comparison is written to comparison.json"
        )
    if against is None:
        new_claims = load_claims(claims) if claims is not None else None
        check = verify_bundle(target, new_claims, claims_source=str(claims) if claims is not None else None)
        if as_json:
            typer.echo(json.dumps(check.to_json(), indent=2, ensure_ascii=False, allow_nan=False))
            _exit_for_check(check)
            return
        for problem in check.problems:
            _echo(f"integrity: {problem}")
        if check.integrity_ok:
            _echo(f"integrity: all {check.files_checked} files match the manifest")
        if claims is not None:
            _echo(
                f"claims: {len(check.claims)} from {claims}, evaluated against the existing bundle {target} "
                "(not the claims of its protocol; nothing was re-run)"
            )
        for claim in check.claims:
            _echo_claim(claim)
        _exit_for_check(check)
        return
    _verify_against(target, against, out, quiet, overwrite, cache_dir, wait, trust_remote_code)


def _verify_against(
    target: Path,
    against: Path,
    out: Path | None,
    quiet: bool,
    overwrite: bool,
    cache_dir: Path | None,
    wait: bool,
    trust_remote_code: bool,
) -> None:
    """`verify PROTOCOL --against BUNDLE`: re-run, compare claim by claim; exit 3 when a verdict
    differs from the original's, 1 when they agree but a claim fails."""
    from .bundle import Bundle
    from .protocol import load_protocol, require_remote_code_consent
    from .replicate import replicate

    # check both inputs before a (possibly long) re-run, so a typo costs milliseconds
    require_remote_code_consent(load_protocol(target), trust_remote_code)
    original = Bundle.load(against)
    outcome = replicate(
        target,
        original,
        out=out,
        log=None if quiet else _progress,
        overwrite=overwrite,
        cache_dir=cache_dir,
        wait=wait,
        trust_remote_code=trust_remote_code,
    )
    for claim in outcome.claims:
        _echo(
            f"claim {claim['id']}: original {str(claim['original']).upper()}, replication "
            f"{str(claim['replication']).upper()} — {'agree' if claim['agree'] else 'DISAGREE'}"
        )
    _echo(f"replication report: {outcome.report_dir / 'comparison.html'}")
    if not all(claim["agree"] for claim in outcome.claims):
        raise typer.Exit(EXIT_MISMATCH)
    if not outcome.ok:
        raise typer.Exit(EXIT_CLAIM_FAILED)


def _exit_for_check(check) -> None:
    """`verify`'s exit: 3 when a file differs from the manifest (the numbers cannot be trusted,
    whatever the claims say), else 1 when a claim fails, else 0."""
    if not check.integrity_ok:
        raise typer.Exit(EXIT_MISMATCH)
    if not check.ok:
        raise typer.Exit(EXIT_CLAIM_FAILED)


@app.command()
def diff(
    original: Path = typer.Argument(..., help="The original bundle (e.g. reports/quickstart)."),
    rerun: Path = typer.Argument(..., help="A bundle of the same protocol, run again (another machine, thread count)."),
    relative: float = typer.Option(
        DEFAULT_RELATIVE,
        "--relative",
        min=0.0,
        max=1.0,
        help="Relative tolerance of continuous numbers, of their metric's scale.",
    ),
    show: int = typer.Option(10, "--show", min=0, max=100_000, help="Differences listed (the count is always given)."),
) -> None:
    """Does RERUN reproduce ORIGINAL? Compares results.csv, frequency.csv and the claims' verdicts
    number by number (never timestamps, paths or rendered files): counts, statuses and verdicts
    must be equal, continuous numbers within --relative of their scale, Monte-Carlo p-values and
    control statistics within two of their Monte-Carlo standard errors (see docs/reproducibility.md);
    protocols that differ only in file paths or names are "the same protocol up to paths".
    Exit 0 reproduced, 3 differences beyond the tolerance, 2 bad input."""
    from .comparison import Tolerance, compare

    check = compare(original, rerun, Tolerance(relative=relative))
    for note in check.notes:
        _progress(f"note: {note}")
    for difference in check.differences[:show]:
        _echo(f"differs: {difference.describe()}")
    if len(check.differences) > show:
        _echo(f"… and {len(check.differences) - show} more")
    verdict = "reproduces" if check.ok else "does NOT reproduce"
    _echo(f"{rerun} {verdict} {original}: {check.summary()}")
    if not check.ok:
        raise typer.Exit(EXIT_MISMATCH)


@app.command()
def compare(
    original: Path = typer.Argument(..., help="Original bundle."),
    replication: Path = typer.Argument(..., help="Replication bundle."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output directory (default: reports/compare-A-vs-B)."),
    tolerance: float = typer.Option(0.25, min=0.0, help="Relative tolerance for agreement."),
) -> None:
    """Write a replication report (HTML + LaTeX + CSV) comparing two bundles."""
    from .replicate import compare_bundles

    report_dir, summary, _ = compare_bundles(original, replication, out=out, tolerance=tolerance)
    _echo(
        f"wrote {report_dir}/comparison.html — "
        + ", ".join(f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}" for k, v in summary.items())
    )


@app.command()
def sites(
    model: str = typer.Argument(..., help="builtin:gpt2 | builtin:bert | minilm | a local model directory | a hub id."),
    revision: str | None = typer.Option(None, help="Hub revision (e.g. step1000)."),
    objective: str | None = typer.Option(None, help="clm | mlm (default: inferred from the architecture)."),
    modules: bool = typer.Option(False, "--modules", help="Also list every module usable as module:NAME."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Run model code from the checkpoint."),
) -> None:
    """List a model's measurement sites (one naming scheme across architectures)."""
    from .collect import list_sites
    from .models import inspect_model

    if objective is not None and objective not in ("clm", "mlm"):
        raise AnistatInputError(f"--objective must be clm or mlm, got '{objective}'")
    try:
        loaded = inspect_model(model, revision=revision, trust_remote_code=trust_remote_code, objective=objective)
    except AnistatInputError:
        if model.startswith("builtin:") or model == "minilm" or Path(model).exists():
            raise
        from .preflight import missing_revision_message

        message = missing_revision_message(model, revision, option="--revision {revision}")
        if message is None:
            raise
        raise AnistatInputError(f"model {message}") from None
    found = list_sites(loaded)
    width = max(len(site.name) for site in found)
    _echo(f"{model} ({type(loaded).__name__}): {len(found)} sites")
    for site in found:
        _echo(f"  {site.name:<{width}}  {site.module:<40}  {site.description}")
    if modules:
        _echo("modules (use as module:NAME in sites.names, or patterns in sites.modules):")
        for name, module in loaded.named_modules():
            if name:
                _echo(f"  module:{name}  ({type(module).__name__})")


@app.command()
def summary(
    bundle: Path = typer.Argument(..., help="A bundle directory written by `anistat run`."),
    as_json: bool = typer.Option(False, "--json", help="The rows as JSON on stdout."),
    precision: int | None = typer.Option(None, min=1, max=8, help="Significant digits (default: the protocol's)."),
) -> None:
    """Print the bundle's compact table: one row per claim and per headline cell (estimate, SE,
    interval, the test that decided, its p), as `anistat.load(BUNDLE).summary()` gives it."""
    from .bundle import Bundle

    table = Bundle.load(bundle).summary(precision)
    if as_json:
        sys.stdout.write(json.dumps(table.to_dict(), indent=2, allow_nan=False) + "\n")
    else:
        _echo(str(table))


@app.command()
def runs(
    folder: Path = typer.Argument(Path("."), help="Where to look (default: the current folder)."),
    as_json: bool = typer.Option(False, "--json", help="The bundles as JSON on stdout."),
) -> None:
    """List the bundles under a folder (searched 4 levels deep, newest first): name, finish time,
    models, units, claims passed/failed, size and path. Reads manifests only; writes nothing."""
    from .runs import MAX_DEPTH, find_bundles, runs_table

    if not folder.is_dir():
        raise AnistatInputError(f"{folder}: not a folder")
    found = find_bundles(folder, MAX_DEPTH)
    if as_json:
        sys.stdout.write(json.dumps([b.to_dict() for b in found], indent=2) + "\n")
    elif not found:
        _echo(f"no bundle under {folder} (searched {MAX_DEPTH} levels deep)")
    else:
        _echo(runs_table(found))


cache_app = typer.Typer(
    help="List or remove the per-unit caches runs keep for a resume (never a bundle).", no_args_is_help=True
)
app.add_typer(cache_app, name="cache")
CACHE_WHERE_HELP = (
    "A cache folder (a run's --cache-dir), or a folder whose .anistat-cache is meant "
    "(default: $ANISTAT_CACHE_DIR, else reports/.anistat-cache)."
)


@cache_app.command("list")
def cache_list(where: Path | None = typer.Argument(None, help=CACHE_WHERE_HELP)) -> None:
    """Show every cache: state (in use, resumable, finished, stale), size, finished units, the
    protocol and the bundle folder it was for."""
    from .caches import default_root, list_caches

    root = default_root(where)
    entries = list_caches(root)
    if not entries:
        _echo(f"{root}: no cache")
        return
    for entry in entries:
        _echo(
            f"{entry.state:<10} {entry.bytes / 1e6:9.1f} MB  {entry.units:5d} units  {entry.path}  "
            f"(protocol {entry.protocol}, --out {entry.out})"
        )
    _echo(f"{len(entries)} cache(s), {sum(e.bytes for e in entries) / 1e6:.1f} MB in {root}")


@cache_app.command("clean")
def cache_clean(
    where: Path | None = typer.Argument(None, help=CACHE_WHERE_HELP),
    all_resumable: bool = typer.Option(
        False, "--all", help="Also remove resumable caches (an interrupted run then starts over)."
    ),
) -> None:
    """Remove finished and stale caches (with --all also resumable ones); never a cache in use,
    never a bundle or any folder that is not a cache."""
    from .caches import clean_caches, default_root

    root = default_root(where)
    removed = clean_caches(root, all_resumable=all_resumable)
    for entry in removed:
        _echo(f"removed {entry.state} cache {entry.path} ({entry.bytes / 1e6:.1f} MB)")
    _echo(f"removed {len(removed)} cache(s), {sum(e.bytes for e in removed) / 1e6:.1f} MB")


def _write_new_file(path: Path, text: str, *, force: bool) -> None:
    if path.exists() and not force:
        raise AnistatInputError(f"{path} exists; use --force to overwrite")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise AnistatInputError(f"cannot write {path} ({error.strerror})") from None


def _click_exceptions() -> dict[str, tuple[type[BaseException], ...]]:
    """The exception classes of whichever click typer runs on: recent typer vendors its own copy
    (`typer._click`, whose classes are *not* the `click` package's), older typer uses click."""
    modules = [click.exceptions]
    try:
        from typer._click import exceptions as vendored  # typer >= 0.2x

        modules.append(vendored)
    except ImportError:  # pragma: no cover - older typer
        pass
    import typer.exceptions as typer_exceptions

    def classes(name: str) -> tuple[type[BaseException], ...]:
        found = [getattr(m, name) for m in (*modules, typer_exceptions) if hasattr(m, name)]
        return tuple(dict.fromkeys(found))

    return {name: classes(name) for name in ("NoArgsIsHelpError", "UsageError", "Exit", "Abort", "ClickException")}


def _quiet_libraries() -> None:
    """Keep stderr for anistat's own one-line errors: no progress bars or advisory log lines from
    transformers / huggingface_hub (anistat's progress goes to stdout)."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # e.g. "Retrying in 1s" while the hub is unreachable
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" in sys.modules:  # already imported (e.g. called in-process): configure it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """Console entry point: one line on stderr and exit 2 for any user error (see module doc)."""
    errors = _click_exceptions()
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the process's own command: at its exit the interpreter's teardown need not walk
        atexit.register(gc.freeze)  # every object of torch & co. (seconds on a loaded 2-core machine)
    previous_sigterm = _sigterm_as_interrupt()
    _quiet_libraries()
    try:
        # Not `app(...)`: typer's wrapper turns Ctrl-C into a silent exit code 130 and click's
        # into Abort; invoking the command directly lets every case below be handled here.
        command = typer.main.get_command(app)
        with command.make_context("anistat", args) as ctx:
            code = command.invoke(ctx)
    except AnistatError as error:
        typer.echo(f"anistat: error: {error}", err=True)
        return error.exit_code
    except RunInterrupted as interrupt:  # `run` (and `verify --against`'s re-run) say where finished units are
        typer.echo(f"anistat: error: {interrupt.describe()}", err=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        typer.echo("anistat: error: interrupted; nothing was written", err=True)
        return EXIT_USER_ERROR
    except errors["NoArgsIsHelpError"] as error:
        help_context = getattr(error, "ctx", None)  # click sets it; the class tuple is typed as BaseException
        typer.echo(help_context.get_help() if help_context is not None else str(error))
        return 0
    except errors["Exit"] as error:
        return int(getattr(error, "exit_code", 0) or 0)
    except errors["Abort"]:
        typer.echo("anistat: error: aborted", err=True)
        return EXIT_USER_ERROR
    except errors["ClickException"] as error:  # usage errors included
        format_message = getattr(error, "format_message", None)
        message = format_message() if callable(format_message) else str(error)
        typer.echo(f"anistat: error: {' '.join(message.split())}", err=True)
        return EXIT_USER_ERROR
    except OSError as error:
        import errno as errno_names

        if error.errno == errno_names.EPIPE:  # `anistat schema | head`: the reader went away
            return 0
        return _environment_error(error) or _internal_error(error, args)
    except Exception as error:  # noqa: BLE001 - a bug: its own exit code, the traceback in a file
        return _internal_error(error, args)
    finally:
        _restore_sigterm(previous_sigterm)
    return code if isinstance(code, int) else 0


#: OS errors a user fixes (a full, read-only or forbidden disk, too many open files): exit 2
#: wherever they surface, with the fix for their cause.
_ENVIRONMENT_ERRNOS = ("ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM", "EMFILE", "ENFILE")


def _environment_error(error: OSError) -> int | None:
    """A disk or resource error no stage turned into its own message: one line naming the file
    and the fix, exit 2 (None for any other OSError)."""
    import errno as errno_names

    from .bundle import write_hint

    name = errno_names.errorcode.get(error.errno or 0, "")
    if name not in _ENVIRONMENT_ERRNOS:
        return None
    reason = error.strerror or name
    where = f"{error.filename}: " if error.filename else ""
    typer.echo(f"anistat: error: {where}{reason}; {write_hint(reason, name)}", err=True)
    return EXIT_USER_ERROR


def _internal_error(error: BaseException, args: list[str]) -> int:
    """A bug in anistat: the traceback goes to a log file (the cache folder named by
    ANISTAT_CACHE_DIR when set and writable, else the temporary folder), and one line on stderr
    names it and what to report. Exit code 70 (EX_SOFTWARE), never 1 (a failed claim)."""
    import os
    import platform
    import tempfile
    import time
    import traceback

    from ._version import __version__

    text = (
        f"anistat {__version__}, Python {platform.python_version()}, {platform.platform()}\n"
        f"command: anistat {' '.join(args)}\n\n" + "".join(traceback.format_exception(error))
    )
    stamp = time.strftime("%Y%m%dT%H%M%S")
    log_file = None
    for folder in (os.environ.get("ANISTAT_CACHE_DIR"), tempfile.gettempdir()):
        if not folder:
            continue
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            candidate = Path(folder) / f"anistat-error-{stamp}-{os.getpid()}.log"
            candidate.write_text(text, encoding="utf-8")
            log_file = candidate
            break
        except OSError:
            continue
    where = f"the traceback is in {log_file}" if log_file else "the traceback could not be written to a file"
    summary = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    typer.echo(
        f"anistat: internal error ({summary}); this is a bug in anistat, not in your input: {where}; "
        "please report it to the anistat maintainers with that file and the command you ran",
        err=True,
    )
    return EXIT_INTERNAL_ERROR


def _sigterm_as_interrupt():
    """Treat SIGTERM (what schedulers and `kill` send) like Ctrl-C, so the staged bundle is
    cleaned up and the one-line message printed. Only in the main thread (signal's rule)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except (ValueError, OSError):  # pragma: no cover - exotic embedding
        return None


def _restore_sigterm(previous) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
