"""Rendering options for :func:`anistat.report.render_bundle`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._columns import RESULT_KEYS

#: The HTML table's columns: the keys of a row (less ``objective`` and ``dim``, which the model and
#: site imply), then the numbers a reader compares.
DEFAULT_HTML_COLUMNS: tuple[str, ...] = (
    *(key for key in RESULT_KEYS if key not in ("objective", "dim")),
    "estimate",
    "ci_low",
    "ci_high",
    "control_mean",
    "control_sd",
    "p_value",
    "p_adjusted",
    "effect_size",
    "n_controls",
    "n_sequences",
    "status",
    "note",
)
DEFAULT_TABLE_METRICS: tuple[str, ...] = (
    "energy_ratio",
    "anisotropy_capture",
    "delta_isoscore_star",
)


@dataclass(frozen=True)
class ReportOptions:
    """What the report shows and how.

    Attributes:
        title: overrides the title taken from the protocol (``title``, else ``name``).
        table_metrics: metrics with one LaTeX table each (in this order; absent ones skipped).
        html_metrics: metrics listed in the HTML results table (``None``: all).
        html_columns: columns of the HTML results table (absent ones skipped).
        precision: significant digits for every number shown (1-8).
        group_by: column whose runs are merged with ``\\multirow`` in LaTeX tables and that
            heads each group in the HTML headline table (``model`` by default).
        table_checkpoints: ``"phase_last"`` shows, per model and phase, the last checkpoint of
            the phase; ``"all"`` shows every checkpoint.
        transpose_tables: LaTeX tables with ranks as columns and control kinds as rows
            (default: control kinds as columns, ranks as rows).
        primary_control / primary_proxy: used for the headline and figures where one must be
            chosen (default: ``normal`` — the paper's control — and ``pca``, else the first).
        compile_pdf: ``None`` compiles ``report.pdf`` when ``pdflatex`` is on PATH; ``True``
            requires it (error if missing); ``False`` never compiles.
        figures: draw the figures (``False``: HTML and tables only, for fast re-renders).
        figure_dpi: resolution of the PNGs embedded in the HTML.
        max_panels: most facets per figure (evenly thinned locations beyond it).
    """

    title: str | None = None
    table_metrics: tuple[str, ...] = DEFAULT_TABLE_METRICS
    html_metrics: tuple[str, ...] | None = None
    html_columns: tuple[str, ...] = DEFAULT_HTML_COLUMNS
    precision: int = 3
    group_by: str = "model"
    table_checkpoints: Literal["phase_last", "all"] = "phase_last"
    transpose_tables: bool = False
    primary_control: str | None = None
    primary_proxy: str | None = None
    compile_pdf: bool | None = None
    figures: bool = True
    figure_dpi: int = 110
    max_panels: int = 16

    def __post_init__(self) -> None:
        if not 1 <= int(self.precision) <= 8:
            raise ValueError(f"precision must be between 1 and 8, got {self.precision}")
        if self.table_checkpoints not in ("phase_last", "all"):
            raise ValueError(f"table_checkpoints must be 'phase_last' or 'all', got {self.table_checkpoints!r}")
        if not 40 <= int(self.figure_dpi) <= 400:
            raise ValueError(f"figure_dpi must be between 40 and 400, got {self.figure_dpi}")
        if int(self.max_panels) < 1:
            raise ValueError("max_panels must be at least 1")
        # Accept lists for convenience but store tuples (hashable, frozen).
        for name in ("table_metrics", "html_columns"):
            val = getattr(self, name)
            if isinstance(val, str):
                raise ValueError(f"{name} must be a sequence of names, not a string")
            object.__setattr__(self, name, tuple(val))
        if self.html_metrics is not None:
            if isinstance(self.html_metrics, str):
                raise ValueError("html_metrics must be a sequence of names, not a string")
            object.__setattr__(self, "html_metrics", tuple(self.html_metrics))
