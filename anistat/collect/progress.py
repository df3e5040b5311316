"""Progress bars (tqdm on stderr) that stay quiet unless stderr is a terminal.

Only rank 0 of a torchrun job draws bars; `ANISTAT_PROGRESS=0|1` forces them off/on.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from . import distributed


def enabled() -> bool:
    forced = os.environ.get("ANISTAT_PROGRESS")
    if forced is not None:
        return forced not in ("0", "", "false", "False") and distributed.is_main()
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and distributed.is_main()


class _Quiet:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def bar(total: int | None, desc: str, unit: str = "it", leave: bool = False):
    """A tqdm bar on stderr, or a no-op object with the same methods."""
    if not enabled():
        return _Quiet()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return _Quiet()
    return tqdm(total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr, dynamic_ncols=True)
