"""The machine a run executes on: CPU threads (a setting) and the description the manifest keeps.

Threads
-------
`anistat run --threads N` / the protocol's `threads:` set the intra-op threads of torch and the
BLAS threads of numpy/scipy (threadpoolctl) for the run, and restore both afterwards. `auto` (the
default) resolves, in this order, to

1. `OMP_NUM_THREADS` when it is set to a positive integer (the usual way to pin a job's threads);
2. else the CPUs this process may use — the affinity mask (`os.sched_getaffinity`), capped by a
   cgroup CPU quota (`cpu.max` of cgroup v2, `cpu.cfs_quota_us / cpu.cfs_period_us` of v1: a
   container's "2 CPUs" on a 64-core host) — minus the cores other processes keep busy *now*,
   at least 1. "Now" is a short sample (:func:`busy_cpus_now`): two reads of `/proc/stat`
   :data:`CPU_SAMPLE_SECONDS` apart give each usable CPU's busy share, and this process's own
   CPU time in between is subtracted. Where there is no `/proc/stat` (macOS, Windows) the
   1-minute load average stands in. The load average reads the past: right after a job has
   finished it still counts that job's cores, and a run started then would take half the
   threads of an idle machine (the issue's 2-core case: 1 thread and 107 s where 2 took 75 s).

Why the last step: torch's default is one thread per core, and on a machine whose cores are
already busy its OpenMP threads wait for each other at every operation. Measured on a 2-core VM
with both cores kept busy by two other processes: a tiny model's training step 648 ms with torch's default 2 threads
against 30 ms with 1, and the quickstart 16 min against 2.5 min (issue #22).

The thread count never changes what a run means, so it is *not* part of the protocol's hash; it
is recorded in the manifest (`machine.threads`) with where it came from. What it may change, and
by how much, is stated in docs/reproducibility.md: built-in models always train on one
thread (`single_thread`), so training is identical whatever the setting; the measurement's float32
GEMMs and reductions may round differently with another thread count.

Machine description
-------------------
`machine_description` is what the manifest records beside the package versions: the CPU model,
the instruction set torch dispatches to (`torch.backends.cpu.get_cpu_capability()`), the usable
CPUs, torch's build (BLAS, LAPACK, MKL, oneDNN, OpenMP: `torch.__config__.show()` /
`parallel_info()`), numpy's BLAS (`numpy.show_config`), the BLAS/OpenMP libraries loaded and their
threads (threadpoolctl), and the environment variables that change CPU numerics
(`ATEN_CPU_CAPABILITY`, `MKL_CBWR`, …) when set.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

#: Upper bound of an explicit thread count (a typo like 10000 must not spawn 10000 threads).
MAX_THREADS = 1024

#: Environment variables that change which CPU kernels run or how many threads they use.
NUMERIC_ENVIRONMENT = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "TORCH_NUM_THREADS",
)

ThreadSetting = int | Literal["auto"]


#: How long the CPUs are watched to see how many are busy now (seconds).
CPU_SAMPLE_SECONDS = 0.25


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs this process may use: `affinity` (its affinity mask), `quota` (a cgroup CPU quota
    in CPUs, None when unlimited), `usable` = min of the two (rounded up), `load` the 1-minute
    load average (None where the platform has none), `busy` the CPUs other processes keep busy
    now (:func:`busy_cpus_now`; None when not sampled or not measurable)."""

    affinity: int
    quota: float | None
    usable: int
    load: float | None
    busy: float | None = None


def _cpu_jiffies(stat: str, cpus: set[int] | None) -> tuple[int, int]:
    """(busy, total) clock ticks summed over the per-CPU lines of a `/proc/stat` text, for the
    CPUs in `cpus` (all when None): idle and iowait are idle; guest time is already counted in
    user time, so it is left out of the total."""
    busy = total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        fields = [int(v) for v in rest.split()[:8]]
        fields += [0] * (8 - len(fields))
        idle = fields[3] + fields[4]
        busy += sum(fields) - idle
        total += sum(fields)
    return busy, total


def busy_from_samples(
    before: str, after: str, cpus: set[int] | None, own_seconds: float, wall_seconds: float
) -> float | None:
    """The CPUs kept busy by *other* processes between two `/proc/stat` texts: the busy share of
    the sampled CPUs' ticks × their number, minus this process's own CPU time over the wall time
    between the reads (``own_seconds / wall_seconds`` CPUs); at least 0; None when no tick passed."""
    busy_0, total_0 = _cpu_jiffies(before, cpus)
    busy_1, total_1 = _cpu_jiffies(after, cpus)
    n_cpus = sum(
        1
        for line in after.splitlines()
        if line.startswith("cpu") and line[3:4].isdigit() and (cpus is None or int(line.split()[0][3:]) in cpus)
    )
    if total_1 <= total_0 or n_cpus == 0:
        return None
    share = (busy_1 - busy_0) / (total_1 - total_0)
    own = own_seconds / wall_seconds if wall_seconds > 0 else 0.0
    return max(0.0, share * n_cpus - own)


def busy_cpus_now(seconds: float = CPU_SAMPLE_SECONDS) -> float | None:
    """How many of this process's usable CPUs other processes keep busy now: two reads of
    `/proc/stat` `seconds` apart (:func:`busy_from_samples`); None where `/proc/stat` cannot be
    read (not Linux)."""
    import time

    stat = Path("/proc/stat")
    try:
        cpus: set[int] | None = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = None
    try:
        before, own_0, wall_0 = stat.read_text(), time.process_time(), time.perf_counter()
        time.sleep(seconds)
        after, own_1, wall_1 = stat.read_text(), time.process_time(), time.perf_counter()
    except OSError:
        return None
    return busy_from_samples(before, after, cpus, own_1 - own_0, wall_1 - wall_0)


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a run uses, where it came from (`--threads`, `protocol`,
    `OMP_NUM_THREADS` or `auto`), and for `auto` the numbers behind it."""

    threads: int
    source: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.threads} thread{'s' if self.threads != 1 else ''} ({self.source}" + (
            f": {self.detail})" if self.detail else ")"
        )


def _cgroup_v2_quota(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest `cpu.max` quota (in CPUs) on this process's cgroup v2 path (`membership`
    names it, below `root`) and its ancestors, None if none is set."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    relative = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if relative is None:
        return None
    quotas = []
    directory = root / relative.lstrip("/")
    while True:
        try:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            if quota != "max" and float(period) > 0:
                quotas.append(float(quota) / float(period))
        except (OSError, ValueError):
            pass
        if directory == root or root not in directory.parents:
            break
        directory = directory.parent
    return min(quotas) if quotas else None


def _cgroup_v1_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """cgroup v1's `cpu.cfs_quota_us / cpu.cfs_period_us` (in CPUs), None when unlimited (-1)."""
    for folder in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            quota = int((root / folder / "cpu.cfs_quota_us").read_text())
            period = int((root / folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota > 0 and period > 0:
            return quota / period
    return None


def cpu_budget(sample: bool = False) -> CpuBudget:
    """How many CPUs this process may use (affinity ∩ cgroup quota) and how busy the machine is
    (`sample`: also how many CPUs are busy now, which takes :data:`CPU_SAMPLE_SECONDS`)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        affinity = os.cpu_count() or 1
    quota = _cgroup_v2_quota()
    if quota is None:
        quota = _cgroup_v1_quota()
    usable = max(1, min(affinity, math.ceil(quota - 1e-9) if quota is not None else affinity))
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return CpuBudget(affinity=affinity, quota=quota, usable=usable, load=load, busy=busy_cpus_now() if sample else None)


def omp_num_threads() -> int | None:
    """`OMP_NUM_THREADS` as a positive integer (its first level, as in `4,2`), None if unset or
    unreadable (OpenMP ignores such a value too)."""
    raw = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def resolve_threads(cli: int | None, protocol: ThreadSetting = "auto") -> ThreadChoice:
    """The run's thread count: `--threads` (`cli`), else the protocol's integer, else `auto`
    (see the module docstring). Validation of the values themselves is the caller's (the CLI
    option and the protocol field carry their ranges)."""
    if cli is not None:
        return ThreadChoice(int(cli), "--threads")
    if protocol != "auto":
        return ThreadChoice(int(protocol), "protocol")
    pinned = omp_num_threads()
    if pinned is not None:
        return ThreadChoice(min(pinned, MAX_THREADS), "OMP_NUM_THREADS")
    budget = cpu_budget(sample=True)
    busy = budget.busy if budget.busy is not None else budget.load  # now, else the last minute
    idle = budget.usable if busy is None else math.floor(budget.usable - busy + 0.5)
    threads = max(1, min(budget.usable, idle))
    detail = (
        f"{budget.usable} usable CPU{'s' if budget.usable != 1 else ''} (affinity {budget.affinity}"
        + (f", cgroup quota {budget.quota:g}" if budget.quota is not None else "")
        + ")"
        + (f", {budget.busy:.2f} busy now ({CPU_SAMPLE_SECONDS:g} s sample)" if budget.busy is not None else "")
        + (f", load average {budget.load:.2f}" if budget.load is not None else "")
    )
    return ThreadChoice(threads, "auto", detail)


@contextlib.contextmanager
def cpu_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` intra-op threads in torch and as many BLAS threads in
    numpy/scipy (threadpoolctl); both are restored afterwards (a notebook keeps its settings)."""
    import torch
    from threadpoolctl import threadpool_limits

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One torch thread for the block (the built-in training; see the module docstring)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ----------------------------------------------------------------------------------------------
# the machine, for the manifest
# ----------------------------------------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's marketing name (`/proc/cpuinfo`'s model name on Linux), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.split(":", 1)[0].strip() in ("model name", "Model", "Hardware"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def torch_build() -> dict[str, Any]:
    """torch's CPU build, parsed from `torch.__config__.show()` / `parallel_info()`: the BLAS and
    LAPACK it was built with, MKL and oneDNN versions, the parallel backend, and the instruction
    set its kernels dispatch to on this CPU."""
    import torch

    shown = torch.__config__.show()
    parallel = torch.__config__.parallel_info()

    def setting(name: str) -> str | None:
        found = re.search(rf"\b{name}=([^,\s]+)", shown)
        return found.group(1) if found else None

    def line_with(pattern: str, text: str) -> str | None:
        found = re.search(pattern, text)
        return " ".join(found.group(1).split()) if found else None

    return {
        "version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": setting("BLAS_INFO"),
        "lapack": setting("LAPACK_INFO"),
        "mkl": line_with(r"Math Kernel Library Version ([^\n]*?) for", shown),
        "mkldnn": line_with(r"MKL-DNN (v[^\s]+)", shown),
        "openmp": line_with(r"OpenMP (\d+)", shown),
        "parallel_backend": line_with(r"ATen parallel backend: ([^\n]*)", parallel),
        "cuda": setting("USE_CUDA") not in (None, "0", "OFF"),
    }


def numpy_blas() -> dict[str, Any]:
    """The BLAS/LAPACK numpy was built against (`numpy.show_config(mode="dicts")`)."""
    import numpy as np

    try:
        config = np.show_config(mode="dicts")
    except TypeError:  # numpy < 1.26: no dict mode
        return {"version": np.__version__}
    dependencies = config.get("Build Dependencies", {})
    out: dict[str, Any] = {"version": np.__version__}
    for name in ("blas", "lapack"):
        entry = dependencies.get(name, {})
        out[name] = " ".join(str(entry.get(key, "")) for key in ("name", "version")).strip() or None
    simd = config.get("SIMD Extensions", {})
    out["simd_found"] = list(simd.get("found", []) or [])
    return out


def loaded_thread_pools() -> list[dict[str, Any]]:
    """The BLAS / OpenMP libraries loaded in this process and their thread counts (threadpoolctl),
    with OpenBLAS' kernel architecture (e.g. SkylakeX, Haswell: it decides the rounding)."""
    from threadpoolctl import threadpool_info

    keep = ("user_api", "internal_api", "version", "num_threads", "architecture", "threading_layer", "prefix")
    return [{key: info[key] for key in keep if info.get(key) is not None} for info in threadpool_info()]


def machine_description(choice: ThreadChoice | None = None) -> dict[str, Any]:
    """The `machine` field of manifest.json (see the module docstring). `choice`: the run's
    thread setting (None where anistat did not set it, e.g. inside a user's training loop)."""
    import torch

    budget = cpu_budget()
    threads: dict[str, Any] = {"torch": torch.get_num_threads(), "torch_interop": torch.get_num_interop_threads()}
    if choice is not None:
        threads.update(setting=choice.threads, source=choice.source, detail=choice.detail)
    threads["training"] = 1  # built-in models always train on one thread (models._train_builtin)
    return {
        "cpu": cpu_model(),
        "architecture": platform.machine(),
        "cpus": {"affinity": budget.affinity, "cgroup_quota": budget.quota, "usable": budget.usable},
        "threads": threads,
        "torch_build": torch_build(),
        "numpy": numpy_blas(),
        "thread_pools": loaded_thread_pools(),
        "environment": {name: os.environ[name] for name in NUMERIC_ENVIRONMENT if name in os.environ},
    }
