"""torch.distributed support: `torchrun --nproc_per_node N -m anistat run …` shards sequences.

Every statistic the collector keeps is a sum, and every per-sequence row belongs to exactly one
rank (rank r measures batches r, r+N, r+2N, … of the test split and leaves the other rows at
zero). An all-reduce (SUM) of the accumulators therefore gives every rank the single-process
arrays, rows in the same order: per-sequence values are bit-identical, pooled moments differ
only by float64 summation order. Fit-split activation samples are sharded the same way.
Rank 0 writes the unit cache and the bundle; the others only compute.

Backend: NCCL when collecting on CUDA, gloo otherwise (the CI test runs 2 CPU processes).
"""

from __future__ import annotations

import atexit
import os

import torch


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() else None


def requested_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def init_distributed(device_type: str = "cpu") -> bool:
    """Initialise the default process group when launched by torchrun (WORLD_SIZE > 1)."""
    dist = _dist()
    if dist is None or requested_world_size() <= 1:
        return False
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
        atexit.register(_shutdown)
    return True


def _shutdown() -> None:
    dist = _dist()
    if dist is not None and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass


def active() -> bool:
    dist = _dist()
    return bool(dist is not None and dist.is_initialized() and dist.get_world_size() > 1)


#: The rank this process had when :func:`finish` ended its process group (None before that).
_finished_rank: list[int] = []


def finish() -> None:
    """End the process group on every rank at the same point, right after collection.

    Rank 0 goes on to analyse and publish alone; the other ranks return and exit. Tearing the
    group down here, on every rank after one barrier, rather than in an ``atexit`` hook while
    the interpreter shuts down, keeps gloo's threads out of interpreter teardown: a rank that
    aborts there (``terminate called without an active exception`` was seen once in the test
    suite) makes torchrun stop rank 0 before it has written the bundle. :func:`rank` keeps
    answering with the rank the process had, so ``is_main`` still tells rank 0 from the others."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return
    own_rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    _finished_rank[:] = [own_rank]


def rank() -> int:
    if active():
        return _dist().get_rank()
    return _finished_rank[0] if _finished_rank else 0


def world_size() -> int:
    return _dist().get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def local_rank() -> int:
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def owns(index: int) -> bool:
    """Whether this rank processes item `index` (round robin)."""
    return index % world_size() == rank()


def _collective(tensor: torch.Tensor, operation) -> torch.Tensor:
    """Run a collective on `tensor` in place; NCCL only takes CUDA tensors, so CPU tensors take a
    round trip through the rank's GPU there (gloo takes them as they are)."""
    if not active():
        return tensor
    if _dist().get_backend() == "nccl" and tensor.device.type != "cuda":
        staged = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        operation(staged)
        tensor.copy_(staged.to(tensor.device))
        return tensor
    operation(tensor)
    return tensor


def all_reduce_sum_(tensor: torch.Tensor) -> torch.Tensor:
    return _collective(tensor, lambda t: _dist().all_reduce(t, op=_dist().ReduceOp.SUM))


def all_reduce_max_(tensor: torch.Tensor) -> torch.Tensor:
    return _collective(tensor, lambda t: _dist().all_reduce(t, op=_dist().ReduceOp.MAX))


def broadcast_(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    return _collective(tensor, lambda t: _dist().broadcast(t, src=src))


def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's `tensor` concatenated along dim 0 in rank order (row counts may differ;
    other dimensions must agree). Without torchrun: `tensor` itself."""
    if not active():
        return tensor
    sizes = torch.zeros(world_size(), dtype=torch.int64)
    sizes[rank()] = tensor.shape[0]
    all_reduce_sum_(sizes)
    longest = int(sizes.max())
    padded = torch.zeros((world_size(), longest) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    # each rank writes its rows into its own slot; a sum over ranks is then the gather
    padded[rank(), : tensor.shape[0]] = tensor
    all_reduce_sum_(padded)
    return torch.cat([padded[r, : int(sizes[r])] for r in range(world_size())])


def agree(flag: bool) -> bool:
    """Rank 0's decision, on every rank (e.g. 'this checkpoint is cached')."""
    if not active():
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int64)
    broadcast_(value)
    return bool(value.item())


def barrier() -> None:
    if active():
        _dist().barrier()
