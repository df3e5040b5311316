"""A local / hub series holds at most one checkpoint's weights at a time: every load happens
after the previous checkpoint's model has been released (checked with weak references to the
real transformers models the loader returns, through a full `anistat run`)."""

from __future__ import annotations

import gc
import weakref

from test_bad_input_helpers import build_tiny_gpt2, corpus_text, no_figures

import anistat.models
from anistat.pipeline import run


def test_a_local_series_loads_each_checkpoint_after_the_previous_is_released(tmp_path, monkeypatch):
    no_figures(monkeypatch)
    directories = [build_tiny_gpt2(tmp_path / f"step{k}") for k in range(3)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text())
    protocol = tmp_path / "protocol.yaml"
    protocol.write_text(
        "name: residency\n"
        f"data: {{source: text, paths: ['{corpus}'], seq_len: 16, n_fit_sequences: 8, n_test_sequences: 8, "
        "batch_size: 4}\n"
        f"models: [{{name: m, source: local, checkpoints: {[str(d) for d in directories]}}}]\n"
        # two of the three checkpoints in the fit window: phase 1 itself walks a series
        "proxies: {ranks: [2], max_fit_tokens: 200, concept_card_tokens: 0, fit_window: 0.67}\n"
        "controls: {kinds: [haar], n: 5}\n"
        "stats: {n_bootstrap: 20, n_permutations: 20, n_null_draws: 99}\n"
        "report: {compile_pdf: false}\n"
    )
    real_load = anistat.models._load_pretrained
    loaded: list[weakref.ref] = []
    resident_at_load: list[int] = []

    def load_and_count(*args, **kwargs):
        gc.collect()
        resident_at_load.append(sum(ref() is not None for ref in loaded))
        model, objective = real_load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model, objective

    monkeypatch.setattr(anistat.models, "_load_pretrained", load_and_count)
    result = run(protocol, tmp_path / "bundle")
    assert len(result.manifest["models"]["m"]["checkpoints"]) == 3
    # the series' first load, then checkpoints 1 and 2 (phase 1 reloads nothing it holds)
    assert len(resident_at_load) >= 3
    assert resident_at_load == [0] * len(resident_at_load)
