"""Errors and warnings shared by every stage.

A single exception type marks *user* mistakes (bad protocol, missing file, unknown model, …).
The CLI turns it into one line on stderr and exit code 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class AnistatInputError(Exception):
    """Invalid input from the user: reported as one line on stderr, exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        # One line, always: the CLI contract is "one clear line on stderr".
        super().__init__(" ".join(str(message).split()))


class CollectionError(AnistatInputError):
    """A unit could not be measured (e.g. NaN/Inf gradients); the reason is recorded."""


class AnistatWarning(UserWarning):
    """Something the user should know about the result (e.g. too few controls)."""


class ClaimsFailed(Exception):
    """Raised by `verify` when at least one claim fails (exit code 1)."""

    exit_code = 1
