"""`anistat.run`: protocol → collect → analyze → report → bundle.

The plan is model × checkpoint × site ("units"). Each finished unit is stored in a cache keyed
by the protocol hash, so an interrupted run resumes where it stopped and ends with the same
numbers; the bundle itself appears only when everything is done (atomic rename).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from .analyze import analyze_run
from .bundle import (
    RunFacts,
    RunResult,
    check_destination,
    concentration_warnings,
    few_resampling_units_warnings,
    publish_bundle,
    unit_records,
    utc_now,
    write_hint,
    write_json,
)
from .collect import (
    BasisSet,
    FitSample,
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
from .collect.progress import bar
from .data import load_corpus
from .errors import AnistatInputError, CheckpointLoadError, RunInterrupted
from .explore import BASES_FILE, bases_file
from .geometry import draw_controls, fit_proxies, frequency_buckets, proxy_variants
from .locking import LockHeld, bundle_lock_path, cache_lock_path, exclusive
from .models import Checkpoint, ModelSeries, resolve_models
from .preflight import localized, preflight
from .protocol import Protocol, control_problem, fit_window_size, load_protocol, require_remote_code_consent
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
def _seed_key(site: Site):
    """The label a site contributes to derived seeds (block index for residual sites, so their
    draws are unchanged from the residual-only collector; the site name otherwise)."""
    return site.layer if site.kind == "residual" else site.name


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
        """Count site calls during one forward (register inside `probe`, so the probe's own
        hook runs first); raise `_SitesRecorded` once the learnt counts are reached."""
        modules = dict(model.named_modules())
        calls = {name: 0 for name in self.sites}
        expected = self.expected

        def counter(name: str):
            def hook(*_args):
                calls[name] += 1
                if expected is not None and all(calls[n] >= expected[n] for n in expected):
                    raise _SitesRecorded

            return hook

        handles = [
            modules[site.module].register_forward_pre_hook(counter(name))
            if site.hook == "input"
            else modules[site.module].register_forward_hook(counter(name))
            for name, site in self.sites.items()
        ]
        try:
            yield
        except _SitesRecorded:
            self.n_cut += 1
            return
        finally:
            for handle in handles:
                handle.remove()
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
    """Fit every proxy on the early window (pooled fit-split activations), draw its controls.

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
    # frozen proxies keep their seed streams; refitted ones get their own per checkpoint
    refit_tag = () if refit_at is None else ("refit", window[0].label)
    fit_inputs, _ = model_inputs(
        series.splits.fit, series.splits, series.objective, protocol.data.mlm_probability, seed, "fit"
    )
    by_name = {site.name: site for site in sites}
    sampler = FitSampler(
        by_name,
        n_checkpoints=len(window),
        token_ids=fit_inputs,
        max_tokens=protocol.proxies.max_fit_tokens,
        seeds={name: derive_seed(seed, spec.name, _seed_key(site), "fit-sample") for name, site in by_name.items()},
    )
    precision = resolve_precision(device, spec.precision)
    batch_size = protocol.data.batch_size
    starts = list(range(0, fit_inputs.shape[0], batch_size))
    progress = bar(len(window) * len(starts), f"{spec.name} fit", unit="batch")
    cut = _FitForwardCut(by_name)
    for c, checkpoint in enumerate(window):
        model = checkpoint.load()
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
    for name, site in by_name.items():
        sample = sampler.finish(name)
        n_tokens = int(sample.activations.shape[0])
        dim = int(sample.activations.shape[1])
        # the preflight checked the hidden size; a module site's width is known only now
        problem = control_problem(protocol.controls, protocol.proxies.ranks, dim)
        if problem:
            raise AnistatInputError(f"models.{spec.name}: site {name} (dimension {dim}): {problem}")
        if not bool(torch.isfinite(sample.activations).all()):
            raise AnistatInputError(
                f"models.{spec.name}: the model produces non-finite (NaN/Inf) activations at site {name} on the "
                "fit split, so no proxy can be fitted; check the checkpoint's weights"
            )
        bases[name] = _site_bases(sample, site, series, protocol, device, fit_inputs, decode, refit_at, refit_tag)
    if refit_at is not None:
        return bases, {}
    log(
        f"  {spec.name}: proxies fitted on {n_early} early checkpoint(s) "
        f"({', '.join(c.label for c in window)}), {n_tokens} tokens per site"
    )
    return bases, {"fit_checkpoints": [c.label for c in window], "fit_tokens_per_site": n_tokens}


def _site_bases(
    sample: FitSample,
    site: Site,
    series: ModelSeries,
    protocol: Protocol,
    device: torch.device,
    fit_inputs: torch.Tensor,
    decode: Callable[[list[int]], str],
    refit_at: int | None,
    refit_tag: tuple[str, ...],
) -> list[BasisSet]:
    """One site's proxies (every method, centring variant and rank, fitted on its activation
    sample) with their drawn controls and concept cards (none for refitted proxies)."""
    spec, seed = series.spec, protocol.seed
    key = _seed_key(site)
    sets = []
    variants = [
        (method, label, options)
        for method in protocol.proxies.methods
        for label, options in proxy_variants(method, protocol.proxies.center.get(method))
    ]
    for method, label, options in variants:
        ranks = protocol.proxies.ranks
        proxies = fit_proxies(
            sample.activations.to(device),
            method,
            ranks,
            {rank: derive_seed(seed, spec.name, key, label, rank, "proxy", *refit_tag) for rank in ranks},
            **options,
        )
        largest = proxies[max(ranks)].basis
        widest_cards = None  # the largest rank's cards serve every rank whose basis is its prefix
        for rank in ranks:
            proxy = proxies[rank]
            controls = {
                kind: draw_controls(
                    kind,
                    proxy.basis,
                    protocol.controls.n,
                    seed=derive_seed(seed, spec.name, key, label, rank, kind, *refit_tag),
                    activations=sample.activations.to(device),
                    pca_span_dim=protocol.controls.pca_span_dim,
                )
                for kind in protocol.projected_control_kinds
            }
            basis = distributed.broadcast_(proxy.basis.contiguous())
            controls = {kind: distributed.broadcast_(stack.contiguous()) for kind, stack in controls.items()}
            if refit_at is not None:
                cards = []
            elif torch.equal(proxy.basis, largest[:, :rank]):  # nested (pca): the same directions
                if widest_cards is None:
                    widest_cards = concept_cards(
                        sample, largest, fit_inputs, decode, protocol.proxies.concept_card_tokens
                    )
                cards = widest_cards[:rank]
            else:
                cards = concept_cards(sample, basis, fit_inputs, decode, protocol.proxies.concept_card_tokens)
            proxy_name = label if refit_at is None else f"{label}@refit"
            sets.append(BasisSet(proxy_name, rank, basis, controls, proxy.reconstruction_error, cards))
    return sets


def _memoized_decode(decode: Callable[[list[int]], str]) -> Callable[[list[int]], str]:
    """`decode` with a cache: concept cards decode the same tokens and contexts many times."""
    cached = functools.lru_cache(maxsize=None)(lambda ids: decode(list(ids)))
    return lambda ids: cached(tuple(ids))


# ----------------------------------------------------------------------------------------------
# collection
# ----------------------------------------------------------------------------------------------
def collect_units(protocol: Protocol, device: torch.device, cache: Path, log: Log) -> tuple[list[UnitArtifact], dict]:
    """Phases 1 and 2 for every model; finished units come from / go to `cache`.

    Units are stored as `<cache>/units/<unit id>.json|npz` (the cache directory is keyed by the
    protocol hash), written as soon as a checkpoint is measured; a rerun skips finished
    checkpoints, so an interrupted run resumes and ends with the same numbers. Under torchrun
    only rank 0 logs and writes; every rank returns the same artifacts."""
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
            refit = protocol.proxies.refit
            if bases is None:
                bases, fit_info = (
                    ({site.name: [] for site in sites}, {})
                    if refit == "per_checkpoint"
                    else fit_bases(series, sites, protocol, device, log)
                )
            unit_bases = bases
            if refit != "frozen":
                refitted, _ = fit_bases(series, sites, protocol, device, log, refit_at=i)
                unit_bases = {name: bases[name] + refitted[name] for name in bases}
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
                    measured[site.name].save(units_dir)
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
    caller's consent, `--trust-remote-code`), checked before any model code is imported."""
    log = log or (lambda message: None)
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
    from .claims import evaluate_claims

    torch.manual_seed(protocol.seed)
    with _disk_errors_reported(cache, f"the cache {cache}"):
        _record_cache(cache, out, protocol)
        artifacts, info = collect_units(protocol, torch_device, cache, log)
        distributed.finish()  # every rank at once: none exits while another still holds the group
        if not distributed.is_main():  # torchrun: rank 0 analyses and writes the bundle
            return RunResult(out=out, results=pd.DataFrame(), manifest={}, claims=[])
        stage = time.perf_counter()
        log(
            f"analysing {len(artifacts)} unit(s): exact tests against Haar subspaces shared by the units of "
            f"each width, {protocol.stats.n_bootstrap} bootstrap resamples per interval, per-bucket energy "
            "ratios and log-frequency correlations …"
        )
        results, frequency = analyze_run(artifacts, info.pop("frequency"), protocol, device=torch_device)
        nulls = results.attrs.get("null_settings", {})
        made = (
            f"{nulls.get('draws')} in {nulls.get('streams')} stream(s), the longest {nulls.get('longest_stream')}"
            if nulls.get("streams")
            else ""
        )
        log(
            f"  analysed: {len(results)} result rows and {len(frequency)} frequency rows; at most "
            f"{nulls.get('n_null_draws')} Haar draws per test (drawn: {made or 'none'}) and "
            f"{nulls.get('n_test_resamples')} data-test resamples, sized for a family of {nulls.get('n_tests')} "
            f"({time.perf_counter() - stage:.1f}s)"
        )
    few_units = [*few_resampling_units_warnings(results), *concentration_warnings(results)]
    for warning in [*results.attrs.get("warnings", []), *few_units]:
        log(f"warning: {warning}")
    claims = evaluate_claims(results, protocol.claims, frequency, stats=protocol.stats)
    failed = sorted({a.key.id for a in artifacts if a.status != "ok"})
    stage = time.perf_counter()
    log(
        "writing the bundle: tables, figures, report.html, tables.tex"
        + (", report.pdf" if protocol.report.compile_pdf else "")
        + " …"
    )
    facts = RunFacts(
        device=str(torch_device),
        started_at=started_at,
        seconds=time.perf_counter() - started,
        corpus=info["corpus"],
        models=info["models"],
        units=unit_records(artifacts),
        warnings=(*info.pop("warnings"), *results.attrs.get("warnings", []), *few_units),
        null_settings=dict(results.attrs.get("null_settings", {})),
        threads=thread_choice,
    )
    kept: dict[str, str | bytes] = dict(bundle_files or {})
    if protocol.report.keep_bases:
        kept[BASES_FILE] = bases_file(artifacts)
    with _disk_errors_reported(cache, f"the bundle {out}"):
        outcome = publish_bundle(
            out, protocol, results, frequency, claims, info["concept_cards"], facts, extra_files=kept
        )
    log(f"  rendered ({time.perf_counter() - stage:.1f}s)")
    for name, reason in outcome.manifest.get("omitted_files", {}).items():
        log(f"note: {name} was not written: {reason}")
    _finish_cache(cache, keep_cache, log)
    log(f"wrote {out}/ ({time.perf_counter() - started:.1f}s)" + (f"; {len(failed)} unit(s) FAILED" if failed else ""))
    return outcome


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
