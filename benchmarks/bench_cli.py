"""CLI start-up benchmark: wall time of the light commands, and which heavy modules they import.

Run:  PYTHONPATH=. python benchmarks/bench_cli.py [--repeats 7] [--json OUT]

Each command runs as a fresh process (`python -m anistat …`, what a user's shell does), and the
median wall time of `--repeats` runs is reported next to the bare interpreter start-up
(`python -c pass`) as a floor. Goal (issue #14): `--help`, `validate`, `schema` and `init`
under 0.5 s; none of them imports torch, transformers, matplotlib or pandas (checked in a
separate process through `sys.modules`). For comparison, `import torch` alone is timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "matplotlib", "pandas", "scipy")


def wall(command: list[str], repeats: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env, cwd=ROOT)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    """Heavy modules in sys.modules after running the CLI command in-process."""
    code = (
        "import sys; from anistat.cli import main; code = main(sys.argv[1:]); "
        f"print('HEAVY:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    marker = [line for line in result.stdout.splitlines() if line.startswith("HEAVY:")][-1]
    return [m for m in marker[len("HEAVY:") :].split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory() as scratch:
        starter = Path(scratch) / "starter.yaml"
        commands = {
            "python -c pass (floor)": [sys.executable, "-c", "pass"],
            "import torch (for scale)": [sys.executable, "-c", "import torch"],
            "anistat --help": [sys.executable, "-m", "anistat", "--help"],
            "anistat validate protocols/quickstart.yaml": [
                sys.executable,
                "-m",
                "anistat",
                "validate",
                "protocols/quickstart.yaml",
            ],
            "anistat schema": [sys.executable, "-m", "anistat", "schema"],
            "anistat init FILE --force": [sys.executable, "-m", "anistat", "init", str(starter), "--force"],
        }
        rows = {}
        for label, command in commands.items():
            seconds = wall(command, options.repeats, env)
            args = command[3:] if command[1:3] == ["-m", "anistat"] else None
            imported = heavy_imports(args, env) if args is not None else None
            rows[label] = {"median_s": round(seconds, 3), "heavy_imports": imported}
            shown = "" if imported is None else f"  heavy imports: {', '.join(imported) or 'none'}"
            print(f"{label:<45} {seconds:6.3f} s{shown}", flush=True)
    if options.json:
        options.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
