"""Live metrics while the model trains: each measured step's point estimates go to TensorBoard —
through the Trainer's own logging (`report_to`) and through a plain loop's `SummaryWriter` —
equal the final bundle's point estimates, and leave the bundle byte-identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _helpers import SETTINGS as METER_SETTINGS
from _helpers import batches, tiny_gpt2, tiny_trainer

from anistat.callbacks import AnistatCallback, TrainingMeter
from anistat.live import LiveMetrics, logger_publisher, scalar_name, top_eigenvalues

SETTINGS = {**METER_SETTINGS, "proxies": {"ranks": [2, 3], "max_fit_tokens": 80}}  # two ranks
SITES = ("residual.0", "mlp.0")
METRICS = ("energy_fraction", "energy_over_k_d", "oracle_fraction", "energy_over_oracle")


def _event_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Every scalar in the TensorBoard event files under `folder`: {tag: {step: value}}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, dict[int, float]] = {}
    runs = sorted({path.parent for path in folder.rglob("events.out.tfevents.*")})
    assert runs, f"no event file under {folder}"
    for run in runs:
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars.setdefault(tag, {}).update({event.step: event.value for event in events.Scalars(tag)})
    return scalars


def _plain_loop(out: Path, logger=None, steps: int = 5, window: int = 1):
    model = tiny_gpt2()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = TrainingMeter(
        model,
        out=out,
        fit_steps=[0, 1],
        measure_steps=[1, 3],
        name="plain",
        verbose=False,
        window=window,
        logger=logger,
        **SETTINGS,
    )
    for step, batch in enumerate(batches(steps)):
        with meter.step(step):
            model(input_ids=batch, labels=batch).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    meter.close()
    return meter


def _bundle_estimates(bundle: Path) -> dict[tuple[str, str, str, int], float]:
    """(checkpoint, site, metric, rank) → the bundle's point estimate: the proxy's energy fraction
    and the oracle fraction."""
    rows = pd.read_csv(bundle / "results.csv")
    picked = rows[
        ((rows["metric"] == "energy_fraction") & (rows["proxy"] != "oracle")) | (rows["metric"] == "oracle_fraction")
    ]
    return {(r.checkpoint, r.site, r.metric, int(r.rank)): float(r.estimate) for r in picked.itertuples()}


def _check_against_bundle(
    scalars: dict[str, dict[int, float]], bundle: Path, steps: list[int], prefix: str = ""
) -> None:
    estimates = _bundle_estimates(bundle)
    proxy = pd.read_csv(bundle / "results.csv").query("proxy != 'oracle'")["proxy"].iloc[0]
    for site in SITES:
        for rank in (2, 3):
            tags = {metric: prefix + scalar_name(site, proxy, rank, metric) for metric in METRICS}
            for step in steps:
                values = {metric: scalars[tag][step] for metric, tag in tags.items()}
                fraction = estimates[(f"step{step}", site, "energy_fraction", rank)]
                oracle = estimates[(f"step{step}", site, "oracle_fraction", rank)]
                # TensorBoard stores float32: compare at its precision
                np.testing.assert_allclose(values["energy_fraction"], fraction, rtol=1e-5)
                np.testing.assert_allclose(values["oracle_fraction"], oracle, rtol=1e-5)
                np.testing.assert_allclose(values["energy_over_k_d"], fraction / (rank / 16), rtol=1e-5)
                np.testing.assert_allclose(values["energy_over_oracle"], fraction / oracle, rtol=1e-5)
            assert sorted(scalars[tags["energy_fraction"]]) == steps  # the measured steps, and only those


@pytest.mark.slow
def test_plain_loop_summary_writer_gets_the_bundles_point_estimates(tmp_path: Path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    _plain_loop(tmp_path / "bundle", logger=writer)
    writer.close()
    scalars = _event_scalars(tmp_path / "tb")
    assert all(tag.startswith("anistat/") for tag in scalars)
    assert len(scalars) == len(SITES) * 2 * len(METRICS)  # one proxy method, ranks 2 and 3
    _check_against_bundle(scalars, tmp_path / "bundle", [1, 3])


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.slow
def test_live_metrics_leave_the_bundle_byte_identical(tmp_path: Path, window: int):
    """With a window of 2 the live numbers are read mid-unit too (steps 1 and 2 of unit step1)."""
    seen: list[tuple[str, float, int]] = []
    _plain_loop(tmp_path / "with", logger=lambda name, value, step: seen.append((name, value, step)), window=window)
    _plain_loop(tmp_path / "without", window=window)
    assert {step for _, _, step in seen} == ({1, 3} if window == 1 else {1, 2, 3, 4})
    assert (tmp_path / "with" / "results.csv").read_bytes() == (tmp_path / "without" / "results.csv").read_bytes()


def _train(folder: Path, *, live: bool = True, report_to: tuple[str, ...] = ()):
    callback = AnistatCallback(
        out=folder / "bundle",
        fit_steps=[0],
        measure_steps=[0, 2, 4],
        name="trained",
        live=live,
        verbose=False,
        **SETTINGS,
    )
    trainer = tiny_trainer(folder, [callback], report_to=list(report_to))
    trainer.train()
    assert callback.error is None
    return trainer


def _live_entries(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if any(key.startswith("anistat/") for key in entry)]


def test_trainer_report_to_tensorboard_shows_the_live_metrics(tmp_path: Path):
    trainer = _train(tmp_path, report_to=("tensorboard",))
    scalars = _event_scalars(tmp_path / "trainer")
    # the Trainer's integrations file training logs under `train/` (transformers' rewrite_logs)
    _check_against_bundle(scalars, tmp_path / "bundle", [0, 2, 4], prefix="train/")
    assert [entry["step"] for entry in _live_entries(trainer)] == [0, 2, 4]


@pytest.mark.slow
def test_trainer_live_false_publishes_nothing_and_writes_the_same_bundle(tmp_path: Path):
    quiet = _train(tmp_path / "quiet", live=False)
    loud = _train(tmp_path / "loud")
    assert not _live_entries(quiet) and len(_live_entries(loud)) == 3
    assert (tmp_path / "quiet" / "bundle" / "results.csv").read_bytes() == (
        tmp_path / "loud" / "bundle" / "results.csv"
    ).read_bytes()


def _spiked_moment(d: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    g = torch.randn(4 * d, d, generator=generator, dtype=torch.float64) * torch.linspace(
        4.0, 0.2, d, dtype=torch.float64
    )
    return g.T @ g


def test_top_eigenvalues_match_the_float64_decomposition():
    m = _spiked_moment(200, 0)
    exact = torch.linalg.eigvalsh(m).flip(0)[:6]
    top = top_eigenvalues(m, 6)
    assert top.dtype == torch.float64 and top.shape == (6,)
    np.testing.assert_allclose(top.numpy(), exact.numpy(), rtol=1e-5)
    np.testing.assert_allclose(
        float(top.sum()) / float(torch.trace(m)), float(exact.sum()) / float(torch.trace(m)), rtol=1e-6
    )


def test_oracle_every_n_th_step_is_left_out_in_between_not_carried_over():
    from anistat.collect import BasisSet

    m = _spiked_moment(40, 3)
    bases = {"s": [BasisSet("axis", 2, torch.eye(40)[:, :2], {}, 0.0)]}
    live = LiveMetrics(bases, lambda values, step: None, oracle_every=2)
    with_oracle = [any(name.endswith("oracle_fraction") for name in live({"s": m}, step)) for step in range(5)]
    assert with_oracle == [True, False, True, False, True]
    with pytest.raises(ValueError, match="oracle_every"):
        LiveMetrics(bases, lambda values, step: None, oracle_every=0)


def test_live_point_estimates_closed_form():
    """E(U) = tr(UᵀMU)/tr(M) and E*_k from M's spectrum, for an eigenvector basis: E = E*_k."""
    from anistat.collect import BasisSet

    m = _spiked_moment(120, 2)
    eigenvalues, vectors = torch.linalg.eigh(m)
    top2 = vectors[:, -2:]
    bases = {"s": [BasisSet("oracle_like", 2, top2, {}, 0.0), BasisSet("axis", 3, torch.eye(120)[:, :3], {}, 0.0)]}
    published = []
    scalars = LiveMetrics(bases, lambda values, step: published.append((values, step)))({"s": m}, 7)
    trace = float(eigenvalues.sum())
    assert published == [(scalars, 7)]
    np.testing.assert_allclose(
        scalars["anistat/s/oracle_like_k2/energy_fraction"], float(eigenvalues[-2:].sum()) / trace, rtol=1e-9
    )
    # the oracle comes from a float32 eigvalsh: ~1e-6 relative (anistat.live.top_eigenvalues)
    np.testing.assert_allclose(scalars["anistat/s/oracle_like_k2/energy_over_oracle"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        scalars["anistat/s/axis_k3/energy_fraction"], float(m.diagonal()[:3].sum()) / trace, rtol=1e-9
    )
    np.testing.assert_allclose(
        scalars["anistat/s/axis_k3/energy_over_k_d"], float(m.diagonal()[:3].sum()) / trace / (3 / 120), rtol=1e-9
    )


def test_a_logger_that_cannot_take_scalars_is_refused():
    with pytest.raises(TypeError, match="add_scalar"):
        logger_publisher("runs/")
