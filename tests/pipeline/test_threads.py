"""Threads as a setting (issue #22): how the count is chosen, that it is applied and restored,
that the manifest records it with the machine, and that the built-in training does not depend
on it (bit for bit)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from conftest import MINI_PROTOCOL
from test_bad_input_helpers import no_figures

from anistat import runtime
from anistat.cli import main
from anistat.protocol import parse_protocol
from anistat.runtime import CpuBudget, cpu_threads, resolve_threads


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------------------------
# choosing the count
# ----------------------------------------------------------------------------------------------
def test_precedence_cli_then_protocol_then_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert resolve_threads(5, 2) == runtime.ThreadChoice(5, "--threads")
    assert resolve_threads(None, 2) == runtime.ThreadChoice(2, "protocol")
    assert resolve_threads(None, "auto") == runtime.ThreadChoice(3, "OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # nested levels: the first is the intra-op count
    assert resolve_threads(None, "auto").threads == 4


@pytest.mark.parametrize("value", ["", "0", "abc", "-2"])
def test_an_unusable_omp_num_threads_falls_back_to_auto(monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert resolve_threads(None, "auto").source == "auto"


@pytest.mark.parametrize(
    "budget, expected",
    [
        (CpuBudget(affinity=2, quota=None, usable=2, load=0.1), 2),  # an idle 2-core machine
        (CpuBudget(affinity=2, quota=None, usable=2, load=2.6), 1),  # 2 cores kept busy by others (the case)
        (CpuBudget(affinity=64, quota=2.0, usable=2, load=0.0), 2),  # a container's quota of 2 on a 64-core host
        (CpuBudget(affinity=8, quota=None, usable=8, load=3.2), 5),  # 8 cores, 3 busy
        (CpuBudget(affinity=4, quota=None, usable=4, load=None), 4),  # no load average (e.g. Windows)
    ],
)
def test_auto_uses_the_idle_usable_cpus(monkeypatch, budget, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "cpu_budget", lambda sample=False: budget)
    choice = resolve_threads(None, "auto")
    assert choice.threads == expected and choice.source == "auto"
    assert f"affinity {budget.affinity}" in choice.detail


def test_cgroup_quotas_are_read(tmp_path):
    """cgroup v2 (`cpu.max`, the tightest on the path wins) and v1 (`cfs_quota_us/cfs_period_us`)."""
    root = tmp_path / "cgroup"
    leaf = root / "job" / "step"
    leaf.mkdir(parents=True)
    (root / "job" / "cpu.max").write_text("150000 100000\n")
    (leaf / "cpu.max").write_text("max 100000\n")
    membership = tmp_path / "membership"
    membership.write_text("0::/job/step\n")
    assert runtime._cgroup_v2_quota(root, membership) == pytest.approx(1.5)
    (leaf / "cpu.max").write_text("max 100000\n")
    (root / "job" / "cpu.max").write_text("max 100000\n")
    assert runtime._cgroup_v2_quota(root, membership) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert runtime._cgroup_v1_quota(tmp_path / "v1") == pytest.approx(3.0)
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert runtime._cgroup_v1_quota(tmp_path / "v1") is None


def test_the_budget_is_the_affinity_mask_capped_by_the_cgroup_quota(monkeypatch):
    """cpu_budget on this machine: the affinity mask as the OS reports it, rounded-up quotas cap
    it, and no quota leaves it alone (each checked against a value computed here)."""
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(runtime, "_cgroup_v2_quota", lambda *a: None)
    monkeypatch.setattr(runtime, "_cgroup_v1_quota", lambda *a: None)
    budget = runtime.cpu_budget()
    assert (budget.affinity, budget.quota, budget.usable) == (affinity, None, affinity)
    monkeypatch.setattr(runtime, "_cgroup_v2_quota", lambda *a: 0.5)
    assert runtime.cpu_budget().usable == 1  # half a CPU still runs one thread
    monkeypatch.setattr(runtime, "_cgroup_v2_quota", lambda *a: None)
    monkeypatch.setattr(runtime, "_cgroup_v1_quota", lambda *a: affinity + 7.0)
    assert runtime.cpu_budget().usable == affinity  # a quota above the mask does not add CPUs
    if affinity >= 2:
        monkeypatch.setattr(runtime, "_cgroup_v1_quota", lambda *a: 1.2)
        assert runtime.cpu_budget().usable == 2  # 1.2 CPUs of time: two threads can use it


def test_cpu_threads_sets_and_restores_torch_and_blas():
    from threadpoolctl import threadpool_info

    def blas_threads():
        return {info["filepath"]: info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}

    before_torch, before_blas = torch.get_num_threads(), blas_threads()
    target = 2 if before_torch != 2 else 1
    with cpu_threads(target):
        assert torch.get_num_threads() == target
        assert set(blas_threads().values()) <= {target}
    assert torch.get_num_threads() == before_torch and blas_threads() == before_blas


# ----------------------------------------------------------------------------------------------
# the protocol field and the CLI option
# ----------------------------------------------------------------------------------------------
def test_threads_are_not_part_of_the_protocols_identity():
    base = yaml.safe_load(MINI_PROTOCOL)
    default = parse_protocol(base)
    pinned = parse_protocol({**base, "threads": 3})
    assert default.threads == "auto" and pinned.threads == 3
    assert pinned.sha256() == default.sha256()
    assert pinned.normalised()["threads"] == 3  # the manifest's protocol still says what was asked


@pytest.mark.parametrize("value", [0, -1, 2000, "many", 1.5, True])
def test_a_bad_threads_field_is_one_line(capsys, tmp_path, value):
    protocol = yaml.safe_load(MINI_PROTOCOL)
    protocol["threads"] = value
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(protocol))
    code, _, err = run_cli(capsys, "validate", path)
    assert code == 2 and len(err.splitlines()) == 1 and "threads" in err, err


@pytest.mark.parametrize("value", ["0", "1025", "two"])
def test_a_bad_threads_option_is_one_line(capsys, mini_protocol_path, tmp_path, value):
    code, _, err = run_cli(capsys, "run", mini_protocol_path, "--out", tmp_path / "b", "--threads", value)
    assert code == 2 and len(err.splitlines()) == 1 and "--threads" in err, err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_the_manifest_records_threads_and_machine(capsys, tmp_path, monkeypatch):
    """A real run with --threads 2: the log says it, the manifest's `machine` records the setting,
    its source, the CPU, the instruction set torch dispatches to, the BLAS of torch and numpy and
    the thread pools; torch's own setting is back as it was afterwards."""
    no_figures(monkeypatch)
    protocol = yaml.safe_load(MINI_PROTOCOL)
    protocol["models"] = protocol["models"][:1]
    protocol["threads"] = 1  # the command line wins over the protocol
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(protocol))
    before = torch.get_num_threads()
    code, out, err = run_cli(capsys, "run", path, "--out", tmp_path / "b", "--threads", "2")
    assert code == 0, err
    assert "2 threads (--threads)" in out.splitlines()[0]
    assert torch.get_num_threads() == before
    machine = json.loads((tmp_path / "b" / "manifest.json").read_text())["machine"]
    assert machine["threads"]["setting"] == 2 and machine["threads"]["source"] == "--threads"
    assert machine["threads"]["training"] == 1
    assert machine["cpu"] and machine["cpus"]["usable"] >= 1
    build = machine["torch_build"]
    assert build["version"] == torch.__version__ and build["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert build["blas"] and build["parallel_backend"]
    assert machine["numpy"]["blas"]
    assert any(pool["user_api"] == "blas" for pool in machine["thread_pools"])


# ----------------------------------------------------------------------------------------------
# the built-in training does not depend on the setting
# ----------------------------------------------------------------------------------------------
def _trained_states(threads: int) -> dict[int, dict[str, torch.Tensor]]:
    """The quickstart decoder's architecture, trained a few steps with `threads` torch threads set
    around the training (as `anistat run --threads` does)."""
    from anistat.corpus import load_corpus
    from anistat.data import BuiltinTokenizer, make_splits
    from anistat.models import _train_builtin, build_builtin_model
    from anistat.protocol import DataSpec, ModelSpec

    data = DataSpec(seq_len=64, n_fit_sequences=16, n_test_sequences=16, vocab_size=512)
    spec = ModelSpec(
        name="tiny-decoder",
        architecture="gpt2",
        hidden_size=64,
        num_layers=4,
        num_heads=4,
        train={"steps": 12, "batch_size": 16, "learning_rate": 0.002, "warmup_steps": 4, "checkpoints": [0, 12]},
    )
    corpus = load_corpus(data)
    splits = make_splits(corpus, BuiltinTokenizer(corpus.documents, data.vocab_size), data, 0)
    model = build_builtin_model(spec, splits.vocab_size, data.seq_len, 0, dtype=torch.float64)
    with cpu_threads(threads):
        return _train_builtin(model, spec, splits, data, "clm", 0, lambda message: None)


@pytest.mark.slow
def test_builtin_training_is_bit_identical_across_thread_settings():
    """Built-in models train on one thread whatever the run's setting: with 2 threads set (which
    changes how torch splits a float64 GEMM or reduction, and so its rounding) the trained
    checkpoints are the same bits as with 1."""
    one, two = _trained_states(1), _trained_states(2)
    assert one.keys() == two.keys() == {0, 12}
    for step in one:
        for name, tensor in one[step].items():
            assert tensor.dtype == (torch.float32 if tensor.is_floating_point() else tensor.dtype)
            assert torch.equal(tensor, two[step][name]), (step, name)


def test_builtin_init_is_drawn_in_float64():
    """The initial weights come from torch's float64 normal sampler (the same bits under
    ATEN_CPU_CAPABILITY=default, avx2 and avx512; the float32 sampler has an AVX2-specific path)
    and are cast afterwards: the float32 model is the float64 one rounded."""
    from anistat.models import build_builtin_model
    from anistat.protocol import ModelSpec

    spec = ModelSpec(name="d", architecture="gpt2", hidden_size=16, num_layers=1, num_heads=2)
    wide = build_builtin_model(spec, 64, 16, 0, dtype=torch.float64)
    narrow = build_builtin_model(spec, 64, 16, 0)
    assert wide.transformer.wte.weight.dtype == torch.float64 and narrow.transformer.wte.weight.dtype == torch.float32
    assert torch.equal(wide.transformer.wte.weight.float(), narrow.transformer.wte.weight)
    assert torch.get_default_dtype() == torch.float32  # the builder restores the default dtype


# ----------------------------------------------------------------------------------------------
# the CPUs busy now, not over the last minute (issue #28)
# ----------------------------------------------------------------------------------------------
def proc_stat(ticks: dict[int, tuple[int, int]]) -> str:
    """A /proc/stat text whose cpuN lines hold (busy user ticks, idle ticks)."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0" for n, (busy, idle) in sorted(ticks.items())]
    return "\n".join(lines + ["intr 0", "ctxt 0"]) + "\n"


@pytest.mark.parametrize(
    "after, own_seconds, busy_now",
    [
        ({0: (25, 0), 1: (0, 25)}, 0.0, 1.0),  # one core busy all the sample
        ({0: (0, 25), 1: (0, 25)}, 0.0, 0.0),  # idle
        ({0: (25, 0), 1: (25, 0)}, 0.25, 1.0),  # both busy, one of them with this process itself
        ({0: (12, 13), 1: (13, 12)}, 0.0, 1.0),  # half of each
    ],
)
def test_busy_cpus_from_two_proc_stat_samples(after, own_seconds, busy_now):
    before = proc_stat({0: (0, 0), 1: (0, 0)})
    busy = runtime.busy_from_samples(before, proc_stat(after), {0, 1}, own_seconds, 0.25)
    assert busy == pytest.approx(busy_now)
    # only the CPUs of the affinity mask count
    assert runtime.busy_from_samples(before, proc_stat(after), {1}, 0.0, 0.25) == pytest.approx(after[1][0] / 25)


def mocked_sample(monkeypatch, after: dict[int, tuple[int, int]], load: float) -> None:
    """/proc/stat read twice (idle → `after`), sched_getaffinity = 2 CPUs, load average `load`."""
    texts = iter([proc_stat({0: (0, 0), 1: (0, 0)}), proc_stat(after)])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(
        runtime.Path,
        "read_text",
        lambda self, *a, **k: next(texts) if str(self) == "/proc/stat" else original(self, *a, **k),
    )
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (load, load, load), raising=False)
    monkeypatch.setattr(runtime, "_cgroup_v2_quota", lambda *a: None)
    monkeypatch.setattr(runtime, "_cgroup_v1_quota", lambda *a: None)
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    monkeypatch.setattr("time.process_time", lambda: 0.0)


original = Path.read_text


def test_idle_now_after_a_busy_minute_uses_both_cores(monkeypatch):
    """The issue's case: a CPU-bound job has just finished (1-minute load average 1.6) on an idle
    2-core machine. The old rule (2 − 1.6 rounds to 0 → 1 thread) read the past; now: 2."""
    mocked_sample(monkeypatch, {0: (0, 25), 1: (0, 25)}, load=1.6)
    choice = resolve_threads(None, "auto")
    assert choice.threads == 2, choice
    assert "0.00 busy now" in choice.detail and "load average 1.60" in choice.detail


def test_one_core_busy_now_leaves_one_thread(monkeypatch):
    mocked_sample(monkeypatch, {0: (25, 0), 1: (0, 25)}, load=0.1)
    choice = resolve_threads(None, "auto")
    assert choice.threads == 1, choice
    assert "1.00 busy now" in choice.detail


def test_without_proc_stat_the_load_average_stands_in(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runtime, "busy_cpus_now", lambda seconds=0.25: None)
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.6, 1.6, 1.6), raising=False)
    monkeypatch.setattr(runtime, "_cgroup_v2_quota", lambda *a: None)
    monkeypatch.setattr(runtime, "_cgroup_v1_quota", lambda *a: None)
    assert resolve_threads(None, "auto").threads == 1
