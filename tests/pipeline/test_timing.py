"""Stage timings (`anistat.timing`): exclusive nesting, wall and CPU clocks, and a command-line
run whose manifest stages add up to the process's own wall time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MINI_PROTOCOL

from anistat import timing
from anistat.timing import OTHER, START_UP, StageTimer, summary


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_nested_stages_are_exclusive_and_add_up_to_the_elapsed_time():
    timer = StageTimer()
    with timer.stage("outer"):
        time.sleep(0.05)
        with timer.stage("inner"):
            time.sleep(0.2)
        time.sleep(0.05)
    time.sleep(0.05)
    stages = timer.stages()
    assert list(stages) == ["outer", "inner", OTHER]
    assert 0.2 <= stages["inner"].wall < 0.35
    assert 0.1 <= stages["outer"].wall < 0.25  # the inner 0.2 s is not charged to the outer stage too
    assert stages[OTHER].wall >= 0.05
    assert sum(t.wall for t in stages.values()) == pytest.approx(timer.elapsed(), abs=1e-3)
    assert START_UP not in stages  # only a command-line run counts the process's start-up


def test_cpu_seconds_are_charged_to_the_stage_that_spent_them():
    timer = StageTimer()
    with timer.stage("sleeping"):
        time.sleep(0.2)
    with timer.stage("spinning"):
        _spin(0.2)
    stages = timer.stages()
    assert stages["sleeping"].cpu < 0.1
    assert stages["spinning"].cpu >= 0.19


def test_a_stage_entered_twice_is_summed_and_counted():
    timer = StageTimer()
    for _ in range(3):
        with timer.stage("pass"):
            time.sleep(0.01)
    assert timer.stages()["pass"].count == 3
    assert timer.as_json()["pass"]["wall_s"] >= 0.03


def test_the_module_stage_charges_the_active_timer_and_is_a_no_op_without_one():
    with timing.stage("nowhere"):  # no active timer: nothing happens, nothing fails
        pass
    timer = StageTimer()
    with timer.activate():
        assert timing.active_timer() is timer
        with timing.stage("here"):
            time.sleep(0.01)
    assert timing.active_timer() is None
    assert "here" in timer.stages()


def test_the_summary_names_the_largest_stage():
    stages = {"fit pass": {"wall_s": 3.0}, "figures": {"wall_s": 6.0}, "other": {"wall_s": 1.0}}
    assert summary(stages) == "largest stage: figures 6.0s of 10.0s (60%)"
    assert summary({}) == ""


@pytest.mark.slow
def test_a_run_records_every_stage_and_they_sum_to_the_process_wall_time(tmp_path: Path):
    protocol = tmp_path / "mini.yaml"
    protocol.write_text(MINI_PROTOCOL)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "anistat", "run", str(protocol), "--out", str(tmp_path / "bundle")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    stages = manifest["stages"]
    for name in (START_UP, "models", "fit pass", "test pass", "exact tests"):
        assert name in stages, name
    for name in ("intervals and bootstraps", "frequency rows", "cache writes", "figures", "HTML and LaTeX", OTHER):
        assert name in stages, name
    total = sum(times["wall_s"] for times in stages.values())
    assert manifest["seconds"] == pytest.approx(total, abs=0.02)
    assert total == pytest.approx(wall, rel=0.05), (total, wall, stages)
    assert all(times["cpu_s"] >= 0 for times in stages.values())
    largest = max(stages, key=lambda name: stages[name]["wall_s"])
    last_line = done.stdout.strip().splitlines()[-1]
    assert last_line.startswith(f"largest stage: {largest} "), last_line


def test_cpu_of_another_process_is_charged_to_the_open_stage_only():
    timer = StageTimer()
    with timer.activate(), timing.stage("workers"):
        timing.add_cpu(5.0)
    stages = timer.stages()
    assert stages["workers"].cpu >= 5.0
    assert stages[OTHER].cpu < 1.0
