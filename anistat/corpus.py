"""Corpora: the documents a run reads, with a stable identity for the manifest.

`load_corpus` reads `data.source` as the run does — Python's own documentation topics
(`builtin`), text files (one document each, or split by `data.document_separator`), jsonl
records (`data.text_field`) or a Hugging Face dataset split — applies `data.max_documents`,
and returns a `Corpus`: the documents in their given order, the sha256 of their text, and what
was skipped while reading. It imports neither torch nor transformers, so `anistat validate` can
count a corpus without them (`anistat.preflight.corpus_warnings`); `anistat.data` tokenises and
splits what it returns.
"""

from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import AnistatInputError
from .protocol import DataSpec


@dataclass(frozen=True)
class Corpus:
    """Raw documents plus a stable identity (sha256 of the text) for the manifest."""

    name: str
    documents: tuple[str, ...]
    sha256: str
    #: what was skipped while reading (empty files, blank records): run-level warnings
    warnings: tuple[str, ...] = ()


def builtin_corpus() -> list[str]:
    """Python's own documentation topics (ships with CPython: `pydoc_data.topics`), sorted by key."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - stripped Python builds
        raise AnistatInputError(
            "data.source 'builtin' needs pydoc_data (part of the Python standard library), "
            "which this Python lacks; use source: text"
        ) from None
    return [topics[key] for key in sorted(topics)]


def _expand_paths(patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matched = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
            matched = [p for p in matched if p.is_file()]
            if not matched:
                raise AnistatInputError(f"data.paths: no file matches '{pattern}'")
            files.extend(matched)
        else:
            path = Path(pattern)
            if not path.exists():
                raise AnistatInputError(f"data.paths: file not found: {pattern}")
            if not path.is_file():
                raise AnistatInputError(f"data.paths: not a regular file: {pattern}")
            files.append(path)
    return files


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise AnistatInputError(f"data.paths: cannot read {path} ({error.strerror})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise AnistatInputError(
            f"data.paths: {path} is not UTF-8 text (invalid byte at offset {error.start})"
        ) from None


def load_corpus(spec: DataSpec) -> Corpus:
    """Load the documents named by the protocol's data section. An empty file among
    `data.paths`, blank JSONL lines and records with empty text are skipped and said in the
    corpus' `warnings` (the run's warnings: terminal, manifest, report)."""
    skipped: list[str] = []
    if spec.source == "builtin":
        documents = builtin_corpus()
        name = "builtin:pydoc_data.topics"
    elif spec.source == "hf_dataset":
        documents = hf_dataset_documents(spec)
        name = (
            f"hf_dataset:{spec.dataset}"
            + (f"/{spec.dataset_config}" if spec.dataset_config else "")
            + f"[{spec.dataset_split}]"
        )
    else:
        documents = []
        for path in _expand_paths(spec.paths):
            text = _read_text(path)
            if not text.strip():
                skipped.append(f"data.paths: {path} is empty and was skipped")
                continue
            if spec.source == "text":
                documents.extend(split_documents(text, spec.document_separator))
                continue
            blank_lines, blank_texts = 0, 0
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    blank_lines += 1
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise AnistatInputError(f"{path}:{number}: invalid JSON ({error.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get(spec.text_field), str):
                    raise AnistatInputError(f"{path}:{number}: record has no string field '{spec.text_field}'")
                if not record[spec.text_field].strip():
                    blank_texts += 1
                documents.append(record[spec.text_field])
            if blank_lines or blank_texts:
                parts = [
                    f"{n} {what}"
                    for n, what in (
                        (blank_lines, "blank line(s)"),
                        (blank_texts, f"record(s) with an empty '{spec.text_field}'"),
                    )
                    if n
                ]
                skipped.append(f"data.paths: {' and '.join(parts)} in {path} were skipped")
        name = f"{spec.source}:" + ",".join(spec.paths)
    documents = [doc for doc in documents if doc.strip()]
    if spec.max_documents is not None:
        documents = documents[: spec.max_documents]
    if not documents:
        raise AnistatInputError(f"data: the corpus ({name}) is empty")
    digest = _sha256_documents(documents)
    return Corpus(name=name, documents=tuple(documents), sha256=digest, warnings=tuple(skipped))


#: `data.document_separator`'s rule for paragraphs: one or more lines holding only whitespace
BLANK_LINE = "blank_line"


def split_documents(text: str, separator: str | None) -> list[str]:
    """A text file's documents (`data.document_separator`): the whole file when `separator` is
    None; paragraphs separated by one or more blank lines for ``blank_line``; else the pieces
    between occurrences of `separator`. Pieces holding only whitespace are dropped."""
    if separator is None:
        pieces = [text]
    elif separator == BLANK_LINE:
        pieces = re.split(r"\n[ \t\r\f\v]*\n(?:[ \t\r\f\v]*\n)*", text)
    else:
        pieces = text.split(separator)
    return [piece for piece in pieces if piece.strip()]


def hf_dataset_documents(spec: DataSpec) -> list[str]:
    """Texts of a Hugging Face dataset split (the optional `datasets` package).

    `spec.dataset` is a directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`
    (read with `load_from_disk`), or a dataset name given to `load_dataset`, which honours the
    offline cache (`HF_DATASETS_OFFLINE=1` / `HF_HUB_OFFLINE=1`: only cached data is read).
    Rows keep the dataset's order; the split into sequences is the usual seeded one."""
    try:
        import datasets
    except ImportError:
        raise AnistatInputError(
            "data.source 'hf_dataset' needs the optional package 'datasets' (pip install 'anistat[datasets]')"
        ) from None
    dataset = str(spec.dataset)  # the protocol requires it with source: hf_dataset
    where = f"data.dataset '{dataset}'"
    try:
        if Path(dataset).is_dir():
            loaded = datasets.load_from_disk(dataset)
            if isinstance(loaded, dict):  # a DatasetDict: pick the split
                if spec.dataset_split not in loaded:
                    raise AnistatInputError(
                        f"{where} has no split '{spec.dataset_split}' (splits: {', '.join(sorted(loaded.keys()))})"
                    )
                loaded = loaded[spec.dataset_split]
        else:
            loaded = datasets.load_dataset(dataset, spec.dataset_config, split=spec.dataset_split)
    except AnistatInputError:
        raise
    except Exception as error:  # datasets raises many types (FileNotFoundError, ConnectionError, ValueError…)
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise AnistatInputError(f"{where} cannot be loaded: {first_line}") from None
    columns = list(getattr(loaded, "column_names", []) or [])
    if spec.text_field not in columns:
        raise AnistatInputError(f"{where} has no column '{spec.text_field}' (columns: {', '.join(columns)})")
    texts = loaded[spec.text_field]
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise AnistatInputError(f"{where}: row {bad} of column '{spec.text_field}' is not a string")
    return list(texts)


def _sha256_documents(documents: list[str]) -> str:
    import hashlib

    hasher = hashlib.sha256()
    for doc in documents:
        encoded = doc.encode("utf-8")
        hasher.update(len(encoded).to_bytes(8, "little"))
        hasher.update(encoded)
    return hasher.hexdigest()
