"""`anistat calibrate`'s files: the calibration study of :mod:`anistat.stats.calibrate` written as
calibration.csv, .json, .png, .pdf and .html (and family.csv with the many-unit multiplicity
study). The page goes through the report's autoescaped templates
(:func:`anistat.report.pages.render_calibration_html`), the one rendering path of anistat's HTML;
the statistics stay pure in :mod:`anistat.stats`, which imports nothing of the report.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import asdict

import numpy as np

from . import vocabulary as vocab
from .stats.calibrate import GOALS, RANDOM_PROXY, CalibrationResult, _jsonable
from .stats.ratio_intervals import RATIO_INTERVAL_METHODS

#: The columns of the page's table of many-unit families (:func:`anistat.stats.run_family_calibration`).
FAMILY_COLUMNS = (
    "condition",
    "stop_after",
    "fwer_holm",
    "fwer_holm_se",
    vocab.FDR_BH,
    "fdr_bh_se",
    "mean_discoveries_bh",
)


def _figure(result: CalibrationResult):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    frame = result.to_frame()
    frame = frame[frame["documents"] == result.settings["n_documents"]]
    alpha = result.settings["alpha"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    null = frame[frame["condition"] == RANDOM_PROXY]
    ax = axes[0]
    labels = {
        "rejection_exact": "exact (Haar MC)",
        "rejection_exact_sequential": "exact, sequential",
        "rejection_paper_normal_20": "paper: 20 normal controls",
        "rejection_paper_normal_99": "paper: 99 normal controls",
    }
    width = 0.8 / len(labels)
    x = np.arange(len(null))
    for i, (key, label) in enumerate(labels.items()):
        ax.bar(x + i * width, null[key], width, yerr=1.96 * null[key + "_se"], label=label, capsize=2)
    ax.axhline(alpha, color="grey", ls="--", lw=1)
    ax.set_xticks(x + width, null["scenario"])
    ax.set_ylabel(f"P(p ≤ {alpha:g}) under a random proxy")
    ax.set_title("Type-I error with an uninformative proxy")
    ax.legend(fontsize=7)
    ax = axes[1]
    for scenario, group in frame.groupby("scenario", sort=False):
        ax.plot(
            group["condition"], group["coverage_ratio_normal_document"], marker="o", label=f"{scenario} (documents)"
        )
        if scenario == "clustered":
            ax.plot(
                group["condition"],
                group["coverage_ratio_normal_sequence"],
                marker="x",
                ls=":",
                label="clustered (sequences, ignoring documents)",
            )
    ax.axhspan(*GOALS["coverage"], color="grey", alpha=0.15)
    ax.set_xlabel("condition (random proxy or planted ratio)")
    ax.set_ylabel("CI coverage, energy ratio (normal)")
    ax.set_title(f"{result.settings['ci_method']} {result.settings['ci_level']:.0%} CI coverage")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, plt


def write_calibration_report(result: CalibrationResult, out_dir, family=None) -> dict:
    """Write ``calibration.csv``, ``.json``, ``.png``, ``.pdf`` and ``.html`` into ``out_dir``
    (and ``family.csv`` with the many-unit multiplicity study ``family``, a
    :class:`anistat.stats.family_calibration.FamilyCalibration`, when given).

    The HTML is self-contained (figure as base64 PNG, escaped text), rendered through the report's
    template ``calibration.html.j2`` (:func:`calibration_html`).

    Parameters
    ----------
    result : CalibrationResult
        The study to write (:func:`run_calibration`).
    out_dir : str or path-like
        The directory written into (created if missing).
    family : FamilyCalibration, optional
        The many-unit multiplicity study, written as ``family.csv`` and shown in the report.

    Returns
    -------
    dict of str to str
        ``{kind: path}`` of every file written.

    Examples
    --------
    >>> import numpy as np
    >>> from anistat import stats
    >>> import tempfile
    >>> result = stats.run_calibration(2, seed=0, scenarios=('isotropic',), planted_ratios=(1.0,), n_documents=12, dim=8, rank=2, n_bootstrap=50, n_null=19, n_test_resamples=49)
    >>> from anistat.calibration_report import write_calibration_report
    >>> with tempfile.TemporaryDirectory() as out:
    ...     written = write_calibration_report(result, out)
    ...
    >>> sorted(written)[:2]
    ['csv', 'html']
    """
    import pandas as pd

    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"calibration.{k}") for k in ("csv", "json", "png", "pdf", "html")}
    frame = result.to_frame()
    frame.to_csv(paths["csv"], index=False)
    payload = {k: v for k, v in asdict(result).items() if k != "simulations"}
    if family is not None:
        paths["family"] = os.path.join(out_dir, "family.csv")
        pd.DataFrame(list(family.rows)).to_csv(paths["family"], index=False)
        payload["family"] = {"settings": family.settings, "rows": list(family.rows), "elapsed_s": family.elapsed_s}
    with open(paths["json"], "w", encoding="utf-8") as fh:
        json.dump(_jsonable(payload), fh, indent=2, allow_nan=False)
    fig, plt = _figure(result)
    fig.savefig(paths["pdf"])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130)
    plt.close(fig)
    png = buf.getvalue()
    with open(paths["png"], "wb") as fh:
        fh.write(png)
    with open(paths["html"], "w", encoding="utf-8") as fh:
        fh.write(calibration_html(result, frame, png, family))
    return paths


def calibration_html(result: CalibrationResult, frame, png: bytes, family) -> str:
    """The self-contained calibration page: the goals' checks, the figure, the main table at the
    goal study size, coverage by study size (every ratio-interval method), by effective number of
    documents and by energy spread, the family study when given, and the settings."""
    import pandas as pd

    from .report.pages import PageTable, render_calibration_html

    main = frame[frame["documents"] == result.settings["n_documents"]]
    columns = [
        "scenario",
        "condition",
        "rejection_exact",
        "rejection_exact_sequential",
        "rejection_paper_normal_20",
        "rejection_data_document",
        "rejection_sign_flip_document",
        "coverage_fraction_document",
        "coverage_ratio_haar_document",
        "coverage_ratio_normal_document",
        "coverage_ratio_normal_sequence",
    ]
    coverage = [
        "coverage_ratio_normal_document",
        "coverage_ratio_haar_document",
        *(f"coverage_method_{m}" for m in RATIO_INTERVAL_METHODS),
        "n_eff_median",
        "m_eff_median",
    ]
    by_size = frame.groupby(["documents", "scenario"], sort=False)[coverage].mean().reset_index()
    tables = [
        PageTable.of(main, columns),
        PageTable.of(
            by_size,
            heading="Coverage by number of documents",
            text="The analysis' interval against the ratio to the normal and the haar control, then every "
            "ratio-interval method on the same documents and resamples (haar ratio, mean over conditions), and "
            "the median Kish n_eff and effective size m_eff.",
        ),
        PageTable.of(
            pd.DataFrame(list(result.concentration)),
            heading="Coverage and the data test by effective number of documents",
        ),
        PageTable.of(
            pd.DataFrame(list(result.spread)), heading="The data test by the documents' energy spread n/n_eff"
        ),
    ]
    if family is not None:
        tables.append(
            PageTable.of(
                pd.DataFrame(list(family.rows)),
                FAMILY_COLUMNS,
                heading="Multiplicity with shared draws",
                text=f"{family.settings['n_simulations']} simulated studies of {family.settings['n_units']} units "
                f"({family.settings['n_effects']} planted in the design with effects), {family.settings['n_null']} "
                f"Haar draws: Holm's family-wise error and BH's false discovery rate at "
                f"alpha = {family.settings['alpha']:g}, with the draws shared by a study's units (as anistat runs "
                "them) and with independent draws per unit.",
            )
        )
    settings = json.dumps(_jsonable(result.settings))
    return render_calibration_html(result.settings, result.elapsed_s, result.checks, png, tables, settings)
