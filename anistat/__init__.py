"""anistat — do activation-derived low-rank directions capture a language model's true gradients?

Public API (mirrors the CLI):

* `load_protocol(path)`, `run(protocol, out)` — the whole pipeline; `load(path)` reads a bundle
  into a `Bundle` (tables as DataFrames, typed manifest record and claims, `.summary()`,
  `.figure()`, `.bases()`); `load_bundle(path)` reads it back as the same `RunResult` that
  `run` returns;
* `anistat.preflight.preflight(protocol)` — every check `run` makes before it trains or loads
  a model (what `anistat validate` runs);
* geometry on plain tensors/arrays: `energy_fraction`, `isoscore`, `isoscore_star`,
  `fit_proxy`, `draw_controls`;
* measuring inside one's own training loop: `TrainingMeter`, `AnistatCallback`.

Names are imported on first use (module `__getattr__`, PEP 562): `import anistat` and the
command line's light commands (`--help`, `validate`, `schema`, `init`) never import torch,
transformers, matplotlib or pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# public name -> (module, attribute)
_LAZY = {
    "AnistatInputError": ("anistat.errors", "AnistatInputError"),
    "AnistatWarning": ("anistat.errors", "AnistatWarning"),
    "Protocol": ("anistat.protocol", "Protocol"),
    "load_protocol": ("anistat.protocol", "load_protocol"),
    "RunResult": ("anistat.bundle", "RunResult"),
    "load_bundle": ("anistat.bundle", "load_bundle"),
    "load": ("anistat.bundle", "Bundle.load"),
    "Bundle": ("anistat.bundle", "Bundle"),
    "draw_controls": ("anistat.geometry", "draw_controls"),
    "energy_fraction": ("anistat.geometry", "energy_fraction"),
    "fit_proxy": ("anistat.geometry", "fit_proxy"),
    "isoscore": ("anistat.geometry", "isoscore"),
    "isoscore_star": ("anistat.geometry", "isoscore_star"),
    "TrainingMeter": ("anistat.callbacks", "TrainingMeter"),
    "AnistatCallback": ("anistat.callbacks", "AnistatCallback"),
}

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from .bundle import Bundle, RunResult, load_bundle

    load = Bundle.load
    from .callbacks import AnistatCallback, TrainingMeter
    from .errors import AnistatInputError, AnistatWarning
    from .geometry import draw_controls, energy_fraction, fit_proxy, isoscore, isoscore_star
    from .protocol import Protocol, load_protocol


def run(protocol, out=None, **kwargs):
    """Run a protocol (a `Protocol` or a path) and write its bundle; see `anistat.pipeline.run`."""
    from .pipeline import run as _run

    return _run(protocol, out, **kwargs)


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'anistat' has no attribute '{name}'") from None
    value: Any = importlib.import_module(module)
    for part in attribute.split("."):  # "Bundle.load": a class's attribute
        value = getattr(value, part)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["__version__", "run", *_LAZY]
