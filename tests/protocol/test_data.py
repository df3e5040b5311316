"""Data: deterministic tokenizer, disjoint splits, clear errors for unusable corpora."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anistat.corpus import load_corpus
from anistat.data import BuiltinTokenizer, make_splits, mask_for_mlm
from anistat.errors import AnistatInputError
from anistat.protocol import DataSpec


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(DataSpec())


def test_builtin_corpus_needs_no_download(corpus):
    assert len(corpus.documents) > 50
    assert sum(map(len, corpus.documents)) > 100_000


def test_tokenizer_and_splits_are_deterministic_and_disjoint(corpus):
    spec = DataSpec(seq_len=32, n_fit_sequences=20, n_test_sequences=20, vocab_size=300)
    first = make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=3)
    second = make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=3)
    assert torch.equal(first.test, second.test) and torch.equal(first.fit, second.fit)
    other = make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=4)
    assert not torch.equal(first.test, other.test)
    test_rows = {tuple(r) for r in first.test.tolist()}
    assert not test_rows & {tuple(r) for r in first.fit.tolist()}
    assert not test_rows & {tuple(r) for r in first.train.tolist()}
    assert first.token_counts.sum() >= first.train.numel() + first.test.numel()
    assert first.decode(first.test[0, :5].tolist())


def test_text_and_jsonl_sources(tmp_path):
    (tmp_path / "a.txt").write_text("hello world. " * 500)
    corpus = load_corpus(DataSpec(source="text", paths=[str(tmp_path / "*.txt")]))
    assert corpus.documents[0].startswith("hello")
    (tmp_path / "b.jsonl").write_text('{"body": "some text"}\n\n{"body": "more"}\n')
    corpus = load_corpus(DataSpec(source="jsonl", paths=[str(tmp_path / "b.jsonl")], text_field="body"))
    assert corpus.documents == ("some text", "more")


@pytest.mark.parametrize(
    "content, message",
    [(b"\xff\xfe\x00bad", "not UTF-8"), (b"   \n", "is empty")],
)
def test_bad_text_files(tmp_path, content, message):
    path = tmp_path / "x.txt"
    path.write_bytes(content)
    with pytest.raises(AnistatInputError, match=message):
        load_corpus(DataSpec(source="text", paths=[str(path)]))


def test_corpus_shorter_than_a_sequence(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("tiny text")
    spec = DataSpec(source="text", paths=[str(path)], seq_len=64, vocab_size=64)
    corpus = load_corpus(spec)
    with pytest.raises(AnistatInputError, match="fewer than one sequence"):
        make_splits(corpus, BuiltinTokenizer(corpus.documents, 300), spec, seed=0)


def test_mlm_masking_is_reproducible_and_always_masks():
    tokens = torch.arange(200).view(10, 20) % 50 + 3
    a = mask_for_mlm(tokens, 1, 60, 0.15, torch.Generator().manual_seed(1))
    b = mask_for_mlm(tokens, 1, 60, 0.15, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    predicted = a[1] != -100
    assert predicted.any(dim=1).all()
    assert np.isclose(predicted.float().mean().item(), 0.15, atol=0.08)
