"""Devices, precision and progress: the CPU path stays exact and quiet; GPU choices are explicit."""

from __future__ import annotations

import contextlib

import pytest
import torch

from anistat.collect import autocast, progress, resolve_precision
from anistat.errors import AnistatInputError
from anistat.pipeline import resolve_device


def test_cpu_precision_is_always_fp32_and_autocast_is_a_no_op():
    cpu = torch.device("cpu")
    for requested in ("auto", "fp32", "bf16", "fp16"):
        assert resolve_precision(cpu, requested) == "fp32"
    assert isinstance(autocast(cpu, "bf16"), contextlib.nullcontext)


def test_device_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(AnistatInputError, match="no CUDA device"):
            resolve_device("cuda")
        assert resolve_device("auto").type in ("cpu", "mps")
    with pytest.raises(AnistatInputError, match="auto, cpu, cuda or mps"):
        resolve_device("tpu")


def test_progress_bars_are_quiet_without_a_tty(monkeypatch, capsys):
    monkeypatch.delenv("ANISTAT_PROGRESS", raising=False)
    bar = progress.bar(3, "batches")  # pytest captures stderr: not a TTY
    bar.update(1)
    bar.set_postfix_str("1 tok/s")
    bar.close()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ANISTAT_PROGRESS", "1")
    assert progress.enabled()
    monkeypatch.setenv("ANISTAT_PROGRESS", "0")
    assert not progress.enabled()
