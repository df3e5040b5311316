"""Preflight: everything `anistat run` would reject, checked before any model is trained or loaded.

`anistat validate` and `anistat run` both call `preflight(protocol)`; `run` calls it for *every*
model before the first one is trained or loaded, so a typo costs a second, not a training run.
What is checked, per model (no weights are read):

* local checkpoints: every directory exists (relative paths are relative to the protocol file,
  see `resolve_path`) and its `config.json` reads (transformers `AutoConfig`, local files only);
* hub models: the config of every revision reads (from the local cache when `HF_HUB_OFFLINE`
  is set); a cache that holds only other revisions is named in the message;
* built-in models: sizes from the protocol's `hidden_size` / `num_layers`;
* the proxy ranks against the hidden size d — rank < d, 2k ≤ d for `normal` controls, the
  `pca_span` dimension (one rule, `anistat.protocol.control_problem`); `data.seq_len` against
  the model's maximum positions;
* the sites: layers and site names exist (`residual.7` on a 3-block model is an error); module
  sites are resolved on a weightless (meta-device) model built from the config;
* data files (`data.paths`) exist;
* local checkpoint files open as `run` will open them, read cheaply (:func:`checkpoint_file_problem`):
  every safetensors file's header (its length, its JSON, each tensor's dtype × shape against
  its byte span, and 8 + header + data = the file's size: a truncated or extended file is
  named), a sharded checkpoint's index against its shards, a `.bin` file's zip directory
  (where no safetensors file is there to be preferred), and the first folder's tokenizer,
  loaded offline (`run` tokenises the corpus with it).

For `anistat validate` the corpus is counted too: fewer documents than the intervals need, or a
test split of more sequences than the corpus has documents, is a warning line on stderr
(:func:`corpus_warnings`).

Then the protocol's claims are checked against the rows the plan will produce (`RowPlan`): the
metric must be one the run writes, every `where` key a column of `results.csv` /
`frequency.csv`, and every `where` value one that some planned row has (model names,
checkpoint labels, steps, phases, layers, sites, ranks, proxies, controls, buckets). Each
mistake is one line naming the field and the valid choices (exit 2 on the command line).

Checks that need numbers only a loaded model gives (module-site dimensions, non-finite
activations) stay where the model is loaded (`anistat.pipeline.fit_bases`).
"""

from __future__ import annotations

import difflib
import glob
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._columns import RESULT_COLUMNS, UNIT_KEYS
from .errors import AnistatInputError
from .protocol import ClaimSpec, ModelSpec, Protocol, control_problem, fit_window_size
from .vocabulary import PROXY_METRICS

# The rows `anistat.analyze` writes (a test runs the pipeline and checks this plan against the
# real results.csv / frequency.csv row by row, so the two cannot drift apart silently).
DESCRIPTIVE_METRICS = tuple(
    f"{cloud}_{metric}"
    for cloud in ("gradient", "activation")
    for metric in ("isoscore", "isoscore_star", "participation_ratio", "effective_rank", "mean_cosine")
)
#: = the frequency correlations `anistat.analyze` writes (a test keeps them in step): each
#: correlation kind × each definition of a type's "distance" (issue #15)
CORRELATION_METRICS = tuple(
    f"{kind}_logfreq_{definition}"
    for definition in ("distance", "mean_distance", "mean_norm")
    for kind in ("spearman", "pearson")
)
FREQUENCY_ONLY_COLUMNS = ("bucket",)
# Columns whose values the plan fixes (claims' `where` values on them are checked); the others
# (estimates, p-values, notes, …) are measured and cannot be checked before the run.
UNIT_COLUMNS = (*UNIT_KEYS, "dim")
ROW_COLUMNS = ("proxy", "rank", "control", "metric", "bucket")

ANY = object()  # a planned value that is measured (unknown before the run): matches any claim value
_STANDARD_SITE = re.compile(r"(residual|attn|mlp)\.(-?\d+)")
_GLOB_CHARS = re.compile(r"[*?\[]")


# ----------------------------------------------------------------------------------------------
# relative paths
# ----------------------------------------------------------------------------------------------
def protocol_dir(protocol: Protocol) -> Path | None:
    """The directory of the file the protocol was loaded from (None when built in memory)."""
    return getattr(protocol, "_source_dir", None)


def resolve_path(path: str | os.PathLike, base: Path | None) -> Path:
    """A path from the protocol: absolute (after `~` expansion) as written, relative ones
    against the protocol file's directory `base` (against the working directory when the
    protocol was not read from a file)."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or base is None:
        return candidate
    return base / candidate


def _resolve_pattern(pattern: str, base: Path | None) -> str:
    expanded = os.path.expanduser(pattern)
    if os.path.isabs(expanded) or base is None:
        return expanded
    return os.path.join(glob.escape(str(base)), expanded)


def localized(protocol: Protocol) -> tuple[list[ModelSpec], Any]:
    """(models, data) with every relative path resolved against the protocol file's directory:
    what the pipeline loads. The protocol itself (its hash, its manifest copy) keeps the paths
    as written, so moving a study folder does not change its identity."""
    base = protocol_dir(protocol)
    models = []
    for spec in protocol.models:
        if spec.source == "local":
            update = (
                {"path": str(resolve_path(spec.path, base))}
                if spec.path
                else {"checkpoints": [str(resolve_path(c, base)) for c in spec.checkpoints]}
            )
            spec = spec.model_copy(update=update)
        models.append(spec)
    data = protocol.data
    if data.paths:
        data = data.model_copy(update={"paths": [_resolve_pattern(p, base) for p in data.paths]})
    if data.source == "hf_dataset" and data.dataset and base is not None:
        # a dataset is a hub name or a `save_to_disk` folder: a folder next to the protocol wins
        beside = resolve_path(data.dataset, base)
        if beside.is_dir():
            data = data.model_copy(update={"dataset": str(beside)})
    return models, data


# ----------------------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedSite:
    name: str
    layer: int
    dim: int | None  # None: a module site, whose width is known once the model runs


@dataclass(frozen=True)
class PlannedModel:
    """One protocol model as the run will measure it: sizes, checkpoints (label, step), sites."""

    name: str
    source: str
    objective: str | None
    hidden_size: int | None
    num_layers: int | None
    checkpoints: tuple[tuple[str, int | None], ...]
    sites: tuple[PlannedSite, ...]

    def units(self, fit_window: float) -> list[dict[str, Any]]:
        """One dict of unit columns (`UNIT_COLUMNS`) per checkpoint × site."""
        n_early = fit_window_size(len(self.checkpoints), fit_window)
        return [
            {
                "model": self.name,
                "objective": self.objective,
                "checkpoint": label,
                "step": step,
                "phase": "early" if i < n_early else "late",
                "layer": site.layer,
                "site": site.name,
                "dim": ANY if site.dim is None else site.dim,
            }
            for i, (label, step) in enumerate(self.checkpoints)
            for site in self.sites
        ]


@dataclass(frozen=True)
class RowFamily:
    """Rows written for every unit, as a product of value sets (`None` in a set: the column is
    empty in these rows; `ANY`: measured, unknown before the run)."""

    name: str
    values: dict[str, tuple]
    frequency: bool = False  # rows of frequency.csv (selected by claims only when they name a bucket)


@dataclass(frozen=True)
class RowPlan:
    """The result rows a protocol will produce (`results.csv` and `frequency.csv`), without
    listing them: unit columns per unit, the rest as products per `RowFamily`. Every written row
    is planned; two kinds of planned rows depend on the data and may be absent: a frequency
    bucket no measured token falls in, and the log-frequency correlations of a unit with fewer
    than three token types seen twice."""

    units: tuple[dict[str, Any], ...]
    families: tuple[RowFamily, ...]

    @property
    def metrics(self) -> list[str]:
        return sorted({m for f in self.families for m in f.values["metric"]})

    @property
    def columns(self) -> list[str]:
        return list(RESULT_COLUMNS) + list(FREQUENCY_ONLY_COLUMNS)

    def rows(self) -> Iterable[dict[str, Any]]:
        """Every planned row's key columns (for tests and small protocols; large plans are
        checked through the families without listing rows)."""
        import itertools

        for family in self.families:
            keys = [k for k in ROW_COLUMNS if k in family.values]
            for unit in self.units:
                for combo in itertools.product(*(family.values[k] for k in keys)):
                    yield {**unit, **dict(zip(keys, combo)), "_family": family.name}


def row_plan(protocol: Protocol, models: list[PlannedModel]) -> RowPlan:
    """The rows of `anistat.analyze.analyze_units` / `frequency_rows` for this plan."""
    methods, ranks = tuple(protocol.proxies.methods), tuple(protocol.proxies.ranks)
    kinds = tuple(protocol.controls.kinds)
    buckets = tuple(str(b) for b in range(protocol.data.n_frequency_buckets))
    units = tuple(u for m in models for u in m.units(protocol.proxies.fit_window))
    families = (
        RowFamily(
            "descriptive",
            {"metric": DESCRIPTIVE_METRICS, "proxy": ("none",), "rank": (None,), "control": ("none",), "bucket": ("",)},
        ),
        RowFamily(
            "oracle",
            {
                "metric": ("oracle_fraction",),
                "proxy": ("oracle",),
                "rank": ranks,
                "control": ("none",),
                "bucket": ("",),
            },
        ),
        RowFamily(
            "energy", {"metric": PROXY_METRICS, "proxy": methods, "rank": ranks, "control": kinds, "bucket": ("",)}
        ),
        RowFamily(
            "frequency-bucket",
            {"metric": ("energy_ratio",), "proxy": methods, "rank": ranks, "control": kinds, "bucket": buckets},
            frequency=True,
        ),
        RowFamily(
            "frequency-correlation",
            {
                "metric": CORRELATION_METRICS,
                "proxy": ("none",),
                "rank": (None,),
                "control": ("none",),
                "bucket": ("all",),
            },
        ),
    )
    return RowPlan(units, families)


# ----------------------------------------------------------------------------------------------
# per model
# ----------------------------------------------------------------------------------------------
def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def cached_revisions(hub_id: str) -> list[str]:
    """Branch/tag names of `hub_id` in the local Hugging Face cache (its `refs/` folder)."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - transformers depends on it
        return []
    refs = Path(constants.HF_HUB_CACHE) / f"models--{hub_id.replace('/', '--')}" / "refs"
    if not refs.is_dir():
        return []
    return sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file())


def missing_revision_message(hub_id: str, revision: str | None, *, option: str) -> str | None:
    """When `hub_id` could not be read at `revision` but the local cache holds *other* revisions
    of it (typically a checkpoint series cached as step1000, step2000, … without `main`): a
    message naming them and the option to pass, instead of the hub client's connection error.
    None when the cache holds no other revision."""
    cached = _natural_sorted(r for r in cached_revisions(hub_id) if r != (revision or "main"))
    if not cached:
        return None
    shown = ", ".join(cached[:6]) + (f", … ({len(cached)} in all)" if len(cached) > 6 else "")
    return (
        f"'{hub_id}' has no revision '{revision or 'main'}' in the local cache (and the hub was not "
        f"reached); cached revisions: {shown} — pass {option.format(revision=cached[0])}"
    )


def _natural_sorted(values: Iterable[str]) -> list[str]:
    return sorted(values, key=lambda v: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", v)])


def read_config(source: str, *, revision: str | None, trust_remote_code: bool, local_only: bool, where: str):
    """A transformers config (no weights), or one clear line naming `where`."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            source, revision=revision, trust_remote_code=trust_remote_code, local_files_only=local_only
        )
    except (OSError, ValueError, KeyError) as error:
        return AnistatInputError(f"{where} cannot be loaded: {_first_line(error)}")


def config_sizes(config: Any) -> tuple[int, int, int | None]:
    """(hidden size d, number of blocks, maximum positions) of a transformers config."""
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or config.d_model
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(hidden), int(layers), (int(positions) if positions else None)


def _builtin_sites(spec: ModelSpec, protocol: Protocol) -> list[PlannedSite] | None:
    """Sites of a built-in model from its protocol sizes; None when a module site needs the
    module tree."""
    sites_spec, n, d = protocol.sites, spec.num_layers, spec.hidden_size
    where = f"models.{spec.name}"
    out: list[PlannedSite] = []
    if sites_spec.names:
        for name in sites_spec.names:
            name = name.strip()
            if name == "embed":
                out.append(PlannedSite("embed", -1, d))
                continue
            if name.startswith("module:"):
                return None
            match = _STANDARD_SITE.fullmatch(name)
            if not match:
                raise AnistatInputError(
                    f"sites.names: unknown site name '{name}' (expected embed, residual.L, "
                    "attn.L, mlp.L or module:NAME)"
                )
            layer = int(match.group(2))
            index = layer + n if layer < 0 else layer
            if not 0 <= index < n:
                raise AnistatInputError(
                    f"sites.names: '{name}' does not exist in {where} ({n} block(s): layers 0…{n - 1}, "
                    f"e.g. {match.group(1)}.{n - 1})"
                )
            out.append(PlannedSite(f"{match.group(1)}.{index}", index, d))
    else:
        kinds = sites_spec.kind if isinstance(sites_spec.kind, list) else [sites_spec.kind]
        if "module" in kinds:
            return None
        layers = (
            list(range(n))
            if sites_spec.layers == "all"
            else sorted({layer + n if layer < 0 else layer for layer in sites_spec.layers})
        )
        for kind in kinds:
            if kind == "embed":
                out.append(PlannedSite("embed", -1, d))
            else:
                out.extend(PlannedSite(f"{kind}.{layer}", layer, d) for layer in layers)
    unique: dict[str, PlannedSite] = {}
    for site in out:
        unique.setdefault(site.name, site)
    return list(unique.values())


def _meta_model_sites(
    build, protocol: Protocol, spec: ModelSpec, hidden_size: int, weights: list[Path] = ()
) -> list[PlannedSite]:
    """Sites resolved on a weightless model: `build()` runs under the meta device. Each folder of
    `weights` (local checkpoints) has its safetensors headers' shapes checked against that model
    (`anistat.models.weight_shape_mismatch`): a config from another model is one line here."""
    import torch

    from .collect.sites import sites_from_spec
    from .models import weight_shape_mismatch

    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = build()
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise AnistatInputError(
            f"models.{spec.name}: cannot build the model from its config: {_first_line(error)}"
        ) from None
    for directory in weights:
        mismatch = weight_shape_mismatch(directory, model)
        if mismatch:
            raise AnistatInputError(f"models.{spec.name}: '{directory}': {mismatch}")
    try:
        sites = sites_from_spec(model, protocol.sites, spec.name)
    except AnistatInputError as error:
        raise AnistatInputError(f"models.{spec.name}: {error}") from None
    return [PlannedSite(s.name, s.layer, hidden_size if s.kind != "module" else None) for s in sites]


def _check_sizes(protocol: Protocol, spec: ModelSpec, hidden_size: int, max_positions: int | None) -> None:
    problem = control_problem(protocol.controls, protocol.proxies.ranks, hidden_size)
    if problem:
        raise AnistatInputError(f"models.{spec.name}: {problem}")
    if max_positions and protocol.data.seq_len > max_positions:
        raise AnistatInputError(
            f"data.seq_len {protocol.data.seq_len} exceeds models.{spec.name}'s max positions {max_positions}"
        )


def _check_layers(protocol: Protocol, spec: ModelSpec, num_layers: int) -> None:
    if isinstance(protocol.sites.layers, list) and not protocol.sites.names:
        bad = [layer for layer in protocol.sites.layers if not -num_layers <= layer < num_layers]
        if bad:
            raise AnistatInputError(
                f"sites.layers: layer {bad[0]} does not exist in models.{spec.name} ({num_layers} layers)"
            )


def plan_builtin(spec: ModelSpec, protocol: Protocol) -> PlannedModel:
    _check_sizes(protocol, spec, spec.hidden_size, None)  # built-in models are made for data.seq_len
    _check_layers(protocol, spec, spec.num_layers)
    sites = _builtin_sites(spec, protocol)
    if sites is None:
        from .models import build_builtin_model

        sites = _meta_model_sites(
            lambda: build_builtin_model(spec, protocol.data.vocab_size, protocol.data.seq_len, protocol.seed),
            protocol,
            spec,
            spec.hidden_size,
        )
    checkpoints = tuple((f"step{s}", s) for s in spec.train.checkpoints)
    return PlannedModel(
        spec.name, "builtin", spec.resolved_objective, spec.hidden_size, spec.num_layers, checkpoints, tuple(sites)
    )


def plan_pretrained(spec: ModelSpec, protocol: Protocol, base: Path | None) -> PlannedModel:
    """local / hub / minilm: configs read without weights, sites resolved on a meta model."""
    where = f"models.{spec.name}"
    if spec.source == "local":
        written = [spec.path] if spec.path else list(spec.checkpoints)
        sources = []
        for text in written:
            directory = resolve_path(text, base)
            if not directory.is_dir():
                shown = (
                    f"{text} (resolved against the protocol's folder: {directory})" if str(directory) != text else text
                )
                raise AnistatInputError(f"{where}: model directory not found: {shown}")
            if not (directory / "config.json").is_file():
                raise AnistatInputError(
                    f"{where}: '{directory}' cannot be loaded: no config.json (not a save_pretrained directory)"
                )
            sources.append((str(directory), None, directory.name))
        local_only = True
    elif spec.source == "hub":
        sources = [(spec.hub_id, r, r or "main") for r in (list(spec.revisions) or [None])]
        local_only = _hub_offline()
    else:  # minilm
        from .models import minilm_path

        try:
            sources = [(str(minilm_path()), None, "final")]
        except AnistatInputError as error:
            raise AnistatInputError(f"{where}: {error}") from None
        local_only = True
    configs = []
    for source, revision, _ in sources:
        label = f"{where}: '{source}'" + (f" revision '{revision}'" if revision else "")
        config = read_config(
            source, revision=revision, trust_remote_code=spec.trust_remote_code, local_only=local_only, where=label
        )
        if isinstance(config, AnistatInputError):
            message = (
                missing_revision_message(spec.hub_id, revision, option="revisions: [{revision}, …]")
                if spec.source == "hub"
                else None
            )
            if message is None and spec.source == "hub" and local_only:
                message = f"{str(config).split(': ', 1)[1]} (HF_HUB_OFFLINE is set: only the local cache is read)"
            raise AnistatInputError(f"{where}: {message}") if message else config
        configs.append(config)
    if spec.source == "local":
        _check_checkpoint_files(where, [Path(source) for source, _, _ in sources], spec.trust_remote_code)
    sizes = [config_sizes(c) for c in configs]
    hidden_size, num_layers, max_positions = sizes[0]
    if any(s[:2] != sizes[0][:2] for s in sizes):
        labels = ", ".join(f"{label}: d={s[0]}, {s[1]} layers" for (_, _, label), s in zip(sources, sizes))
        raise AnistatInputError(f"{where}: the checkpoints differ in shape ({labels}); a series must be one model")
    from .models import infer_objective

    objective = "mlm" if spec.source == "minilm" else (spec.objective or infer_objective(configs[0]))
    _check_sizes(protocol, spec, hidden_size, max_positions)
    _check_layers(protocol, spec, num_layers)

    def build():
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

        auto = AutoModelForCausalLM if objective == "clm" else AutoModelForMaskedLM
        return auto.from_config(configs[0], trust_remote_code=spec.trust_remote_code)

    weights = [Path(source) for source, _, _ in sources] if spec.source == "local" else []
    sites = _meta_model_sites(build, protocol, spec, hidden_size, weights)
    steps = list(spec.steps) if spec.steps else [None] * len(sources)
    checkpoints = tuple((label, step) for (_, _, label), step in zip(sources, steps))
    return PlannedModel(spec.name, spec.source, objective, hidden_size, num_layers, checkpoints, tuple(sites))


#: Bits per element of each safetensors dtype (the format's own table).
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "C64": 64,
}
#: The largest header the safetensors library accepts (its `MAX_HEADER_SIZE`).
SAFETENSORS_MAX_HEADER = 100_000_000


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at `path` cannot be loaded, read from its header alone (None
    when it can): the file is 8 bytes of little-endian header length n, n bytes of JSON
    ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`` and the data;
    every tensor's span must hold exactly dtype bits × prod(shape) / 8 bytes, the spans must
    tile the data without gap or overlap, and 8 + n + data must be the file's size (so a
    truncated and an extended file are both caught). Only the header is read."""
    import json

    try:
        size = path.stat().st_size
        with open(path, "rb") as stream:
            prefix = stream.read(8)
            if len(prefix) < 8:
                return f"{size} bytes: shorter than the 8-byte header length (truncated)"
            length = int.from_bytes(prefix, "little")
            if length > size - 8:
                return f"its header claims {length} bytes but the file has {size - 8} after the length (truncated)"
            if length > SAFETENSORS_MAX_HEADER:
                return f"its header claims {length} bytes, more than a safetensors header may have"
            raw = stream.read(length)
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "its header is not valid JSON (corrupt)"
    if not isinstance(header, dict):
        return "its header is not a JSON object (corrupt)"
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("shape"), list)
            or not isinstance(entry.get("data_offsets"), list)
            or len(entry["data_offsets"]) != 2
        ):
            return f"tensor '{name}' has no valid dtype, shape and data_offsets (corrupt header)"
        shape, (begin, end) = entry["shape"], entry["data_offsets"]
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (*shape, begin, end))
            or end < begin
        ):
            return f"tensor '{name}' has invalid shape or data_offsets (corrupt header)"
        bits = SAFETENSORS_DTYPE_BITS.get(entry.get("dtype"))
        if bits is None:
            return f"tensor '{name}' has an unknown dtype {entry.get('dtype')!r} (corrupt header)"
        elements = 1
        for v in shape:
            elements *= v
        if elements * bits % 8 or end - begin != elements * bits // 8:
            return (
                f"tensor '{name}' ({entry['dtype']} {shape}) needs {elements * bits / 8:g} bytes but spans "
                f"{end - begin} (corrupt header)"
            )
        spans.append((begin, end, name))
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin != position:
            return f"tensor '{name}' starts at byte {begin} of the data, not {position} (corrupt header)"
        position = end
    data = size - 8 - length
    if position != data:
        state = "truncated" if position > data else "extended"
        return f"its tensors need {position} bytes of data but the file holds {data} ({state})"
    return None


def zip_problem(path: Path) -> str | None:
    """Why a PyTorch `.bin` checkpoint cannot be opened (None when it can): its zip directory
    (the end of the file) is read; a legacy pre-zip pickle is accepted as it is."""
    import zipfile

    try:
        with open(path, "rb") as stream:
            if stream.read(1) == b"\x80":  # torch < 1.6's pickle format: no directory to check
                return None
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    except (zipfile.BadZipFile, ValueError, EOFError) as error:
        return f"its zip directory cannot be read ({error}; truncated or corrupt)"
    return None


def checkpoint_file_problem(directory: Path) -> tuple[str, str] | None:
    """(file name, why) of the first weight file in a `save_pretrained` folder that cannot be
    loaded, checked cheaply as `run` will open it (see the module docstring); None when all can.
    Safetensors files are what transformers loads when present, so `.bin` files are checked
    only where there is none."""
    import json

    safetensors = sorted(directory.glob("*.safetensors"))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return index.name, "is not a readable safetensors index (no weight_map)"
        missing = sorted(str(name) for name in shards if not (directory / str(name)).is_file())
        if missing:
            return index.name, f"names shard {missing[0]}, which is not in the folder"
    for path in safetensors:
        problem = safetensors_problem(path)
        if problem:
            return path.name, problem
    if not safetensors:
        for path in sorted(directory.glob("*.bin")):
            if path.name.startswith(("pytorch_model", "model")):
                problem = zip_problem(path)
                if problem:
                    return path.name, problem
    return None


def tokenizer_problem(directory: Path, trust_remote_code: bool) -> str | None:
    """Why the tokenizer in `directory` does not load offline (None when it does): what
    `anistat run` tokenises the corpus with. A folder without tokenizer files can load as an
    empty tokenizer (a vocabulary of its special tokens alone), which is refused too."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(directory), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as error:  # noqa: BLE001 - any failure to load is the folder's (one line, named)
        return _first_line(error)
    if len(tokenizer) <= len(getattr(tokenizer, "all_special_tokens", ())) + 1:
        return f"it loads with a vocabulary of {len(tokenizer)} token(s): the tokenizer files are missing"
    return None


def _check_checkpoint_files(where: str, directories: list[Path], trust_remote_code: bool) -> None:
    """One line, naming the folder and the file, for the first checkpoint `run` could not open."""
    for directory in directories:
        found = checkpoint_file_problem(directory)
        if found:
            name, why = found
            raise AnistatInputError(
                f"{where}: {directory / name}: {why}; save the checkpoint again "
                "(model.save_pretrained) or remove it from the protocol"
            )
    problem = tokenizer_problem(directories[0], trust_remote_code)
    if problem:
        raise AnistatInputError(
            f"{where}: '{directories[0]}' has no usable tokenizer ({problem}); save it there "
            "with tokenizer.save_pretrained(folder)"
        )


def _check_data_paths(protocol: Protocol, base: Path | None) -> None:
    """Every `data.paths` entry names a file (a glob: matches at least one), as `anistat.corpus`
    will read it (the same one-line messages; relative entries resolved like model paths)."""
    for pattern in protocol.data.paths:
        resolved = _resolve_pattern(pattern, base)
        relative = f" (relative to the protocol's folder {base})" if resolved != os.path.expanduser(pattern) else ""
        if _GLOB_CHARS.search(os.path.expanduser(pattern)):
            if not glob.glob(resolved, recursive=True):
                raise AnistatInputError(f"data.paths: no file matches '{pattern}'{relative}")
        elif not os.path.exists(resolved):
            raise AnistatInputError(f"data.paths: file not found: {pattern}{relative}")
        elif not os.path.isfile(resolved):
            raise AnistatInputError(f"data.paths: not a regular file: {pattern}{relative}")


# ----------------------------------------------------------------------------------------------
# claims
# ----------------------------------------------------------------------------------------------
def _suggest(wrong: str, valid: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(wrong), [str(v) for v in valid], n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


def _value_matches(planned: Any, wanted: list) -> bool:
    """`anistat.claims._matches` for one planned value: numbers compare numerically (rank 4
    matches 4.0), everything else as text; an empty column matches nothing."""
    if planned is ANY:
        return True
    if planned is None:
        return False
    for value in wanted:
        if str(planned) == str(value):
            return True
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(planned, (int, float)):
            if float(planned) == float(value):
                return True
    return False


def _show(values: Iterable[Any], limit: int = 12) -> str:
    shown = [str(v) for v in values if v is not None and v is not ANY]
    unique = list(dict.fromkeys(shown))
    text = ", ".join(_natural_sorted(unique)[:limit])
    return text + (f", … ({len(unique)} in all)" if len(unique) > limit else "")


def check_claim(index: int, claim: ClaimSpec, plan: RowPlan) -> None:
    """One clear line if the claim can select no row of the plan (see module docstring)."""
    label = f"claims[{index}] '{claim.id}'"
    if claim.metric not in plan.metrics:
        raise AnistatInputError(
            f"{label}: metric '{claim.metric}' is not produced by this protocol; "
            f"{_suggest(claim.metric, plan.metrics)}valid metrics: {', '.join(plan.metrics)}"
        )
    valid_columns = plan.columns
    for key in claim.where:
        if key not in valid_columns:
            raise AnistatInputError(
                f"{label}: where key '{key}' is not a result column; "
                f"{_suggest(key, valid_columns)}valid keys: {', '.join(valid_columns)}"
            )
    where = {k: (v if isinstance(v, list) else [v]) for k, v in claim.where.items()}
    families = [
        f for f in plan.families if claim.metric in f.values["metric"] and (not f.frequency or "bucket" in where)
    ]
    checked = {k: v for k, v in where.items() if k in UNIT_COLUMNS or k in ROW_COLUMNS}
    # each value on its own: is there a row of this metric that has it?
    for key, wanted in checked.items():
        if key in UNIT_COLUMNS:
            seen = [u[key] for u in plan.units]
        else:
            seen = [v for f in families for v in f.values.get(key, (None,))]
        for value in wanted:
            if not any(_value_matches(s, [value]) for s in seen):
                raise AnistatInputError(
                    f"{label}: where.{key} = {value!r}: no '{claim.metric}' row of this protocol will have it; "
                    f"{_suggest(value, [str(s) for s in seen if s is not None])}values in this plan: "
                    f"{_show(seen) or '(none: the column is empty for this metric)'}"
                )
    # all values together
    units = [u for u in plan.units if all(_value_matches(u[k], v) for k, v in checked.items() if k in UNIT_COLUMNS)]
    for family in families:
        if units and all(
            any(_value_matches(s, v) for s in family.values.get(k, (None,)))
            for k, v in checked.items()
            if k in ROW_COLUMNS
        ):
            return
    shown = ", ".join(f"{k}={v if len(v) > 1 else v[0]}" for k, v in where.items())
    raise AnistatInputError(
        f"{label}: metric '{claim.metric}' where {shown} selects no row of this protocol "
        "(each value occurs, but not together)"
    )


# ----------------------------------------------------------------------------------------------
# the entry point
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preflight:
    """What the preflight found: every model as it will be measured, and the planned rows."""

    models: tuple[PlannedModel, ...]
    plan: RowPlan
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: what the run would warn about but can still do (e.g. too few documents for the intervals)
    warnings: tuple[str, ...] = field(default_factory=tuple)


def preflight(protocol: Protocol | str | Path, *, for_run: bool = True) -> Preflight:
    """Check everything `anistat run` would reject, without training or loading any model.

    `for_run=False` (`anistat validate`) accepts `source: external` models (measured by
    `anistat.callbacks`, not by `anistat run`) and plans nothing for them."""
    if not isinstance(protocol, Protocol):
        from .protocol import load_protocol

        protocol = load_protocol(protocol)
    base = protocol_dir(protocol)
    _check_data_paths(protocol, base)
    models: list[PlannedModel] = []
    notes: list[str] = []
    for spec in protocol.models:
        if spec.source == "external":
            if for_run:
                raise AnistatInputError(
                    f"models.{spec.name}: source 'external' is measured inside a training loop "
                    "(anistat.callbacks), not by `anistat run`"
                )
            notes.append(f"models.{spec.name}: external (measured by TrainingMeter / AnistatCallback)")
            continue
        models.append(
            plan_builtin(spec, protocol) if spec.source == "builtin" else plan_pretrained(spec, protocol, base)
        )
    plan = row_plan(protocol, models)
    if models:  # a protocol of external models only is planned by the training loop
        for index, claim in enumerate(protocol.claims):
            check_claim(index, claim, plan)
    warnings = () if for_run else tuple(corpus_warnings(protocol))  # `run` loads the corpus itself
    return Preflight(tuple(models), plan, tuple(notes), warnings)


def corpus_warnings(protocol: Protocol) -> list[str]:
    """What the corpus, read as `run` reads it (:func:`anistat.corpus.load_corpus`,
    ``max_documents`` applied), means for the intervals, as warning lines:

    * fewer documents than the intervals need (:data:`anistat.vocabulary.MIN_RESAMPLING_UNITS`, text
      and jsonl sources): the run then resamples sequences, which are dependent within a document;
    * a test split that asks more sequences than the corpus has documents: the split then spans
      at most that many documents, the units the intervals and the data test resample, so a
      study sized in documents (``anistat plan``) cannot reach its targets on this corpus.

    A Hugging Face dataset is not loaded here (it may need the network)."""
    if protocol.data.source == "hf_dataset":
        return []
    from .corpus import load_corpus
    from .vocabulary import MIN_RESAMPLING_UNITS

    try:
        documents = len(load_corpus(localized(protocol)[1]).documents)
    except AnistatInputError:
        return []  # the run says what is wrong with the files; validate checked they exist
    warnings: list[str] = []
    if protocol.data.source in ("text", "jsonl") and documents < MIN_RESAMPLING_UNITS:
        rule = (
            f"data.document_separator {protocol.data.document_separator!r} splits the text files"
            if protocol.data.document_separator
            else "each text file is one document; data.document_separator (blank_line or a string) splits a file"
            if protocol.data.source == "text"
            else "each jsonl record is one document"
        )
        warnings.append(
            f"data: the corpus holds {documents} document(s) ({rule}), fewer than the {MIN_RESAMPLING_UNITS} "
            "the intervals need: they will resample sequences instead, which are dependent within a document"
        )
    sequences = protocol.data.n_test_sequences
    if sequences > documents:
        noun = "document" if documents == 1 else "documents"
        warnings.append(
            f"corpus too small: data.n_test_sequences = {sequences:,} from a corpus of {documents:,} {noun}; "
            f"the test split spans at most {documents:,} {noun}, the units the intervals and the data test resample"
        )
    return warnings
