"""The per-unit analysis over worker processes (`anistat.analyze.parallel`): the same tables, bit
for bit, from 1 and 2 workers on the units of a small real run (trained model, real backprop)."""

from __future__ import annotations

import io
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import MINI_PROTOCOL

from anistat.analyze import analyze_run
from anistat.analyze.parallel import nulls_of_unit
from anistat.pipeline import collect_units
from anistat.protocol import parse_protocol


def _csv(frame: pd.DataFrame) -> bytes:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")  # full float precision: every bit shows
    return buffer.getvalue().encode()


def _pair(analysis):
    return analysis.results, analysis.frequency, (analysis.warnings, dict(analysis.null_settings))


@pytest.fixture(scope="module")
def mini_units(tmp_path_factory):
    folder: Path = tmp_path_factory.mktemp("parallel")
    protocol = parse_protocol(yaml.safe_load(MINI_PROTOCOL))
    artifacts, info = collect_units(protocol, torch.device("cpu"), folder / "cache", lambda message: None)
    return protocol, artifacts, info["frequency"]


@pytest.mark.slow
def test_one_and_two_workers_give_the_same_bits(mini_units):
    protocol, artifacts, counts = mini_units
    one = _pair(analyze_run(artifacts, counts, protocol, workers=1))
    two = _pair(analyze_run(artifacts, counts, protocol, workers=2))
    assert len(one[0]) > 100 and one[1] is not None and len(one[1]) > 10
    assert _csv(one[0]) == _csv(two[0])
    assert _csv(one[1]) == _csv(two[1])
    assert one[2] == two[2]  # the warnings and the Monte-Carlo sizes too


@pytest.mark.slow
def test_a_worker_gets_exactly_its_units_exact_tests(mini_units):
    from anistat.analyze import null_settings, run_exact_tests
    from anistat.analyze.frequency import bucket_spectra
    from anistat.analyze.units import prepare_unit

    protocol, artifacts, _ = mini_units
    spectra = [prepare_unit(a, protocol).spectrum for a in artifacts[:2]]
    spectra += [s for a in artifacts[:2] for s in bucket_spectra(a)]
    nulls = run_exact_tests(spectra, protocol, null_settings(artifacts[:2], protocol))
    first = artifacts[0].key.id
    mine = nulls_of_unit(nulls, first)
    assert mine.energy and all(key[0].split("#")[0] == first for key in mine.energy)
    theirs = nulls_of_unit(nulls, artifacts[1].key.id)
    assert len(mine.energy) + len(theirs.energy) == len(nulls.energy)
    assert mine.recorded_energy.keys() | theirs.recorded_energy.keys() == nulls.recorded_energy.keys()


@pytest.mark.slow
def test_each_task_reads_nothing_its_lightened_unit_leaves_out(mini_units):
    """A task is sent its unit without the heavy parts it does not read (`lightened`): every task
    gives the rows the whole unit gives, and a part it is not sent is really gone."""
    from anistat.analyze import null_settings, run_exact_tests
    from anistat.analyze.frequency import bucket_spectra, unit_frequency_rows
    from anistat.analyze.parallel import lightened, unit_eigen, unit_rows_task
    from anistat.analyze.units import prepare_unit, rows_of_unit

    protocol, artifacts, counts = mini_units
    unit = artifacts[0]
    assert unit.pair_sums is not None and unit.gradient_moments.get("bucket_outer") is not None
    settings = null_settings([unit], protocol)
    whole = prepare_unit(unit, protocol)
    eigen = unit_eigen(lightened(unit, "second_moments", "bucket_moments"), protocol, None, True)
    np.testing.assert_array_equal(eigen.eigenvalues[0], whole.second_moment.eigenvalues)
    np.testing.assert_array_equal(eigen.eigenvalues[1], whole.covariance.eigenvalues)
    assert eigen.spectrum.energy_observed == whole.spectrum.energy_observed
    buckets = bucket_spectra(unit)
    assert [b.energy_observed for b in eigen.buckets] == [b.energy_observed for b in buckets] and buckets
    nulls = run_exact_tests([whole.spectrum, *buckets], protocol, settings)
    light_rows = unit_rows_task(lightened(unit, "second_moments"), eigen, nulls, protocol, settings)
    assert str(light_rows) == str(rows_of_unit(whole, nulls, protocol, settings))
    light_frequency = unit_frequency_rows(lightened(unit, "pair_sums"), counts[unit.key.model], protocol, nulls)
    assert str(light_frequency) == str(unit_frequency_rows(unit, counts[unit.key.model], protocol, nulls))
    bare = lightened(unit)
    assert bare.pair_sums is None and "outer" not in bare.gradient_moments and "outer" not in bare.activation_moments
    assert "bucket_outer" not in bare.gradient_moments and unit.gradient_moments.get("bucket_outer") is not None


@pytest.mark.slow
def test_figures_drawn_by_two_workers_are_the_files_of_one_process(mini_bundle, tmp_path):
    from anistat.bundle import Bundle
    from anistat.report import ReportOptions
    from anistat.report._content import ReportContext
    from anistat.report.figures import render_figures
    from anistat.report.render import figure_context
    from anistat.workers import map_tasks, process_pool

    ctx = ReportContext(inputs=Bundle.load(mini_bundle).report_inputs(), options=ReportOptions())
    drawn = {}
    for workers in (1, 2):
        with process_pool(workers) as pool:
            saved, skipped = render_figures(
                ctx.main, ctx.full, figure_context(ctx), tmp_path / str(workers), 60, partial(map_tasks, pool)
            )
        drawn[workers] = ([f.name for f in saved], skipped, {f.name: f.png_bytes for f in saved})
        assert len(saved) >= 3
    assert drawn[1] == drawn[2]
    for name in drawn[1][0]:
        assert (tmp_path / "1" / f"{name}.pdf").read_bytes() == (tmp_path / "2" / f"{name}.pdf").read_bytes()


@pytest.mark.slow
def test_the_device_path_of_the_analysis_run_on_the_cpu_matches_the_cpu_path(mini_units):
    """`linalg_on_device`: the eigendecompositions batched on the run's device (here the CPU, through
    the same code a GPU run takes) give the CPU path's table within float64 rounding."""
    protocol, artifacts, counts = mini_units
    cpu = _pair(analyze_run(artifacts, counts, protocol))
    device = _pair(analyze_run(artifacts, counts, protocol, "cpu", linalg_on_device=True, workers=2))
    for table in (0, 1):
        a, b = cpu[table], device[table]
        assert list(a.columns) == list(b.columns) and len(a) == len(b)
        numeric = [c for c in a.columns if pd.api.types.is_float_dtype(a[c])]
        np.testing.assert_allclose(
            a[numeric].to_numpy(dtype=float), b[numeric].to_numpy(dtype=float), rtol=1e-9, atol=1e-12
        )
    exact = cpu[0]["p_test"] == "haar_monte_carlo"
    assert exact.any()
    assert (cpu[0].loc[exact, "p_value"].to_numpy() == device[0].loc[exact, "p_value"].to_numpy()).all()


def test_batched_eigenvalues_match_one_at_a_time():
    from anistat.analyze.units import Frame, device_eigenvalues

    rng = np.random.default_rng(0)
    matrices = [(lambda x: x @ x.T)(rng.standard_normal((d, d + 3))) for d in (5, 8, 5, 8, 5)]
    batched = device_eigenvalues(matrices, "cpu", batch=2)
    for matrix, values in zip(matrices, batched):
        np.testing.assert_allclose(values, Frame.of(matrix).eigenvalues, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(values, np.linalg.eigvalsh(matrix), rtol=1e-10, atol=1e-10)


def test_large_arrays_reach_a_worker_through_shared_memory_with_the_same_bytes(monkeypatch):
    """A pool's large numpy arguments pickle as a shared-memory handle (not their bytes), arrive
    bit for bit, and the pickler is back to normal once the pool is gone; with no room in the
    shared-memory folder they go by value."""
    from multiprocessing.reduction import ForkingPickler

    import anistat.workers as workers

    big = np.random.default_rng(0).standard_normal((600, 768))  # 3.7 MB
    small = np.arange(10.0)
    by_value = len(ForkingPickler.dumps(big))
    assert by_value > big.nbytes
    with workers.arrays_through_shared_memory():
        assert len(ForkingPickler.dumps(big)) < 10_000
        assert len(ForkingPickler.dumps(small)) < 1_000
        read_only = big.copy()
        read_only.flags.writeable = False
        assert len(ForkingPickler.dumps(read_only)) < 10_000
        monkeypatch.setattr(workers, "_shared_memory_free", lambda: 0)
        assert len(ForkingPickler.dumps(big)) == by_value
        monkeypatch.undo()
    assert len(ForkingPickler.dumps(big)) == by_value
    arrays = [big, big[::2], big.astype(np.float32), small]
    with workers.process_pool(2) as pool:
        received = workers.map_tasks(pool, np.ndarray.tobytes, [(a,) for a in arrays])
    assert received == [a.tobytes() for a in arrays]
