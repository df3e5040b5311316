"""Worker processes for the per-unit analysis and the figures: the standard library's
:class:`concurrent.futures.ProcessPoolExecutor`, nothing home-made.

Workers start by ``forkserver`` where the system has it (Linux), else ``spawn``: never a plain
``fork`` of a process whose torch / OpenMP thread pools are already running (a forked child may
hang on their locks). The fork server imports the modules the tasks need once
(:data:`PRELOAD`), so each worker starts in milliseconds instead of re-importing torch.

Every task runs with one torch thread and one BLAS thread (``runtime.cpu_threads(1)``) — in a worker
and, with one worker, in this process — so a task's floating-point reductions, and with them its
results, do not depend on how many workers share the machine (bit for bit).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, TypeVar

from .runtime import cpu_threads
from .timing import add_cpu

T = TypeVar("T")

#: Modules the fork server imports before it forks any worker (the tasks' own modules).
PRELOAD = ("anistat.analyze", "anistat.report.figures")


def _start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _single_threaded_worker() -> None:
    import torch

    torch.set_num_threads(1)


@contextlib.contextmanager
def process_pool(workers: int) -> Iterator[Executor | None]:
    """A pool of ``workers`` processes for the block, or None for ``workers <= 1`` (the tasks then
    run in this process, one after another). Shut down (and its workers reaped, so their CPU time
    is counted, see ``anistat.timing``) when the block ends."""
    if workers <= 1:
        yield None
        return
    context = multiprocessing.get_context(_start_method())
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(list(PRELOAD))
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_single_threaded_worker) as pool:
        yield pool


def _one_thread(task: Callable[..., T], arguments: tuple[Any, ...]) -> tuple[T, float]:
    started = time.process_time()
    with cpu_threads(1):
        result = task(*arguments)
    return result, time.process_time() - started


def map_tasks(pool: Executor | None, task: Callable[..., T], arguments: Sequence[tuple[Any, ...]]) -> list[T]:
    """``[task(*a) for a in arguments]``, in order, each on one thread: in ``pool``'s workers
    (``task`` must be a module-level function and its arguments picklable; their CPU seconds are
    charged to the open stage, ``anistat.timing.add_cpu``), else here."""
    if pool is None:
        return [_one_thread(task, a)[0] for a in arguments]
    done = list(pool.map(_one_thread, [task] * len(arguments), arguments))
    add_cpu(sum(cpu for _, cpu in done))
    return [result for result, _ in done]


def start_server(workers: int) -> None:
    """Start the fork server (and its imports, :data:`PRELOAD`) now, in the background, when a
    pool of ``workers`` will be wanted later: the imports then overlap the work before it."""
    if workers > 1 and _start_method() == "forkserver":
        from multiprocessing import forkserver

        multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
        forkserver.ensure_running()
