"""anistat — do activation-derived low-rank directions capture a language model's true gradients?

Public API (mirrors the CLI):

* `load_protocol(path)`, `run(protocol, out)` — the whole pipeline;
* geometry on plain tensors/arrays: `energy_fraction`, `isoscore`, `isoscore_star`,
  `fit_proxy`, `draw_controls`.
"""

__version__ = "0.1.0"

from .errors import AnistatInputError, AnistatWarning
from .geometry import draw_controls, energy_fraction, fit_proxy, isoscore, isoscore_star
from .protocol import Protocol, load_protocol


def run(protocol, out=None, **kwargs):
    """Run a protocol (a `Protocol` or a path) and write its bundle; see `anistat.pipeline.run`."""
    from .pipeline import run as _run

    return _run(protocol, out, **kwargs)


__all__ = [
    "AnistatInputError", "AnistatWarning", "Protocol", "__version__", "draw_controls", "energy_fraction",
    "fit_proxy", "isoscore", "isoscore_star", "load_protocol", "run",
]
