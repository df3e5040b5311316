"""The per-unit analysis over worker processes (`anistat.workers`), bit-identical to one process.

A run's analysis has three per-unit phases around one shared step:

1. every unit's spectra — the eigendecompositions of its gradient second moment and covariance and
   its proxies' traces in both (:func:`anistat.analyze.units.prepare_unit`);
2. (shared, here) the exact tests of every unit off the Haar streams of each width;
3. every unit's rows — intervals, bootstraps, data tests (:func:`~anistat.analyze.units.rows_of_unit`)
   — and its frequency rows (:func:`~anistat.analyze.frequency.unit_frequency_rows`).

On a GPU run the eigendecompositions of phase 1 run on the device, batched, before the tasks
(and the exact tests' Haar streams of phase 2 run there too). Phases 1 and 3 are independent across units — each unit's random draws are seeded by its own id
(`anistat.seeding.derive_seed`), never by a shared generator's state — so they run in a pool of
worker processes, one unit per task, and come back in unit order. Each task runs on one thread in
a worker and in this process alike (`anistat.workers.map_tasks`), so 1 and N workers give the same
bits. A worker is sent only its own unit's slice of the exact tests (:func:`nulls_of_unit`).
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..collect import UnitArtifact
from ..protocol import Protocol
from ..workers import map_tasks
from .frequency import bucket_id, unit_frequency_rows
from .nulls import ExactNulls
from .units import PreparedUnit, device_eigenvalues, prepare_unit, rows_of_unit, unit_matrices


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


def _prepare(artifact: UnitArtifact, protocol: Protocol, eigenvalues: Any) -> PreparedUnit:
    # the artifact stays where it is: only what was computed from it travels back
    return replace(prepare_unit(artifact, protocol, eigenvalues), artifact=None)  # type: ignore[arg-type]


def prepare_units(
    pool: Executor | None,
    artifacts: list[UnitArtifact],
    protocol: Protocol,
    device: str | torch.device | None = None,
) -> dict[str, PreparedUnit]:
    """Phase 1: every analysable unit's :class:`PreparedUnit`, keyed by unit id. With a
    ``device``, the eigendecompositions — the phase's heavy part, ``O(d³)`` per matrix — run there
    first, batched (:func:`~anistat.analyze.units.device_eigenvalues`), and the tasks get them."""
    ok = [a for a in artifacts if a.status == "ok"]
    eigenvalues: list[Any] = [None] * len(ok)
    if device is not None and ok:
        matrices = [m for a in ok for m in unit_matrices(a)]
        values = device_eigenvalues(matrices, device)
        eigenvalues = list(zip(values[0::2], values[1::2]))
    arguments = [(a, protocol, e) for a, e in zip(ok, eigenvalues)]
    prepared = map_tasks(pool, _prepare if pool is not None else prepare_unit, arguments)
    return {a.key.id: replace(unit, artifact=a) for a, unit in zip(ok, prepared)}


def unit_rows_all(
    pool: Executor | None,
    prepared: list[PreparedUnit],
    nulls: ExactNulls,
    protocol: Protocol,
    settings: Any,
) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """Phase 3a: every prepared unit's rows and warnings, in the order given."""
    arguments = [(unit, _sliced(pool, nulls, unit.artifact.key.id), protocol, settings) for unit in prepared]
    return map_tasks(pool, rows_of_unit, arguments)


def frequency_rows_all(
    pool: Executor | None,
    artifacts: list[UnitArtifact],
    token_counts: dict[str, np.ndarray],
    protocol: Protocol,
    nulls: ExactNulls,
) -> list[dict[str, Any]]:
    """Phase 3b: the frequency rows of every analysable unit, in unit order."""
    ok = [a for a in artifacts if a.status == "ok"]
    arguments = [(a, token_counts.get(a.key.model), protocol, _sliced(pool, nulls, a.key.id)) for a in ok]
    return [row for rows in map_tasks(pool, unit_frequency_rows, arguments) for row in rows]


def _sliced(pool: Executor | None, nulls: ExactNulls, unit_id: str) -> ExactNulls:
    # in this process the whole object is shared; a worker gets (and unpickles) only its unit's part
    return nulls if pool is None else nulls_of_unit(nulls, unit_id)
