"""`anistat.run`: protocol → collect → analyze → report → bundle.

The plan is model × checkpoint × site ("units"). Each finished unit is stored in a cache keyed
by the protocol hash, so an interrupted run resumes where it stopped and ends with the same
numbers; the bundle itself appears only when everything is done (atomic rename).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from . import timing, workers
from .analyze import analyze_run
from .bundle import RunResult, check_destination, utc_now, write_hint, write_json
from .collect import (
    BasisSet,
    FitSampler,
    Site,
    UnitArtifact,
    UnitKey,
    autocast,
    concept_cards,
    distributed,
    measure_checkpoint,
    model_inputs,
    probe,
    resolve_precision,
    sites_from_spec,
)
from .collect.artifact import ARTIFACT_FORMAT
from .collect.bases import check_fit_sample, fit_site_bases, fits_frozen, fits_per_unit, site_seed_key
from .collect.progress import bar
from .collect.sites import site_calls
from .corpus import load_corpus
from .errors import AnistatInputError, CheckpointLoadError, RunInterrupted
from .finalize import analyse_and_publish
from .geometry import frequency_buckets
from .locking import LockHeld, bundle_lock_path, cache_lock_path, exclusive
from .models import Checkpoint, ModelSeries, resolve_models
from .preflight import localized, preflight
from .protocol import Protocol, fit_window_size, load_protocol, require_remote_code_consent
from .runtime import MAX_THREADS, ThreadChoice, cpu_threads, resolve_threads
from .seeding import derive_seed

Log = Callable[[str], None]


def resolve_device(requested: str) -> torch.device:
    """`auto | cpu | cuda | mps` → a torch device. Under torchrun (WORLD_SIZE > 1) this also
    initialises the process group (NCCL on CUDA, gloo otherwise) and gives each rank the GPU
    `cuda:LOCAL_RANK`."""
    if requested not in ("auto", "cpu", "cuda", "mps"):
        raise AnistatInputError(f"device must be auto, cpu, cuda or mps, got '{requested}'")
    mps_ok = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "mps" if mps_ok else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise AnistatInputError("device 'cuda' requested but no CUDA device is available")
    if requested == "mps" and not mps_ok:
        raise AnistatInputError("device 'mps' requested but MPS is not available")
    if distributed.requested_world_size() > 1:
        if requested == "mps":
            raise AnistatInputError("torchrun with device 'mps' is not supported; use cpu or cuda")
        distributed.init_distributed(requested)
        if requested == "cuda":
            torch.cuda.set_device(distributed.local_rank())
            return torch.device("cuda", distributed.local_rank())
    return torch.device(requested)


def default_out(protocol: Protocol) -> Path:
    return Path("reports") / protocol.name


#: The environment variable that chooses the cache folder when `--cache-dir` is not given.
CACHE_DIR_VARIABLE = "ANISTAT_CACHE_DIR"


def cache_root(out: Path, chosen: str | Path | None = None) -> Path:
    """The folder holding the per-unit caches of runs: `chosen` (`--cache-dir`), else the
    environment variable `ANISTAT_CACHE_DIR`, else `.anistat-cache` beside the bundle folder."""
    if chosen is not None and str(chosen):
        return Path(chosen).expanduser()
    if os.environ.get(CACHE_DIR_VARIABLE):
        return Path(os.environ[CACHE_DIR_VARIABLE]).expanduser()
    return (out.parent if str(out.parent) else Path(".")) / ".anistat-cache"


def cache_dir(out: Path, protocol_sha: str, root: str | Path | None = None) -> Path:
    """Where the finished units of a run wait for a resume: in `cache_root`, keyed by the bundle
    name, the protocol hash and the artifact format (units written by an anistat whose artifacts
    hold different statistics are never mixed into a run)."""
    return cache_root(out, root) / f"{out.name}-{protocol_sha[:16]}-a{ARTIFACT_FORMAT}"


# ----------------------------------------------------------------------------------------------
# phase 1: proxies and controls
# ----------------------------------------------------------------------------------------------
class _SitesRecorded(BaseException):
    """Raised inside a fit forward once every site holds its final activation (`_FitForwardCut`).
    A `BaseException`, so a model's own `except Exception` fallback cannot swallow it."""


class _FitForwardCut:
    """Ends a fit-split forward pass as soon as the probed sites are recorded.

    The fit forward only feeds the sites' activations; what follows the last site (the later
    blocks, the final norm and the LM head, whose vocabulary-sized logits cost about a third of
    a Pythia-sized forward) is never read. The probe keeps a module's *last* output of a forward
    and a module shared across depth fires more than once, so the number of calls per site is
    learnt first (`learn`: one full forward of a few tokens of one sequence, so no fit batch
    pays for the LM head), and the fit forwards stop right after every site has fired that many
    times: the recorded activations are the same tensors, bit for bit. A
    forward that ends without the stop (fewer calls than learnt) simply runs to the end. This
    assumes a site fires equally often in every forward (true of the transformer blocks and
    their submodules; a module site whose call count depended on the data, e.g. a routed expert,
    would be cut at the learnt count)."""

    def __init__(self, sites: dict[str, Site]):
        self.sites = sites
        self.expected: dict[str, int] | None = None
        self.n_cut = 0  # forwards ended early

    @contextlib.contextmanager
    def armed(self, model: torch.nn.Module):
        """Count site calls during one forward (entered inside `probe`, so the probe's own hook
        runs first); raise `_SitesRecorded` once the learnt counts are reached."""
        calls = {name: 0 for name in self.sites}
        expected = self.expected

        def counted(name: str) -> None:
            calls[name] += 1
            if expected is not None and all(calls[n] >= expected[n] for n in expected):
                raise _SitesRecorded

        try:
            with site_calls(model, self.sites, counted):
                yield
        except _SitesRecorded:
            self.n_cut += 1
            return
        if self.expected is None:
            self.expected = dict(calls)

    #: tokens of the first fit sequence run through the model to learn the call counts: the calls
    #: per forward do not depend on the length, and a short forward's LM head costs nothing
    LEARN_TOKENS = 8

    def learn(self, model: torch.nn.Module, inputs: torch.Tensor) -> None:
        """Learn each site's calls per forward from one full forward of ``inputs`` (B, T)."""
        with torch.no_grad(), self.armed(model):
            model(input_ids=inputs[:1, : self.LEARN_TOKENS])


def fit_bases(
    series: ModelSeries,
    sites: list[Site],
    protocol: Protocol,
    device: torch.device,
    log: Log,
    refit_at: int | None = None,
) -> tuple[dict[str, list[BasisSet]], dict[str, Any]]:
    """Fit every proxy on the early window (pooled fit-split activations), draw its controls
    (the one fit core, `collect.bases.fit_site_bases`, which the training meter uses too).

    With `refit_at = i`, fit instead on checkpoint i's own fit-split activations (protocol
    `proxies.refit`): the proxies are labelled `METHOD@refit`, their seeds name the checkpoint,
    and no concept cards are made. Each method expands to its centring variants
    (`geometry.proxy_variants`, protocol `proxies.center`).

    Activations stream through a `FitSampler`: only the protocol's `max_fit_tokens` sampled rows
    per site are kept. Under torchrun fit batches are sharded and the sample all-reduced; every
    rank then fits the same proxies (rank 0's are broadcast, so GPU nondeterminism cannot split
    them). Returns bases keyed by site name."""
    spec, seed = series.spec, protocol.seed
    n_early = fit_window_size(len(series.checkpoints), protocol.proxies.fit_window)
    window = series.checkpoints[:n_early] if refit_at is None else [series.checkpoints[refit_at]]
    fit_inputs, _ = model_inputs(
        series.splits.fit, series.splits, series.objective, protocol.data.mlm_probability, seed, "fit"
    )
    by_name = {site.name: site for site in sites}
    sampler = FitSampler(
        by_name,
        n_checkpoints=len(window),
        token_ids=fit_inputs,
        max_tokens=protocol.proxies.max_fit_tokens,
        seeds={name: derive_seed(seed, spec.name, site_seed_key(site), "fit-sample") for name, site in by_name.items()},
    )
    precision = resolve_precision(device, spec.precision)
    batch_size = protocol.data.batch_size
    starts = list(range(0, fit_inputs.shape[0], batch_size))
    progress = bar(len(window) * len(starts), f"{spec.name} fit", unit="batch")
    cut = _FitForwardCut(by_name)
    for c, checkpoint in enumerate(window):
        model = checkpoint.load()
        with timing.stage("fit pass"):
            model.to(device)
            model.eval()
            if cut.expected is None:
                cut.learn(model, fit_inputs.to(device))
            for b, start in enumerate(starts):
                if not distributed.owns(b):
                    continue
                batch = fit_inputs[start : start + batch_size].to(device)
                with (
                    torch.no_grad(),
                    autocast(device, precision),
                    probe(model, by_name, gradients=False) as record,
                    cut.armed(model),
                ):
                    model(input_ids=batch)
                for name in by_name:
                    sampler.add(name, c, start, record.activations[name])
                progress.update(1)
        del model  # one checkpoint's weights resident at a time: let it go before the next loads
    progress.close()
    bases: dict[str, list[BasisSet]] = {}
    n_tokens = 0
    decode = _memoized_decode(series.splits.decode)
    card_tokens = protocol.proxies.concept_card_tokens
    for name, site in by_name.items():
        with timing.stage("fit pass"):
            sample = sampler.finish(name)
        n_tokens = int(sample.activations.shape[0])
        # the preflight checked the hidden size; a module site's width is known only now
        check_fit_sample(sample.activations, protocol, f"models.{spec.name}", name, "the fit split")
        with timing.stage("proxy fits and controls"):
            bases[name] = fit_site_bases(
                sample.activations,
                protocol,
                model=spec.name,
                site_key=site_seed_key(site),
                device=device,
                refit_label=None if refit_at is None else window[0].label,
                cards=lambda basis, sample=sample: _timed_cards(sample, basis, fit_inputs, decode, card_tokens),
                broadcast=distributed.broadcast_,
            )
    if refit_at is not None:
        return bases, {}
    log(
        f"  {spec.name}: proxies fitted on {n_early} early checkpoint(s) "
        f"({', '.join(c.label for c in window)}), {n_tokens} tokens per site"
    )
    return bases, {"fit_checkpoints": [c.label for c in window], "fit_tokens_per_site": n_tokens}


def _timed_cards(sample: Any, basis: Any, fit_inputs: torch.Tensor, decode: Any, card_tokens: int) -> Any:
    """Concept cards, charged to their own stage (nested inside the proxy fits)."""
    with timing.stage("concept cards"):
        return concept_cards(sample, basis, fit_inputs, decode, card_tokens)


def _memoized_decode(decode: Callable[[list[int]], str]) -> Callable[[list[int]], str]:
    """`decode` with a cache: concept cards decode the same tokens and contexts many times."""
    cached = functools.lru_cache(maxsize=None)(lambda ids: decode(list(ids)))
    return lambda ids: cached(tuple(ids))


# ----------------------------------------------------------------------------------------------
# collection
# ----------------------------------------------------------------------------------------------
class UnitWriter:
    """Writes measured units into the cache on one background thread, so that the writes — a
    few hundred MB at the paper's settings — overlap the next checkpoint's pass and the analysis
    instead of holding them up. Each unit is handed over as a shallow copy (the analysis may
    mark the original failed meanwhile). A failed write is raised by the next `save` (so a full
    disk stops a long collection one checkpoint later, not at its end) or by `wait`; leaving the
    block waits for every write, so a run that stops keeps each unit it finished."""

    def __init__(self) -> None:
        from concurrent.futures import Future, ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(1, thread_name_prefix="anistat-cache-writer")
        self._pending: list[Future[Path]] = []

    def __enter__(self) -> UnitWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True)

    def save(self, artifact: UnitArtifact, directory: Path) -> None:
        for write in [w for w in self._pending if w.done()]:
            self._pending.remove(write)
            write.result()  # raises the write's error
        self._pending.append(self._pool.submit(copy.copy(artifact).save, directory))

    def wait(self) -> None:
        """Every unit handed over is on disk (or its write's error is raised here)."""
        with timing.stage("cache writes"):
            pending, self._pending = self._pending, []
            for write in pending:
                write.result()


def collect_units(
    protocol: Protocol, device: torch.device, cache: Path, log: Log, writer: UnitWriter | None = None
) -> tuple[list[UnitArtifact], dict]:
    """Phases 1 and 2 for every model; finished units come from / go to `cache`.

    Units are stored as `<cache>/units/<unit id>.json|npz` (the cache directory is keyed by the
    protocol hash), handed to `writer` as soon as a checkpoint is measured (written in the
    background; without a `writer`, by one of its own that is waited for before this returns);
    a rerun skips finished checkpoints, so an interrupted run resumes and ends with the same
    numbers. Under torchrun only rank 0 logs and writes; every rank returns the same artifacts."""
    if writer is not None:
        return _collect_units(protocol, device, cache, log, writer)
    with UnitWriter() as own:
        collected = _collect_units(protocol, device, cache, log, own)
        own.wait()
    return collected


def _collect_units(
    protocol: Protocol, device: torch.device, cache: Path, log: Log, writer: UnitWriter
) -> tuple[list[UnitArtifact], dict]:
    main = distributed.is_main()
    if not main:
        log = lambda message: None  # noqa: E731
    models, data = localized(protocol)  # relative paths resolve against the protocol file's folder
    corpus = load_corpus(data)
    log(
        f"corpus {corpus.name}: {len(corpus.documents)} documents"
        + (f"; {distributed.world_size()} processes" if distributed.active() else "")
    )
    for warning in corpus.warnings:
        log(f"warning: {warning}")
    artifacts: list[UnitArtifact] = []
    info: dict[str, Any] = {
        "corpus": {"name": corpus.name, "sha256": corpus.sha256, "documents": len(corpus.documents)},
        "models": {},
        "concept_cards": [],
        "frequency": {},
        "warnings": list(corpus.warnings),
    }
    units_dir = cache / "units"
    for series in resolve_models(models, corpus, data, protocol.seed, log):
        spec = series.spec
        sites = sites_from_spec(series.checkpoints[0].load(), protocol.sites, spec.name)
        n_early = fit_window_size(len(series.checkpoints), protocol.proxies.fit_window)
        keys = _unit_keys(series, sites, n_early)
        cached = {k: units_dir / f"{key.id}.json" for k, key in keys.items()}
        bases, fit_info = None, {}
        model_started = time.perf_counter()
        buckets = torch.as_tensor(frequency_buckets(series.splits.token_counts, protocol.data.n_frequency_buckets))
        units_bar = bar(len(series.checkpoints) * len(sites), f"{spec.name} units", unit="unit")
        for i, checkpoint in enumerate(series.checkpoints):
            if distributed.agree(all(cached[(i, site.name)].is_file() for site in sites)):
                artifacts.extend(UnitArtifact.load(cached[(i, site.name)]) for site in sites)
                log(f"  {spec.name} {checkpoint.label}: resumed from cache")
                units_bar.update(len(sites))
                continue
            if bases is None:
                bases, fit_info = (
                    fit_bases(series, sites, protocol, device, log)
                    if fits_frozen(protocol)
                    else ({site.name: [] for site in sites}, {})
                )
            unit_bases = bases
            if fits_per_unit(protocol):
                refitted, _ = fit_bases(series, sites, protocol, device, log, refit_at=i)
                unit_bases = {name: bases[name] + refitted[name] for name in bases}
            with timing.stage("test pass"):
                measured = _measure_units(
                    protocol,
                    series,
                    checkpoint,
                    {site.name: keys[(i, site.name)] for site in sites},
                    unit_bases,
                    buckets,
                    device,
                )
            for site in sites:
                if main:
                    writer.save(measured[site.name], units_dir)
                artifacts.append(measured[site.name])
            distributed.barrier()
            units_bar.update(len(sites))
            failed = [name for name in measured if measured[name].status != "ok"]
            log(
                f"  {spec.name} {checkpoint.label}: measured {len(sites)} site(s)"
                + (f", {len(failed)} FAILED" if failed else "")
            )
        units_bar.close()
        if bases is not None:
            info["concept_cards"].extend(_concept_card_records(spec.name, sites, bases))
        info["models"][spec.name] = _model_info(series, sites, protocol, device, fit_info, model_started)
        info["frequency"][spec.name] = series.splits.token_counts
    return artifacts, info


def _unit_keys(series: ModelSeries, sites: list[Site], n_early: int) -> dict[tuple[int, str], UnitKey]:
    """The key of every (checkpoint index, site name) unit of a model; the first `n_early`
    checkpoints form the early window."""
    spec = series.spec
    return {
        (i, site.name): UnitKey(
            spec.name,
            series.objective,
            checkpoint.label,
            checkpoint.step,
            "early" if i < n_early else "late",
            site.layer,
            site.name,
        )
        for i, checkpoint in enumerate(series.checkpoints)
        for site in sites
    }


def _measure_units(
    protocol: Protocol,
    series: ModelSeries,
    checkpoint: Checkpoint,
    keys: dict[str, UnitKey],
    bases: dict[str, list[BasisSet]],
    buckets: torch.Tensor,
    device: torch.device,
) -> dict[str, UnitArtifact]:
    """Phase 2 for one checkpoint: every site's unit measured against its bases, with the
    protocol's data and statistics settings."""
    spec = series.spec
    return measure_checkpoint(
        checkpoint.load(),
        keys=keys,
        bases=bases,
        splits=series.splits,
        objective=series.objective,
        token_bucket=buckets,
        n_buckets=protocol.data.n_frequency_buckets,
        mlm_probability=protocol.data.mlm_probability,
        seed=protocol.seed,
        batch_size=protocol.data.batch_size,
        device=device,
        isoscore_c0=protocol.stats.isoscore_c0,
        isoscore_zeta=protocol.stats.isoscore_zeta,
        precision=spec.precision,
        progress_label=f"{spec.name} {checkpoint.label}",
        pair_budget_bytes=int(protocol.data.frequency_ci_memory_mb * 2**20),
        type_budget_bytes=protocol.data.type_statistics_memory_mb * 2**20,
        loss_reduction=protocol.data.loss_reduction,
    )


def _concept_card_records(model: str, sites: list[Site], bases: dict[str, list[BasisSet]]) -> list[dict[str, Any]]:
    """The manifest's concept cards of one model: every fitted basis set's cards, with their unit."""
    return [
        {
            "model": model,
            "layer": site.layer,
            "site": site.name,
            "proxy": basis_set.proxy,
            "rank": basis_set.rank,
            **card,
        }
        for site in sites
        for basis_set in bases[site.name]
        for card in basis_set.concept_cards
    ]


def _model_info(
    series: ModelSeries,
    sites: list[Site],
    protocol: Protocol,
    device: torch.device,
    fit_info: dict[str, Any],
    model_started: float,
) -> dict[str, Any]:
    """The manifest's record of one model: its series, sites, checkpoints, precision, the proxies'
    fit and the seconds since `model_started`."""
    spec = series.spec
    return {
        **series.info,
        "objective": series.objective,
        "hidden_size": series.hidden_size,
        "num_layers": series.num_layers,
        "layers": sorted({s.layer for s in sites}),
        "sites": [s.name for s in sites],
        "precision": resolve_precision(device, spec.precision),
        "checkpoints": [{"label": c.label, "step": c.step, "revision": c.revision} for c in series.checkpoints],
        "tokenizer_vocab": series.splits.vocab_size,
        **fit_info,
        "proxy_refit": protocol.proxies.refit,
        # the caller's consent to the model's own code (run refuses trust_remote_code without it)
        **({"trust_remote_code_consent": "--trust-remote-code"} if spec.trust_remote_code else {}),
        "seconds": round(time.perf_counter() - model_started, 3),
    }


# ----------------------------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------------------------
def run(
    protocol: Protocol | str | Path,
    out: str | Path | None = None,
    *,
    device: str | None = None,
    threads: int | None = None,
    log: Log | None = None,
    keep_cache: bool = False,
    overwrite: bool = False,
    cache_dir: str | Path | None = None,
    wait: bool = False,
    trust_remote_code: bool = False,
    bundle_files: Mapping[str, str] | None = None,
) -> RunResult:
    """Run a protocol end to end and write its bundle to `out` (default `reports/<name>/`).

    `bundle_files` (name → text) are written into the bundle with its own files and recorded in
    its manifest (`anistat run --model …` keeps the protocol it built there as protocol.yaml).

    Before anything is trained or loaded, `anistat.preflight.preflight` checks every model and
    claim. An existing bundle at `out` is replaced only with `overwrite=True`. `threads`
    overrides the protocol's `threads` (see `anistat.runtime`); torch's and numpy's thread
    settings are restored when the run ends. `cache_dir` chooses the folder of the per-unit
    caches (`cache_root`). One run at a time writes a bundle folder and a cache (`anistat.locking`):
    another run holding either is refused at once, or waited for with `wait=True`. A protocol
    model with `trust_remote_code: true` runs only with `trust_remote_code=True` here too (the
    caller's consent, `--trust-remote-code`), checked before any model code is imported.

    The run's time is recorded per stage (`anistat.timing`) in the manifest's `stages`, charged to
    the timer active when `run` is called (the command line's, which counts the process's
    start-up) or to a new one."""
    timer = timing.active_timer() or timing.StageTimer()
    with timer.activate():
        return _run(
            protocol,
            out,
            device,
            threads,
            log or (lambda message: None),
            keep_cache,
            overwrite,
            cache_dir,
            wait,
            trust_remote_code,
            bundle_files,
        )


def _run(
    protocol: Protocol | str | Path,
    out: str | Path | None,
    device: str | None,
    threads: int | None,
    log: Log,
    keep_cache: bool,
    overwrite: bool,
    cache_dir: str | Path | None,
    wait: bool,
    trust_remote_code: bool,
    bundle_files: Mapping[str, str] | None,
) -> RunResult:
    if not isinstance(protocol, Protocol):
        protocol = load_protocol(protocol)
    require_remote_code_consent(protocol, trust_remote_code)
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS
    ):
        raise AnistatInputError(f"threads must be an integer from 1 to {MAX_THREADS}, got {threads!r}")
    if out is None:
        out = default_out(protocol)
        where, elsewhere = f"{out} (the default bundle folder of protocol '{protocol.name}')", "folder with --out DIR"
    else:
        out = Path(out)
        where, elsewhere = f"--out {out}", "--out"
    check_destination(out, where)
    sha = protocol.sha256()
    cache = _cache_for(out, sha, cache_dir)
    writer = _writer_process()
    with _held(bundle_lock_path(out), f"the bundle folder {out}", wait, log, writer):
        check_destination(out, where)  # again: a run we waited for may have written it
        if not overwrite and (out / "manifest.json").is_file():
            raise AnistatInputError(
                f"{where}: a bundle already exists there; pass --overwrite to replace it, or choose another {elsewhere}"
            )
        with timing.stage("preflight"):
            preflight(protocol)
        with (
            _held(cache_lock_path(cache), f"the cache {cache}", wait, log, writer),
            _cache_kept_only_with_units(cache, writer),
        ):
            started_at, started = utc_now(), time.perf_counter()
            torch_device = resolve_device(device or protocol.device)
            thread_choice = resolve_threads(threads, protocol.threads)
            log(
                f"anistat run {protocol.name} (protocol sha256 {sha[:12]}…) on {torch_device}, "
                f"{thread_choice.describe()}"
            )
            log(f"cache: {cache} ({describe_cache(cache)})")
            if (
                distributed.is_main()
            ):  # the analysis' and figures' worker processes: their imports overlap the collection
                workers.start_server(thread_choice.threads)
            with cpu_threads(thread_choice.threads), _stops_reported(cache):
                return _collect_analyse_publish(
                    protocol,
                    out,
                    cache,
                    torch_device,
                    thread_choice,
                    started_at,
                    started,
                    log,
                    keep_cache,
                    bundle_files,
                )


def _cache_for(out: Path, sha: str, chosen: str | Path | None) -> Path:
    """The run's cache folder; a chosen root that is not a folder is refused in one line."""
    cache = cache_dir(out, sha, chosen)
    root = cache.parent
    if root.exists() and not root.is_dir():
        source = "--cache-dir" if chosen else CACHE_DIR_VARIABLE if os.environ.get(CACHE_DIR_VARIABLE) else "cache"
        raise AnistatInputError(f"{source} {root}: exists and is not a directory")
    return cache


def _writer_process() -> bool:
    """Whether this process writes the cache and the bundle (and so holds their locks): always,
    except the ranks other than 0 under torchrun (rank 0 writes for them)."""
    return distributed.requested_world_size() <= 1 or os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def _held(path: Path, what: str, wait: bool, log: Log, writer: bool = True) -> Iterator[None]:
    """`locking.exclusive` (in the writing process only), with its refusal as one line."""
    if not writer:
        yield
        return
    try:
        with exclusive(path, what, wait=wait, log=log):
            yield
    except LockHeld as refused:
        raise AnistatInputError(str(refused)) from None


@contextlib.contextmanager
def _cache_kept_only_with_units(cache: Path, writer: bool = True) -> Iterator[None]:
    """The cache folder exists during the run (it holds the lock); a run that ends without a
    finished unit leaves no cache behind (nor an empty cache root). Only the writing process
    cleans up."""
    try:
        yield
    finally:
        if writer and cache.is_dir() and _finished_units(cache) == 0:
            shutil.rmtree(cache, ignore_errors=True)
        _remove_if_empty(cache.parent)


def cache_size(cache: Path) -> int:
    """Bytes of the files below `cache`."""
    return sum(path.stat().st_size for path in cache.rglob("*") if path.is_file()) if cache.is_dir() else 0


def describe_cache(cache: Path) -> str:
    """`new` or `N finished units, X MB` (what a resume would use)."""
    finished = _finished_units(cache)
    if finished == 0:
        return "new"
    return f"{finished} finished unit{'s' if finished != 1 else ''}, {cache_size(cache) / 1e6:.1f} MB; resuming"


@contextlib.contextmanager
def _stops_reported(cache: Path) -> Iterator[None]:
    """Around collect, analyse, publish: Ctrl-C (or SIGTERM) anywhere in it becomes
    `RunInterrupted`, and weights that passed the preflight's header check but do not load become
    one line; both say where the finished units are."""
    try:
        yield
    except RunInterrupted:
        raise
    except KeyboardInterrupt:
        raise RunInterrupted(cache / "units", _finished_units(cache)) from None
    except CheckpointLoadError as error:
        raise AnistatInputError(f"{error}; {_kept(cache)}") from None


def _finished_units(cache: Path) -> int:
    units = cache / "units"
    return len(list(units.glob("*.json"))) if units.is_dir() else 0


def _kept(cache: Path) -> str:
    """Where the finished units of a failed run are, as the end of its one-line message."""
    finished = _finished_units(cache)
    if finished == 0:
        return "no unit was finished, so nothing was kept"
    return f"{finished} finished unit{'s are' if finished != 1 else ' is'} kept in {cache / 'units'}; a rerun resumes"


def _collect_analyse_publish(
    protocol: Protocol,
    out: Path,
    cache: Path,
    torch_device: torch.device,
    thread_choice: ThreadChoice,
    started_at: str,
    started: float,
    log: Log,
    keep_cache: bool,
    bundle_files: Mapping[str, str] | None = None,
) -> RunResult:
    torch.manual_seed(protocol.seed)
    # the writer's block ends inside the cache's: its writes finish before a failure is worded
    with _disk_errors_reported(cache, f"the cache {cache}"), UnitWriter() as writer:
        _record_cache(cache, out, protocol)
        artifacts, info = collect_units(protocol, torch_device, cache, log, writer)
        analysis = None
        if distributed.active():  # torchrun: every rank analyses its share of the units, rank 0 gathers
            analysis = analyze_run(
                artifacts, info["frequency"], protocol, device=torch_device, workers=thread_choice.threads
            )
        distributed.finish()  # every rank at once: none exits while another still holds the group
        if not distributed.is_main():  # torchrun: rank 0 writes the bundle
            return RunResult(out=out, results=pd.DataFrame(), manifest={}, claims=[])
        outcome = analyse_and_publish(
            artifacts,
            info["frequency"],
            protocol,
            out,
            device=torch_device,
            started_at=started_at,
            started=started,
            corpus=info["corpus"],
            models=info["models"],
            concept_cards=info["concept_cards"],
            warnings=info["warnings"],
            threads=thread_choice,
            extra_files=bundle_files,
            log=log,
            analysis=analysis,
            # the cache's writes overlap the analysis; a failed one is the cache's error, not the bundle's
            publishing=_after(writer.wait, _disk_errors_reported(cache, f"the bundle {out}")),
        )
    failed = sorted({a.key.id for a in artifacts if a.status != "ok"})
    _finish_cache(cache, keep_cache, log)
    log(f"wrote {out}/ ({time.perf_counter() - started:.1f}s)" + (f"; {len(failed)} unit(s) FAILED" if failed else ""))
    return outcome


@contextlib.contextmanager
def _after(first: Callable[[], None], block: contextlib.AbstractContextManager[None]) -> Iterator[None]:
    """``first()``, then ``block``."""
    first()
    with block:
        yield


def _record_cache(cache: Path, out: Path, protocol: Protocol) -> None:
    """What `anistat cache list` says of this cache: its bundle folder and protocol (rank 0 only)."""
    if distributed.is_main():
        cache.mkdir(parents=True, exist_ok=True)
        write_json(
            cache / "run.json",
            {"out": str(out.resolve()), "protocol": protocol.name, "protocol_sha256": protocol.sha256()},
        )


def _finish_cache(cache: Path, keep_cache: bool, log: Log) -> None:
    """After the bundle is written: the cache is removed (its lock file goes when the lock is
    released), or kept with `keep_cache`; either is said with its size."""
    if keep_cache:
        log(f"kept the cache {cache} ({cache_size(cache) / 1e6:.1f} MB; `anistat cache clean` removes it)")
        return
    size = cache_size(cache)
    shutil.rmtree(cache / "units", ignore_errors=True)
    log(f"removed the cache {cache} ({size / 1e6:.1f} MB)")


_DISK_ERRNOS = {"ENOSPC", "EDQUOT", "EACCES", "EPERM", "EROFS", "EFBIG", "EMFILE", "ENFILE"}


@contextlib.contextmanager
def _disk_errors_reported(cache: Path, what: str) -> Iterator[None]:
    """A disk error inside (`_disk_error`) becomes its one-line `AnistatInputError` naming
    `what` was being written (``the cache …``, ``the bundle …``); any other OSError passes
    unchanged."""
    try:
        yield
    except OSError as error:
        user_error = _disk_error(error, cache, what)
        if user_error is None:
            raise
        raise user_error from error


def _disk_error(error: OSError, cache: Path, what: str) -> AnistatInputError | None:
    """A full / read-only / forbidden disk while writing `what` (the cache or the bundle), as one
    line naming it and the file, with the fix for its cause (`anistat.bundle.write_hint`) and
    where the finished units are (None for any other OSError: a bug keeps its traceback)."""
    import errno as errno_names

    name = errno_names.errorcode.get(error.errno or 0, "")
    if name not in _DISK_ERRNOS:
        return None
    reason = error.strerror or name
    file = _written_file(error.filename)
    return AnistatInputError(
        f"cannot write {what} ({f'{file}: ' if file else ''}{reason}); {write_hint(reason, name)}; {_kept(cache)}"
    )


def _written_file(filename: Any) -> str:
    """The file an OSError names, as the bundle's own name when it lies in a staging folder
    (``report.pdf``, not ``/…/.out.host-1.x.partial/report.pdf``)."""
    if not filename:
        return ""
    parts = Path(str(filename)).parts
    for index, part in enumerate(parts):
        if part.endswith(".partial") and index + 1 < len(parts):
            return Path(*parts[index + 1 :]).as_posix()
    return str(filename)


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass
