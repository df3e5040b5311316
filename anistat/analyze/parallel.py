"""The per-unit analysis over worker processes (`anistat.workers`), bit-identical to one process.

A run's analysis has three per-unit phases around one shared step:

1. every unit's spectra — the eigenvalues of its gradient second moment and covariance, its
   proxies' traces in both (:func:`anistat.analyze.units.prepare_unit`) and its frequency
   buckets' spectra (:func:`~anistat.analyze.frequency.bucket_spectra`) — in one task per unit;
2. (shared, here) the exact tests of every unit off the Haar streams of each width;
3. every unit's rows — intervals, bootstraps, data tests (:func:`~anistat.analyze.units.rows_of_unit`)
   — and its frequency rows (:func:`~anistat.analyze.frequency.unit_frequency_rows`).

On a GPU run the eigendecompositions of phase 1 run on the device, batched, before the tasks
(and the exact tests' Haar streams of phase 2 run there too). Phases 1 and 3 are independent across units — each unit's random draws are seeded by its own id
(`anistat.seeding.derive_seed`), never by a shared generator's state — so they run in a pool of
worker processes, one unit per task, and come back in unit order. Each task runs on one thread in
a worker and in this process alike (`anistat.workers.map_tasks`), so 1 and N workers give the same
bits. A task is sent only what it reads: its unit's slice of the exact tests
(:func:`nulls_of_unit`) and its unit without the heavy parts other tasks read (:func:`lightened`),
and phase 1 sends back eigenvalues, not matrices.

Under ``torchrun`` the units are shared out the same way across ranks (:class:`RankShare`: rank
``r`` of ``w`` takes units ``r, r + w, …``): each rank runs phases 1 and 3 for its share, rank 0
gathers the spectra (in unit order), runs the exact tests and sends them to every rank, then
gathers every rank's rows and alone runs what needs the whole family (multiplicity, the
resolution guard; the claims and the meta-analysis come after, in the pipeline). The tables are
those of one process, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import torch

from ..collect import UnitArtifact, distributed
from ..protocol import Protocol
from ..timing import stage
from ..workers import map_tasks
from .frequency import bucket_id, bucket_matrices, bucket_spectra, unit_frequency_rows
from .nulls import ExactNulls, UnitSpectrum
from .units import device_eigenvalues, failed_rows, prepare_unit, rows_of_unit, unit_matrices

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RankShare:
    """This process's share of the units: ``rank`` of ``world`` (``torch.distributed``'s, when a
    process group is running; else 0 of 1 — the whole)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> RankShare:
        return cls(rank=distributed.rank(), world=distributed.world_size()) if distributed.active() else cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mine(self, items: list[T]) -> list[T]:
        """Items ``rank, rank + world, …``: a share fixed by the order alone."""
        return items[self.rank :: self.world]

    def gather(self, mine: list[T]) -> list[T]:
        """Every rank's ``mine`` back in the items' order on rank 0 ([] on the others)."""
        if self.world == 1:
            return mine
        import torch.distributed as dist

        shares: list[Any] | None = [None] * self.world if self.is_main else None
        dist.gather_object(mine, shares, dst=0)
        if shares is None:
            return []
        total = sum(len(share) for share in shares)
        return [shares[i % self.world][i // self.world] for i in range(total)]

    def from_main(self, value: T | None) -> T:
        """Rank 0's ``value`` on every rank."""
        if self.world == 1:
            return value  # type: ignore[return-value]
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]


def nulls_of_unit(nulls: ExactNulls, unit_id: str) -> ExactNulls:
    """The exact tests (and recorded draws) of one unit and its frequency buckets."""
    bucket_prefix = bucket_id(unit_id, 0).rsplit("#", 1)[0] + "#"

    def mine(key: tuple[Any, ...]) -> bool:
        return key[0] == unit_id or str(key[0]).startswith(bucket_prefix)

    return ExactNulls(
        energy={k: v for k, v in nulls.energy.items() if mine(k)},
        delta={k: v for k, v in nulls.delta.items() if mine(k)},
        recorded_energy={k: v for k, v in nulls.recorded_energy.items() if mine(k)},
        recorded_delta={k: v for k, v in nulls.recorded_delta.items() if mine(k)},
        draws_made=dict(nulls.draws_made),
    )


#: The heavy parts of a unit artifact — the rest is O(sequences × bases + vocabulary). A task is
#: sent the unit without the parts it does not read (:func:`lightened`): at d = 768 with 96 test
#: sequences a whole unit pickles to 65 MB, and sending it whole to each of its four tasks made
#: 12 units' analysis slower with two workers than with one (benchmarks/README.md).
HEAVY_PARTS = ("second_moments", "bucket_moments", "pair_sums")


def lightened(artifact: UnitArtifact, *keep: str) -> UnitArtifact:
    """``artifact`` with only the :data:`HEAVY_PARTS` in ``keep``: ``second_moments`` (the d × d
    gradient and activation second moments), ``bucket_moments`` (the gradient second moment of
    every frequency bucket, B × d × d), ``pair_sums`` (the per-(sequence, type) activation sums,
    pairs × d). A dropped moment is missing from its dict (a task that reads it fails loudly);
    the arrays themselves are shared, not copied."""
    gradient, activation = dict(artifact.gradient_moments), dict(artifact.activation_moments)
    if "bucket_moments" not in keep:
        gradient.pop("bucket_outer", None)
    if "second_moments" not in keep:
        gradient.pop("outer", None)
        activation.pop("outer", None)
    return replace(
        artifact,
        gradient_moments=gradient,
        activation_moments=activation,
        pair_sums=artifact.pair_sums if "pair_sums" in keep else None,
    )


@dataclass(frozen=True, kw_only=True)
class UnitEigen:
    """What phase 1 computes of one unit: the eigenvalues of ``M`` and ``C`` (phase 3 rebuilds its
    frames from the unit's moments with them, instead of receiving d × d matrices back), the
    unit's exact-test inputs and its frequency buckets'."""

    eigenvalues: tuple[np.ndarray, np.ndarray]
    spectrum: UnitSpectrum
    buckets: list[UnitSpectrum]


def unit_eigen(
    artifact: UnitArtifact,
    protocol: Protocol,
    eigenvalues: tuple[Any, Any, list[np.ndarray]] | None,
    frequency: bool,
) -> UnitEigen:
    """Phase 1 for one unit (a task): its :class:`PreparedUnit`'s spectra and, with
    ``frequency``, its buckets' (``eigenvalues``: ``M``'s, ``C``'s and the buckets', when
    computed on the run's device)."""
    moments, buckets = (eigenvalues[:2], eigenvalues[2]) if eigenvalues is not None else (None, None)
    prepared = prepare_unit(artifact, protocol, moments)
    return UnitEigen(
        eigenvalues=(prepared.second_moment.eigenvalues, prepared.covariance.eigenvalues),
        spectrum=prepared.spectrum,
        buckets=bucket_spectra(artifact, buckets) if frequency else [],
    )


def eigen_all(
    pool: Executor | None,
    artifacts: list[UnitArtifact],
    protocol: Protocol,
    device: str | torch.device | None,
    frequency: bool,
) -> dict[str, UnitEigen]:
    """Phase 1: every analysable unit's :class:`UnitEigen`, keyed by unit id. With a ``device``,
    the eigendecompositions — ``M``'s, ``C``'s and the frequency buckets', ``O(d³)`` each — run
    there first, batched (:func:`~anistat.analyze.units.device_eigenvalues`), and the tasks get
    them."""
    ok = [a for a in artifacts if a.status == "ok"]
    eigenvalues: list[Any] = [None] * len(ok)
    if device is not None and ok:
        matrices = [[*unit_matrices(a), *(bucket_matrices(a) if frequency else [])] for a in ok]
        values = iter(device_eigenvalues([m for unit in matrices for m in unit], device))
        eigenvalues = []
        for unit in matrices:
            mine = [next(values) for _ in unit]
            eigenvalues.append((mine[0], mine[1], mine[2:]))
    parts = ("second_moments", "bucket_moments") if frequency else ("second_moments",)
    arguments = [(lightened(a, *parts), protocol, e, frequency) for a, e in zip(ok, eigenvalues)]
    return dict(zip((a.key.id for a in ok), map_tasks(pool, unit_eigen, arguments)))


def unit_rows_task(
    artifact: UnitArtifact, eigen: UnitEigen, nulls: ExactNulls, protocol: Protocol, settings: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """Phase 3a for one unit (a task): its frames rebuilt from its moments and phase 1's
    eigenvalues (the same numbers: no eigendecomposition is repeated), then its rows."""
    return rows_of_unit(prepare_unit(artifact, protocol, eigen.eigenvalues), nulls, protocol, settings)


def unit_rows_all(
    pool: Executor | None,
    artifacts: list[UnitArtifact],
    eigen: dict[str, UnitEigen],
    nulls: ExactNulls,
    protocol: Protocol,
    settings: Any,
) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """Phase 3a: every analysable unit's rows and warnings, in the order given."""
    arguments = [
        (lightened(a, "second_moments"), eigen[a.key.id], _sliced(pool, nulls, a.key.id), protocol, settings)
        for a in artifacts
    ]
    return map_tasks(pool, unit_rows_task, arguments)


def frequency_rows_each(
    pool: Executor | None,
    artifacts: list[UnitArtifact],
    token_counts: dict[str, np.ndarray],
    protocol: Protocol,
    nulls: ExactNulls,
) -> list[list[dict[str, Any]]]:
    """Phase 3b: the frequency rows of each of ``artifacts`` (analysable ones), in their order."""
    arguments = [
        (lightened(a, "pair_sums"), token_counts.get(a.key.model), protocol, _sliced(pool, nulls, a.key.id))
        for a in artifacts
    ]
    return map_tasks(pool, unit_frequency_rows, arguments)


def _sliced(pool: Executor | None, nulls: ExactNulls, unit_id: str) -> ExactNulls:
    # in this process the whole object is shared; a worker gets (and unpickles) only its unit's part
    return nulls if pool is None else nulls_of_unit(nulls, unit_id)


@dataclass(frozen=True, kw_only=True)
class UnitTables:
    """What the per-unit phases give rank 0: every unit's rows and warnings, in unit order (a
    failed unit's rows included), the frequency rows, and the exact tests."""

    rows: list[dict[str, Any]]
    notes: list[str]
    frequency_rows: list[dict[str, Any]]
    nulls: ExactNulls


def per_unit_phases(
    pool: Executor | None,
    artifacts: list[UnitArtifact],
    token_counts: dict[str, np.ndarray],
    protocol: Protocol,
    settings: Any,
    exact_tests: Callable[[list[UnitSpectrum]], ExactNulls],
    *,
    device: str | torch.device | None,
    frequency: bool,
    share: RankShare,
) -> UnitTables | None:
    """Phases 1–3 of the module docstring for this rank's share of ``artifacts`` (``device``: where
    the eigendecompositions run, None: in the tasks); None on a rank other than 0."""
    mine = share.mine(artifacts)
    with stage("unit spectra"):
        eigen = eigen_all(pool, mine, protocol, device, frequency)
        spectra = share.gather(
            [(eigen[a.key.id].spectrum, eigen[a.key.id].buckets) if a.key.id in eigen else (None, []) for a in mine]
        )
    with stage("exact tests"):
        ordered = [unit for unit, _ in spectra if unit is not None] + [b for _, buckets in spectra for b in buckets]
        nulls = share.from_main(exact_tests(ordered) if share.is_main else None)
    mine_ok = [a for a in mine if a.key.id in eigen]
    with stage("intervals and bootstraps"):
        computed = dict(
            zip((a.key.id for a in mine_ok), unit_rows_all(pool, mine_ok, eigen, nulls, protocol, settings))
        )
        per_unit = share.gather(
            [computed[a.key.id] if a.key.id in computed else (failed_rows(a, protocol), []) for a in mine]
        )
    with stage("frequency rows"):
        rows_of = dict(
            zip((a.key.id for a in mine_ok), frequency_rows_each(pool, mine_ok, token_counts, protocol, nulls))
        )
        frequency_per_unit = share.gather([rows_of.get(a.key.id, []) if frequency else [] for a in mine])
    if not share.is_main:
        return None
    return UnitTables(
        rows=[row for rows, _ in per_unit for row in rows],
        notes=[note for _, notes in per_unit for note in notes],
        frequency_rows=[row for rows in frequency_per_unit for row in rows],
        nulls=nulls,
    )
