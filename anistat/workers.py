"""Worker processes for the per-unit analysis and the figures: the standard library's
:class:`concurrent.futures.ProcessPoolExecutor`, nothing home-made.

Workers start by ``forkserver`` where the system has it (Linux), else ``spawn``: never a plain
``fork`` of a process whose torch / OpenMP thread pools are already running (a forked child may
hang on their locks). The fork server imports the modules the tasks need once
(:data:`PRELOAD`), so each worker starts in milliseconds instead of re-importing torch.

Large numpy arrays in a task's arguments travel through shared memory, not the pipe
(:func:`arrays_through_shared_memory`): a unit's per-(sequence, type) sums are ~45 MB at d = 768,
and pickling them through the pipe took longer than the task that reads them.

Every task runs with one torch thread and one BLAS thread (``runtime.cpu_threads(1)``) — in a worker
and, with one worker, in this process — so a task's floating-point reductions, and with them its
results, do not depend on how many workers share the machine (bit for bit).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, TypeVar

import numpy as np

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


#: A numpy array at least this large is sent to a worker through shared memory.
SHARED_ARRAY_BYTES = 1 << 20
#: Free space the shared-memory folder keeps beyond the array being sent (a container's /dev/shm
#: is often 64 MB; a full one kills the process writing to it with SIGBUS): else, the pipe.
SHARED_MEMORY_MARGIN = 512 << 20
SHARED_MEMORY_FOLDER = "/dev/shm"


def _shared_memory_free() -> int:
    try:
        stat = os.statvfs(SHARED_MEMORY_FOLDER)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


def _array_of(tensor: Any) -> np.ndarray:
    """In the worker: the array, over the shared memory the tensor maps (no copy)."""
    return tensor.numpy()


def _reduce_array(array: np.ndarray) -> str | tuple[Any, ...]:
    """How a task's numpy array pickles: a large plain one as a torch tensor — whose storage
    torch's own reducer moves to shared memory once and sends as a file descriptor — when the
    shared-memory folder has room, else by value. The worker gets the same bytes back as an
    array."""
    if (
        array.nbytes >= SHARED_ARRAY_BYTES
        and array.dtype.kind in "biuf"
        and array.dtype.isnative
        and _shared_memory_free() >= array.nbytes + SHARED_MEMORY_MARGIN
    ):
        import torch

        with warnings.catch_warnings():  # a read-only array: the tensor is only read, and copied to shared memory
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(np.ascontiguousarray(array))
        return _array_of, (tensor,)
    return array.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


@contextlib.contextmanager
def arrays_through_shared_memory() -> Iterator[None]:
    """For the block, numpy arrays that multiprocessing pickles (a pool's tasks) go by
    :func:`_reduce_array`. The reducer is registered with multiprocessing's pickler, which has
    no public way to take one back, so the previous entry is restored by hand."""
    from multiprocessing.reduction import ForkingPickler

    reducers = ForkingPickler._extra_reducers  # type: ignore[attr-defined]  # see the docstring
    previous = reducers.get(np.ndarray)
    ForkingPickler.register(np.ndarray, _reduce_array)
    try:
        yield
    finally:
        if previous is None:
            reducers.pop(np.ndarray, None)
        else:
            reducers[np.ndarray] = previous


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
    with (
        arrays_through_shared_memory(),
        ProcessPoolExecutor(workers, mp_context=context, initializer=_single_threaded_worker) as pool,
    ):
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
