"""Where a run's time goes: wall and CPU seconds per named stage.

A :class:`StageTimer` accumulates, per stage name, the wall seconds (``time.perf_counter``) and the
CPU seconds of this process (``time.process_time``, every thread of it) spent inside
``timer.stage(name)``, plus the CPU seconds of the processes it waited for: its reaped children
(``resource.getrusage(RUSAGE_CHILDREN)``, e.g. pdflatex) and the tasks its worker pools ran
(measured in the worker, :func:`add_cpu`).
Stages nest *exclusively*: while an inner stage runs, the outer one's clock is paused, so the
stages' seconds add up to the time spent in any of them. Time inside the timer but outside every
stage is ``other``; the time before the timer started — the interpreter's start, imports, the
protocol's checks — is ``start-up``, measured from the process's start where the system says when
that was (Linux ``/proc``), so the stages of a command-line run sum to the process's wall time.

Code deep in the stack times itself with the module-level :func:`stage`, which charges the timer
that is active in this process (:meth:`StageTimer.activate`) and does nothing when none is: a
library call outside a run pays nothing and records nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

try:  # not on Windows
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

#: The stage of the time before the timer started (interpreter, imports, checks).
START_UP = "start-up"
#: The stage of the time inside the timer outside every named stage.
OTHER = "other"


@dataclass(frozen=True, kw_only=True)
class StageTime:
    """One stage's totals: wall seconds, CPU seconds (this process + reaped workers), entries."""

    wall: float
    cpu: float
    count: int = 1

    def as_json(self) -> dict[str, float | int]:
        return {"wall_s": round(self.wall, 3), "cpu_s": round(self.cpu, 3), "count": self.count}


def _children_cpu() -> float:
    if resource is None:  # pragma: no cover
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time() + _children_cpu()


def process_age() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat`` against ``/proc/uptime``,
    10 ms resolution); None where the system does not say."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            now = float(uptime.read().split()[0])
        return max(now - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


class StageTimer:
    """Wall and CPU seconds per stage (see the module docstring). Not thread-safe: one thread
    enters and leaves stages; work on other threads is charged to the stage open meanwhile."""

    def __init__(self, *, include_start_up: bool = False) -> None:
        self._wall0, self._cpu0 = _clocks()
        self._totals: dict[str, list[float]] = {}
        self._open: list[tuple[str, float, float]] = []  # (name, wall resumed, cpu resumed)
        self._start_up: StageTime | None = None
        self._elsewhere = 0.0  # CPU seconds of other processes' tasks (add_cpu)
        if include_start_up:
            age = process_age()
            if age is not None:
                self._start_up = StageTime(wall=age, cpu=time.process_time())

    def _charge(self, name: str, wall: float, cpu: float, entered: bool) -> None:
        total = self._totals.setdefault(name, [0.0, 0.0, 0])
        total[0] += wall
        total[1] += cpu
        total[2] += int(entered)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Charge the time inside to ``name`` (the enclosing stage's clock pauses meanwhile)."""
        wall, cpu = _clocks()
        if self._open:
            outer, w0, c0 = self._open[-1]
            self._charge(outer, wall - w0, cpu - c0, False)
        self._open.append((name, wall, cpu))
        self._charge(name, 0.0, 0.0, True)
        try:
            yield
        finally:
            wall, cpu = _clocks()
            _, w0, c0 = self._open.pop()
            self._charge(name, wall - w0, cpu - c0, False)
            if self._open:
                outer, _, _ = self._open[-1]
                self._open[-1] = (outer, wall, cpu)

    def add_cpu(self, seconds: float) -> None:
        """Charge CPU seconds spent elsewhere (a worker process's tasks) to the open stage."""
        self._elsewhere += seconds
        if self._open:
            self._charge(self._open[-1][0], 0.0, seconds, False)

    @contextlib.contextmanager
    def activate(self) -> Iterator[StageTimer]:
        """Make this the timer :func:`stage` charges, until the block ends."""
        global _ACTIVE
        previous, _ACTIVE = _ACTIVE, self
        try:
            yield self
        finally:
            _ACTIVE = previous

    def elapsed(self) -> float:
        """Wall seconds covered: since the timer started, plus the start-up before it."""
        return time.perf_counter() - self._wall0 + (self._start_up.wall if self._start_up else 0.0)

    def stages(self) -> dict[str, StageTime]:
        """Every stage so far (an open one up to now), then ``other``, with ``start-up`` first."""
        wall_now, cpu_now = _clocks()
        totals = {name: list(values) for name, values in self._totals.items()}
        for name, w0, c0 in self._open[-1:]:
            totals[name][0] += wall_now - w0
            totals[name][1] += cpu_now - c0
        timed: dict[str, StageTime] = {START_UP: self._start_up} if self._start_up else {}
        timed.update({name: StageTime(wall=w, cpu=c, count=int(n)) for name, (w, c, n) in totals.items()})
        inside = [t for name, t in timed.items() if name != START_UP]
        other_wall = wall_now - self._wall0 - sum(t.wall for t in inside)
        other_cpu = cpu_now + self._elsewhere - self._cpu0 - sum(t.cpu for t in inside)
        timed[OTHER] = StageTime(wall=max(other_wall, 0.0), cpu=max(other_cpu, 0.0))
        return timed

    def as_json(self) -> dict[str, dict[str, float | int]]:
        """The manifest's ``stages``: ``{name: {"wall_s", "cpu_s", "count"}}`` in first-entered order."""
        return {name: t.as_json() for name, t in self.stages().items()}

    def largest(self) -> tuple[str, StageTime]:
        """The stage with the most wall seconds."""
        return max(self.stages().items(), key=lambda item: item[1].wall)


_ACTIVE: StageTimer | None = None


def active_timer() -> StageTimer | None:
    """The timer :func:`stage` charges now (None outside a timed run)."""
    return _ACTIVE


def add_cpu(seconds: float) -> None:
    """Charge ``seconds`` of CPU spent in another process to the active timer's open stage."""
    if _ACTIVE is not None:
        _ACTIVE.add_cpu(seconds)


def stage(name: str) -> contextlib.AbstractContextManager[None]:
    """``with stage(name):`` charges the active timer's stage ``name``; a no-op without one."""
    return _ACTIVE.stage(name) if _ACTIVE is not None else contextlib.nullcontext()


def summary(stages: Mapping[str, Mapping[str, float]]) -> str:
    """One line naming the largest stage of a manifest's ``stages`` (:meth:`StageTimer.as_json`):
    ``largest stage: fit pass 12.3s of 40.1s (31%)``; '' when there is none."""
    walls = {name: float(times.get("wall_s", 0.0)) for name, times in stages.items()}
    if not walls:
        return ""
    name = max(walls, key=lambda n: walls[n])
    total = sum(walls.values())
    share = 100.0 * walls[name] / total if total > 0 else 0.0
    return f"largest stage: {name} {walls[name]:.1f}s of {total:.1f}s ({share:.0f}%)"
