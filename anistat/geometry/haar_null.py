"""Haar random subspaces as the diagonals of their projections: one stream shared by many units.

A unit's exact test compares its proxy ``U`` with uniformly random (Haar) ``k``-subspaces ``Q``
of ``R^d`` on statistics that depend on ``Q`` only through ``P = QQᵀ`` and a symmetric PSD matrix
``S = V Λ Vᵀ`` (the gradient second moment for energies, the covariance for ΔIsoScore*). With
``P̃ = Vᵀ P V``::

    tr(QᵀSQ)   = Σ_j λ_j P̃_jj            (energy fraction E(Q) = tr(QᵀMQ) / tr M)
    ‖SQ‖_F²    = Σ_j λ_j² P̃_jj
    ‖QᵀSQ‖_F²  = Σ_ij λ_i λ_j P̃_ij²  = ‖W̃ Λ W̃ᵀ‖_F²  (W̃ the k × d orthonormal rows of Q̃ᵀ)

If ``P`` is a Haar projection so is ``P̃`` (``V`` is fixed), and the law of a Haar projection
does not depend on the frame. So the *same* draws of ``diag(P̃)`` serve every unit of width
``d``, each read against its own eigenvalues: a unit's energy null is one product
``(n × d) · (d × units)``, and ``‖QᵀSQ‖_F²`` needs the draw's rows only where a test cannot be
decided without it (see :mod:`anistat.analyze.nulls`). Each unit's test stays exact on its own —
its draws are independent of its data; units that share draws have dependent tests.

**The stream.** Draws come in chunks of :data:`CHUNK`. Chunk ``i`` of a stream with seed ``s``
draws its Gaussians from a CPU ``torch.Generator`` seeded from ``numpy.random.SeedSequence([s, i])``, one
``(CHUNK, d)`` block per column in column order, so

* the draws depend on neither the device, nor the number of threads, nor which chunks were
  computed before (any chunk can be recomputed alone, e.g. in float64);
* rank ``k``'s draws are the span of the first ``k`` columns, whatever the largest rank ``K``
  of the stream: adding a rank to a protocol leaves the smaller ranks' nulls unchanged (up to
  float rounding, ~1e-7 in float32, which the float64 recomputation of near ties absorbs). Every
  rank comes from one Gaussian ``Z`` (its first ``k`` columns span a Haar ``k``-subspace).

**The arithmetic.** Cholesky–QR in the Gram form: ``Zᵀ Z = L Lᵀ``, rows ``W = L⁻¹ Zᵀ``
(``k × d``, orthonormal), and ``diag(P_k) = Σ_{i<k} W_i²`` (``L⁻¹`` is lower triangular, so the
first ``k`` rows of ``W`` are the rank-``k`` basis). Gaussian ``d × K`` blocks with ``K ≤ d/2``
are well conditioned (singular values in ``√d ± √K``), so float32 is accurate to ~1e-6
relative (larger ``K`` is computed in float64); the float32 chunk is the fast path and :meth:`HaarDiagonalStream.rows` recomputes
chosen draws of the *same* Gaussians in float64 when a p-value would depend on the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["CHUNK", "HaarChunk", "HaarDiagonalStream"]

#: Draws per chunk. Fixed: the random stream is defined chunk by chunk.
CHUNK = 128


@dataclass(frozen=True, kw_only=True)
class HaarChunk:
    """One chunk of draws: ``rows`` ``(c, K, d)`` orthonormal rows (rank ``k`` = the first ``k``
    rows) and ``diagonals[k]`` ``(c, d)`` = ``diag(P_k)`` of every draw, in the stream's dtype;
    ``gaussians`` the CPU float32 ``Zᵀ`` they come from (for :meth:`HaarDiagonalStream.rows`).

    Attributes
    ----------
    index : int
        The chunk's position in the stream (0, 1, …).
    rows : Tensor of shape (c, K, d)
        Orthonormal rows of each draw (rank ``k``: the first ``k``).
    diagonals : dict of int to Tensor of shape (c, d)
        ``diag(P_k)`` of every draw, per rank ``k``.
    gaussians : Tensor
        The CPU float32 ``Zᵀ`` the draws come from.
    """

    index: int
    rows: torch.Tensor
    diagonals: dict[int, torch.Tensor]
    gaussians: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])


class HaarDiagonalStream:
    """Haar ``k``-subspaces of ``R^dim`` for every rank in ``ranks``, chunk by chunk.

    ``dtype`` float32 (the fast path) or float64; ``device`` where the linear algebra runs (the
    Gaussians always come from the CPU generator, so every device sees the same draws).
    """

    def __init__(
        self, dim: int, ranks, seed: int, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> None:
        self.dim = int(dim)
        self.ranks = sorted({int(r) for r in ranks})
        if not self.ranks or self.ranks[0] < 1 or self.ranks[-1] >= self.dim:
            raise ValueError(f"ranks must satisfy 1 <= k < d = {self.dim}, got {self.ranks}")
        self.top = self.ranks[-1]
        self.seed = int(seed)
        # K ≤ d/2 keeps ZᵀZ well conditioned (condition number ≤ ((√d + √K)/(√d − √K))² ≈ 34)
        # for float32 Cholesky–QR; past that the stream computes in float64
        self.dtype = dtype if 2 * self.top <= self.dim else torch.float64
        self.device = torch.device(device)

    def gaussians(self, index: int, size: int = CHUNK) -> torch.Tensor:
        """The chunk's Gaussians ``(size, K, d)`` (float32, CPU): draw ``j``'s ``Zᵀ``."""
        generator = torch.Generator().manual_seed(_chunk_seed(self.seed, int(index)))
        out = torch.empty(self.top, size, self.dim)
        for column in range(self.top):  # column by column: rank k's draws ignore K
            torch.randn(size, self.dim, generator=generator, out=out[column])  # in place: no copy
        return out.transpose(0, 1)

    def chunk(self, index: int, size: int = CHUNK) -> HaarChunk:
        """Orthonormal rows and projection diagonals of chunk ``index`` (``size`` ≤ CHUNK draws,
        the first ``size`` of the full chunk)."""
        gaussians = self.gaussians(index)[:size]
        rows, diagonals = _orthonormal_rows(gaussians.to(device=self.device, dtype=self.dtype), self.ranks)
        return HaarChunk(index=int(index), rows=rows, diagonals=diagonals, gaussians=gaussians)

    def rows(self, chunk: HaarChunk | int, draws) -> torch.Tensor:
        """Float64 orthonormal rows ``(len(draws), K, d)`` of the given draws of a chunk (or of
        chunk number ``chunk``): the same Gaussians as :meth:`chunk`, orthonormalised in float64."""
        picked = torch.as_tensor(np.asarray(draws), dtype=torch.long)
        gaussians = chunk.gaussians if isinstance(chunk, HaarChunk) else self.gaussians(chunk)
        # rows only: no rank's diagonals are wanted here
        return _orthonormal_rows(gaussians[picked].to(device=self.device, dtype=torch.float64), ())[0]


#: Draws orthonormalised together. A chunk's ``Zᵀ`` and rows are ``CHUNK × K × d`` (50 MB each
#: at d = 768, K = 128 in float32); taking the draws a few at a time keeps each one's Gram,
#: product and squares in cache (≈ 10 % faster per draw on CPU) and gives bit-identical results.
#: On a GPU the whole chunk goes at once.
CPU_BATCH = 16


def _orthonormal_rows(z: torch.Tensor, ranks) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """``W = L⁻¹ Zᵀ`` for ``Zᵀ`` given as ``(c, K, d)``, with ``Zᵀ Z = L Lᵀ`` (Cholesky–QR), and
    ``diag(P_k) = Σ_{i<k} W_i²`` ``(c, d)`` for every rank in ``ranks`` (ascending; running sums over
    blocks of rows; none for an empty ``ranks``)."""
    count, top, _ = z.shape
    rows = torch.empty(z.shape, dtype=z.dtype, device=z.device)
    diagonals = {rank: z.new_empty(count, z.shape[2]) for rank in ranks}
    eye = torch.eye(top, dtype=z.dtype, device=z.device)
    step = count if z.device.type != "cpu" else CPU_BATCH
    for start in range(0, count, step):
        part = z[start : start + step].contiguous()
        gram = part @ part.transpose(1, 2)
        chol, info = torch.linalg.cholesky_ex(gram)
        if bool((info != 0).any()):  # probability 0 for Gaussian blocks with K ≤ d/2
            raise FloatingPointError("a Haar draw's Gram matrix is not positive definite")
        # the inverse of the small K × K factor, then one batched product (faster than a batched
        # triangular solve against the long d side)
        inverse = torch.linalg.solve_triangular(chol, eye.expand_as(gram), upper=False)
        block_rows = torch.matmul(inverse, part, out=rows[start : start + step])
        running, previous = None, 0
        for rank in ranks:
            block = block_rows[:, previous:rank].square().sum(dim=1)
            running = block if running is None else running + block
            diagonals[rank][start : start + step] = running
            previous = rank
    return rows, diagonals


def _chunk_seed(seed: int, index: int) -> int:
    """A 63-bit seed for chunk ``index`` of the stream ``seed`` (independent streams per chunk)."""
    state = np.random.SeedSequence([int(seed) % 2**64, int(index)]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & (2**63 - 1)
