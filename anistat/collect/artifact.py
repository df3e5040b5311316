"""The collection artifact: per-unit sufficient statistics, saved without pickle.

A *unit* is model × checkpoint × site. Its artifact holds everything the analysis needs and
nothing of size (tokens × d):

* per test sequence s and frequency bucket b: `total_energy[s, b] = Σ_{i∈s, i∈b} ‖g_i‖²` and,
  for every basis B (the proxy and each control), `energy[s, b, B] = Σ_{i∈s, i∈b} ‖Bᵀg_i‖²`;
* `n_tokens[s]`, `sequence_documents[s]`;
* gradient and activation moments over the whole test split (count, Σx, ΣxxᵀA);
* ΔIsoScore* of every projected basis (from the gradient moments); the oracle fraction is not
  kept — the analysis reads it off the second moment's eigenvalues;
* the proxy bases themselves (the analysis draws haar / normal controls from the gradient
  moments, in the proxy's complement where needed: no per-token work for them);
* per token type: occurrences, and for the types with per-type sums (post hoc: those of the
  collector's `TypePlan`) the Bessel-corrected RMS distance of its activations to the type
  centroid and the centroid's debiased distance from the global mean and norm (NaN elsewhere);
* optionally, activation sums per (sequence, token type) pair (`pair_sums`), from which the
  analysis bootstraps the log-frequency vs centroid-distance correlation over sequences;
  `pair_note` says why they are absent (over the memory budget, or not requested).

Files: `<dir>/<unit-id>.npz` (arrays, `allow_pickle=False`) + `<unit-id>.json` (metadata), written
atomically (temp file + rename) so an interrupted run never leaves a half unit.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_bytes
from ..geometry import SequenceTypeSums

#: Version of what a unit artifact holds and means. Bump it when a statistic is added or its
#: definition changes (2: per-(sequence, type) sums; Bessel-corrected type distances; 3: proxy
#: bases kept, haar/normal controls no longer projected per token; 4: type centroid distance
#: from the global mean and norm, MLM type statistics without corrupted-input positions; 5: no
#: oracle fraction — the analysis takes it from the second moment's eigenvalues; 6: the gradients'
#: second moment per frequency bucket, for the buckets' exact tests), so a resume never mixes
#: units computed under different definitions.
ARTIFACT_FORMAT = 6


@dataclass(frozen=True)
class UnitKey:
    model: str
    objective: str
    checkpoint: str
    step: int | None
    phase: str
    layer: int
    site: str

    @property
    def id(self) -> str:
        return f"{self.model}--{self.checkpoint}--{self.site}"


@dataclass(frozen=True)
class BasisColumn:
    """One basis in the unit's energy table: the proxy itself (control='proxy', draw=-1) or
    control draw `draw` of kind `control`, for a (proxy method, rank)."""

    proxy: str
    rank: int
    control: str
    draw: int


@dataclass
class UnitArtifact:
    key: UnitKey
    dim: int
    bases: list[BasisColumn]
    n_tokens: np.ndarray  # (S,)
    sequence_documents: np.ndarray  # (S,)
    total_energy: np.ndarray  # (S, n_buckets)
    energy: np.ndarray  # (S, n_buckets, n_bases)
    delta_isoscore_star: np.ndarray  # (n_bases,)
    gradient_moments: dict[str, Any]  # count, sum (d,), outer (d,d), bucket_outer (B,d,d) per frequency bucket
    activation_moments: dict[str, Any]
    gradient_unit_sum: np.ndarray  # Σ g_i/‖g_i‖ (d,), for the mean cosine
    activation_unit_sum: np.ndarray
    type_count: np.ndarray  # (V,) occurrences in the test split
    type_rms_distance: np.ndarray  # (V,) sqrt(Σ‖a − c‖²/(n − 1)) to the type's activation centroid (nan if n < 2)
    status: str = "ok"
    note: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    pair_sums: SequenceTypeSums | None = None  # per-(sequence, type) activation sums, if kept
    pair_note: str = ""  # why pair_sums is None
    #: the proxy bases (d, k) by (method, rank): the analysis draws controls in their complement
    proxy_bases: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    # (V,) debiased distance of each type's centroid from the global mean, and its norm
    # (geometry.type_mean_geometry; nan if n < 2); None in units of older anistat versions
    type_mean_distance: np.ndarray | None = None
    type_mean_norm: np.ndarray | None = None

    # -- views ----------------------------------------------------------------------------------
    def columns_for(self, proxy: str, rank: int, control: str) -> list[int]:
        return [i for i, b in enumerate(self.bases) if b.proxy == proxy and b.rank == rank and b.control == control]

    # -- persistence ----------------------------------------------------------------------------
    _ARRAYS = (
        "n_tokens",
        "sequence_documents",
        "total_energy",
        "energy",
        "delta_isoscore_star",
        "gradient_unit_sum",
        "activation_unit_sum",
        "type_count",
        "type_rms_distance",
    )

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        arrays = {name: np.asarray(getattr(self, name)) for name in self._ARRAYS}
        for name in ("type_mean_distance", "type_mean_norm"):
            if getattr(self, name) is not None:
                arrays[name] = np.asarray(getattr(self, name))
        for prefix, moments in (("gradient", self.gradient_moments), ("activation", self.activation_moments)):
            arrays[f"{prefix}_sum"] = np.asarray(moments["sum"], dtype=np.float64)
            arrays[f"{prefix}_outer"] = np.asarray(moments["outer"], dtype=np.float64)
        if self.gradient_moments.get("bucket_outer") is not None:
            # float32 on disk (B·d² values per unit): a bucket's exact test reads observed value and
            # null from this same stored matrix, so the rounding never splits them
            arrays["gradient_bucket_outer"] = np.asarray(self.gradient_moments["bucket_outer"], dtype=np.float32)
        for index, basis in enumerate(self.proxy_bases.values()):
            arrays[f"proxy_basis_{index}"] = np.asarray(basis, dtype=np.float64)
        if self.pair_sums is not None:
            for name in _PAIR_FIELDS:
                arrays[f"pair_{name}"] = np.asarray(getattr(self.pair_sums, name))
        meta = {
            "key": asdict(self.key),
            "dim": self.dim,
            "bases": [asdict(b) for b in self.bases],
            "gradient_count": int(self.gradient_moments["count"]),
            "activation_count": int(self.activation_moments["count"]),
            "status": self.status,
            "note": self.note,
            "seconds": self.seconds,
            "extra": self.extra,
            "pair_note": self.pair_note,
            "proxy_bases": [[proxy, int(rank)] for proxy, rank in self.proxy_bases],
            "pair_sequences": None if self.pair_sums is None else self.pair_sums.n_sequences,
        }
        # unit ids contain dots (`residual.3`), so names are built by appending, never with
        # Path.with_suffix (which would map residual.0 and residual.1 to the same file)
        meta_path = directory / f"{self.key.id}.json"
        atomic_write_bytes(_arrays_path(meta_path), lambda f: np.savez(f, **arrays))
        # the JSON is written last: its presence marks a complete unit
        atomic_write_bytes(meta_path, lambda f: f.write(json.dumps(meta, indent=1, allow_nan=True).encode()))
        return meta_path

    @classmethod
    def load(cls, meta_path: Path) -> UnitArtifact:
        meta = json.loads(meta_path.read_text())
        with np.load(_arrays_path(meta_path), allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        moments = {}
        for prefix in ("gradient", "activation"):
            moments[prefix] = {
                "count": meta[f"{prefix}_count"],
                "sum": arrays.pop(f"{prefix}_sum"),
                "outer": arrays.pop(f"{prefix}_outer"),
            }
        if "gradient_bucket_outer" in arrays:
            moments["gradient"]["bucket_outer"] = arrays.pop("gradient_bucket_outer")
        proxy_bases = {
            (proxy, int(rank)): arrays.pop(f"proxy_basis_{index}")
            for index, (proxy, rank) in enumerate(meta.get("proxy_bases", []))
        }
        pair_arrays = {name: arrays.pop(f"pair_{name}") for name in _PAIR_FIELDS if f"pair_{name}" in arrays}
        pair_sums = None
        if len(pair_arrays) == len(_PAIR_FIELDS) and meta.get("pair_sequences") is not None:
            pair_sums = SequenceTypeSums(**pair_arrays, n_sequences=int(meta["pair_sequences"]))
        return cls(
            key=UnitKey(**meta["key"]),
            dim=meta["dim"],
            bases=[BasisColumn(**b) for b in meta["bases"]],
            gradient_moments=moments["gradient"],
            activation_moments=moments["activation"],
            status=meta["status"],
            note=meta["note"],
            seconds=meta["seconds"],
            extra=meta.get("extra", {}),
            pair_sums=pair_sums,
            pair_note=meta.get("pair_note", "" if pair_sums else "not in this cache file"),
            proxy_bases=proxy_bases,
            **arrays,
        )


_PAIR_FIELDS = ("sequence", "token_type", "count", "square_sum", "vector_sum")


def _arrays_path(meta_path: Path) -> Path:
    """`<unit-id>.json` → `<unit-id>.npz`."""
    name = meta_path.name
    return meta_path.with_name((name[:-5] if name.endswith(".json") else name) + ".npz")
