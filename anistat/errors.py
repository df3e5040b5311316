"""Errors and warnings shared by every stage.

A single exception type marks *user* mistakes (bad protocol, missing file, unknown model, …).
The CLI turns it into one line on stderr and exit code 2; `IncompleteRun` (bundle written, some
units failed) into one line and exit code 3; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class AnistatError(Exception):
    """An expected failure the CLI reports as one line on stderr with `exit_code`."""

    exit_code = 2

    def __init__(self, message: str):
        # One line, always: the CLI contract is "one clear line on stderr".
        super().__init__(" ".join(str(message).split()))


class AnistatInputError(AnistatError):
    """Invalid input from the user: reported as one line on stderr, exit code 2, nothing written."""

    exit_code = 2


class CheckpointLoadError(AnistatInputError):
    """A checkpoint's weights fail to load during `anistat run` although its files passed the
    preflight's checks; the run adds where its finished units are kept."""


class IncompleteRun(AnistatError):
    """The run finished and its bundle was written, but some units failed (e.g. NaN/Inf
    gradients): exit code 3, so scripts can tell it from 2 (nothing written). The failed units
    are rows with status=failed and the reason in `note` (results.csv, report, manifest)."""

    exit_code = 3


class AnistatWarning(UserWarning):
    """Something the user should know about the result (e.g. too few controls)."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during `anistat run`, with what a rerun will find: `units_dir`, the
    folder where finished units are kept, and `n_finished`, how many are there (0: nothing was
    kept, a rerun starts over). Still a KeyboardInterrupt, so Python callers and notebooks see
    the usual exception; the CLI turns it into one line that says where the units are."""

    def __init__(self, units_dir, n_finished: int):
        self.units_dir = units_dir
        self.n_finished = int(n_finished)
        super().__init__(self.describe())

    def describe(self) -> str:
        if self.n_finished == 0:
            return "interrupted before any unit was finished; nothing was kept, a rerun starts over"
        return (
            f"interrupted; {self.n_finished} finished unit{'s are' if self.n_finished != 1 else ' is'} kept in "
            f"{self.units_dir}; a rerun resumes from {'them' if self.n_finished != 1 else 'it'}"
        )
