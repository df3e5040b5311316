"""Exploring a bundle from Python (the notebook methods of `anistat.bundle.Bundle`): one report
figure for the rows a filter selects, and the proxy bases a bundle keeps.

Figures are the report's own (``anistat.report.figures.FIGURES``, drawn by the same functions
with the same theme), built from the rows whose columns equal the filters — e.g.
``figure("energy_ratio_trajectory", model="tiny-decoder", site="residual.1")`` for one site.

Bases: with ``report.keep_bases: true`` the bundle holds ``bases.safetensors``, one ``d × k``
orthonormal matrix ``U`` (``UᵀU = I`` to the precision it was fitted in, float32 on a float32
model; stored as float64) per model, checkpoint, site, proxy method and rank, under the key
``model/checkpoint/site/proxy/rank`` — the proxy the unit was measured with (the one fitted on
the early window; ``pca@refit`` proxies are the checkpoint's own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import AnistatInputError

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

#: The bundle file holding the proxy bases (``report.keep_bases``).
BASES_FILE = "bases.safetensors"


class BasisKey(NamedTuple):
    """Which proxy a kept basis is: the unit (model, checkpoint, site), the method and the rank."""

    model: str
    checkpoint: str
    site: str
    proxy: str
    rank: int


def bases_file(artifacts: Sequence[Any]) -> bytes:
    """``bases.safetensors`` of measured units (anything with ``key`` and ``proxy_bases``): every
    proxy basis as float64, keyed ``model/checkpoint/site/proxy/rank``."""
    import numpy as np
    from safetensors.numpy import save

    tensors = {}
    for artifact in artifacts:
        for (method, rank), basis in artifact.proxy_bases.items():
            key = BasisKey(artifact.key.model, artifact.key.checkpoint, artifact.key.site, method, int(rank))
            tensors["/".join(map(str, key))] = np.ascontiguousarray(basis, dtype=np.float64)
    return save(tensors, metadata={"format": "anistat proxy bases", "key": "model/checkpoint/site/proxy/rank"})


def read_bases(bundle: Any, **filters: Any) -> dict[BasisKey, np.ndarray]:
    """The kept bases of a loaded bundle whose key fields equal ``filters`` (e.g. ``site=``,
    ``rank=``), by :class:`BasisKey`; a bundle run without ``report.keep_bases`` is an error
    that says how to keep them."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    unknown = sorted(set(filters) - set(BasisKey._fields))
    if unknown:
        raise ValueError(f"unknown basis field(s) {unknown}; choose from {list(BasisKey._fields)}")
    path = bundle.path / BASES_FILE
    if not path.is_file():
        raise AnistatInputError(
            f"{bundle.path}: the bundle keeps no proxy bases; run its protocol with report.keep_bases: true"
        )
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise AnistatInputError(f"{path}: cannot be read as safetensors ({error})") from None
    kept = {}
    for name, basis in tensors.items():
        model, checkpoint, site, proxy, rank = name.rsplit("/", 4)
        key = BasisKey(model, checkpoint, site, proxy, int(rank))
        if all(str(getattr(key, field)) == str(value) for field, value in filters.items()):
            kept[key] = basis
    return kept


def figure_names() -> tuple[str, ...]:
    """The report's figures, by name (what :func:`bundle_figure` draws)."""
    from .report.figures import FIGURES

    return tuple(name for name, _, _ in FIGURES)


def _selected(table: Any, filters: dict[str, Any]) -> Any:
    """The rows of ``table`` whose columns equal ``filters`` (a list: any of its values)."""
    import pandas as pd

    chosen = table
    for column, wanted in filters.items():
        values = list(wanted) if isinstance(wanted, (list, tuple, set)) else [wanted]
        if pd.api.types.is_numeric_dtype(chosen[column]):  # rank=4 selects the rows whose rank is 4.0
            numbers = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
            chosen = chosen[chosen[column].isin(numbers.dropna().astype(float))]
        else:
            chosen = chosen[chosen[column].astype(str).isin([str(v) for v in values])]
    return chosen


def bundle_figure(bundle: Any, name: str, **filters: Any) -> Figure:
    """The report's figure ``name`` drawn from the bundle's rows whose columns equal ``filters``
    (``model``, ``site``, ``checkpoint``, ``rank``, ``control``, …; a list selects any of its
    values), as a :class:`matplotlib.figure.Figure` (not attached to pyplot)."""
    import warnings

    from .report import ReportOptions
    from .report._content import ReportContext
    from .report.figures import FIGURES, theme
    from .report.render import figure_context

    functions = {figure: (function, full) for figure, function, full in FIGURES}
    if name not in functions:
        raise ValueError(f"unknown figure {name!r}; choose from {list(functions)}")
    context = ReportContext(bundle.report_inputs(), ReportOptions(figures=True))
    unknown = sorted(set(filters) - set(context.full.columns))
    if unknown:
        raise ValueError(f"unknown column(s) {unknown} in the filters; results.csv has {list(bundle.results.columns)}")
    function, wants_full = functions[name]
    rows = _selected(context.full if wants_full else context.main, filters)
    if rows.empty:
        raise ValueError(f"no row of {bundle.path} has {filters}")
    with theme(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        drawn = function(rows, figure_context(context))
    if isinstance(drawn, str):
        raise ValueError(f"figure {name!r} has nothing to draw for {filters}: {drawn}")
    return drawn.fig
