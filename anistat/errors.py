"""Errors and warnings shared by every stage.

A single exception type marks *user* mistakes (bad protocol, missing file, unknown model, …).
The CLI turns it into one line on stderr and exit code 2; `IncompleteRun` (bundle written, some
units failed) into one line and exit code 4; anything else is a bug: exit code 70, with its
traceback written to a log file that the one line names.
"""

from __future__ import annotations

#: The exit codes of the command line, one meaning each (docs/cli.md shows this table).
EXIT_OK = 0  # success
EXIT_CLAIM_FAILED = 1  # the run or check finished and a claim of the protocol failed
EXIT_USER_ERROR = 2  # input or environment the user can fix (or an interrupted run); nothing half-written
EXIT_MISMATCH = 3  # verification or reproduction mismatch: files differ from the manifest, a rerun differs
EXIT_FAILED_UNITS = 4  # the bundle was written but some units failed (status=failed rows)
EXIT_INTERNAL_ERROR = 70  # a bug in anistat (EX_SOFTWARE): the traceback is in the log file named


class AnistatError(Exception):
    """An expected failure the CLI reports as one line on stderr with `exit_code`."""

    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str):
        # One line, always: the CLI contract is "one clear line on stderr".
        super().__init__(" ".join(str(message).split()))


class AnistatInputError(AnistatError):
    """Invalid input from the user: reported as one line on stderr, exit code 2, nothing written."""

    exit_code = EXIT_USER_ERROR


class CheckpointLoadError(AnistatInputError):
    """A checkpoint's weights fail to load during `anistat run` although its files passed the
    preflight's checks; the run adds where its finished units are kept."""


class IncompleteRun(AnistatError):
    """The run finished and its bundle was written, but some units failed (e.g. NaN/Inf
    gradients): exit code 4, so scripts can tell it from 2 (nothing written). The failed units
    are rows with status=failed and the reason in `note` (results.csv, report, manifest)."""

    exit_code = EXIT_FAILED_UNITS


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
