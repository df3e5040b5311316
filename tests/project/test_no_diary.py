"""The repository's text describes the product as it is, not how it came to be: no tracked text
file narrates its development ("this stop", "the previous stop's code", "last session"). History
lives in CHANGELOG.md and git. Nor does it narrate the circumstances of a measurement beyond what
a reader needs to repeat it: not which other jobs shared the machine, nor how the code compared
with an earlier commit ("before this change", "the previous commit") — a benchmark states its
machine, threads, load and command."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".toml", ".txt", ".j2", ".cfg", ".ini")
#: Phrases of a lab diary. Each is matched case-insensitively on word boundaries; the list names
#: the ways a work log refers to itself, not ordinary words ("a test stops after 10 draws").
DIARY_PHRASES = (
    "this stop",
    "the previous stop",
    "previous stop",
    "last stop",
    "next stop",
    "the stop before",
    "the stop after",
    "stop's code",
    "earlier stop",
    "this session",
    "last session",
    "previous session",
    "earlier session",
    "next session",
    "this sitting",
    "before this change",
    "after this change",
    "previous commit",
    "earlier commit",
    "last commit",
    "the commit before",
    "another session",
    "other sessions",
    "shared with other jobs",
    "other jobs on",
)
PATTERN = re.compile(r"\b(" + "|".join(re.escape(p) for p in DIARY_PHRASES) + r")\b", re.IGNORECASE)
THIS_FILE = Path(__file__).resolve()


def tracked_text_files(root: Path = ROOT) -> list[Path]:
    """Tracked files with a text suffix (every such file under `root` outside a git checkout)."""
    proc = subprocess.run(["git", "ls-files", "-z"], check=False, cwd=root, capture_output=True)
    if proc.returncode == 0:
        names = [n for n in proc.stdout.decode("utf-8").split("\0") if n]
        return [root / n for n in names if n.endswith(TEXT_SUFFIXES) and (root / n).is_file()]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("site", "runs", "__pycache__")]
        found += [Path(folder) / f for f in files if f.endswith(TEXT_SUFFIXES)]
    return found


def diary_lines(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        if path.resolve() == THIS_FILE:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            match = PATTERN.search(line)
            if match:
                hits.append(
                    f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}: "
                    f"'{match.group(0)}' in: {line.strip()[:120]}"
                )
    return hits


def test_no_tracked_text_narrates_its_development():
    files = tracked_text_files()
    assert len(files) > 50
    hits = diary_lines(files)
    assert not hits, "diary phrases (describe the product as it is; history goes to CHANGELOG.md):\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "line,found",
    [
        ("the ratio rose to 2.47 this stop", True),
        ("The previous stop's code measured 2.32", True),
        ("measured in the last session", True),
        ("a test stops after 10 draws have reached its value", False),
        ("the code before this change run from an export of the previous commit", True),
        ("2-vCPU VM shared with other jobs (load 2-7)", True),
        ("load 2-5 from other sessions", True),
        ("a change to the protocol changes its hash", False),
        ("sequential stopping ends most tests early", False),
    ],
)
def test_the_check_finds_diary_phrases_and_spares_ordinary_words(tmp_path, line, found):
    path = tmp_path / "note.md"
    path.write_text(f"# note\n\n{line}\n", encoding="utf-8")
    assert bool(diary_lines([path])) is found
