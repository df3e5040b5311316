"""The analysis under `torchrun` (`anistat.analyze.parallel.RankShare`): two CPU processes (gloo),
each analysing its share of the units of a small real run, give rank 0 the single process's
results.csv and frequency.csv bit for bit."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import MINI_PROTOCOL

from anistat.analyze import analyze_run
from anistat.collect import UnitArtifact
from anistat.pipeline import collect_units
from anistat.protocol import parse_protocol

TORCHRUN = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")

#: Run by each rank: the saved units analysed under a gloo process group; rank 0 writes the tables.
RANK_SCRIPT = """
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist
import yaml

from anistat.analyze import analyze_run
from anistat.collect import UnitArtifact
from anistat.protocol import parse_protocol

folder = Path(sys.argv[1])
dist.init_process_group("gloo")
protocol = parse_protocol(yaml.safe_load((folder / "protocol.yaml").read_text()))
artifacts = [UnitArtifact.load(folder / "units" / f"{name}.json") for name in (folder / "order.txt").read_text().split()]
counts = {path.stem: np.load(path) for path in (folder / "counts").glob("*.npy")}
analysis = analyze_run(artifacts, counts, protocol, workers=int(sys.argv[2]))
results, frequency = analysis.results, analysis.frequency
if dist.get_rank() == 0:
    results.to_csv(folder / "results.csv", index=False, lineterminator="\\n")
    frequency.to_csv(folder / "frequency.csv", index=False, lineterminator="\\n")
else:
    assert results.empty and frequency.empty
dist.barrier()
dist.destroy_process_group()
"""


def _csv(frame: pd.DataFrame) -> str:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    return buffer.getvalue()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun not installed")
def test_two_ranks_give_the_single_process_tables_bit_for_bit(tmp_path: Path):
    protocol = parse_protocol(yaml.safe_load(MINI_PROTOCOL))
    collected, info = collect_units(protocol, torch.device("cpu"), tmp_path / "cache", lambda message: None)
    for artifact in collected:
        artifact.save(tmp_path / "units")
    artifacts = [
        UnitArtifact.load(tmp_path / "units" / f"{a.key.id}.json") for a in collected
    ]  # as the ranks read them
    (tmp_path / "order.txt").write_text("\n".join(a.key.id for a in artifacts))
    (tmp_path / "protocol.yaml").write_text(MINI_PROTOCOL)
    (tmp_path / "counts").mkdir()
    for model, counts in info["frequency"].items():
        np.save(tmp_path / "counts" / f"{model}.npy", counts)
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    analysis = analyze_run(artifacts, info["frequency"], protocol)
    single = analysis.results, analysis.frequency

    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    command = [TORCHRUN, "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0"]
    done = subprocess.run(
        [*command, str(tmp_path / "rank.py"), str(tmp_path), "1"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "results.csv").read_text() == _csv(single[0])
    assert (tmp_path / "frequency.csv").read_text() == _csv(single[1])
