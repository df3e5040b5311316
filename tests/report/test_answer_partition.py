"""The answer's clauses partition the (checkpoint, layer) cells: no cell is counted under two
verdicts, read back from the rendered sentence itself (issue #38)."""

from __future__ import annotations

import re

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from anistat.report.answer import answer_parts, classify, enrichment_answer

VERDICT_OF = {"more than random subspaces": "more", "less": "less", "not significantly more": "neither"}
#: One verdict part of the sentence: "<verdict>[ by the exact test] at <checkpoints> ([<sites>: ]k of n …".
PART = re.compile(
    r"(?P<verdict>more than random subspaces|less|not significantly more)(?: by the [a-z ]+?)? at "
    r"(?P<at>step\d+(?:, step\d+)*) \((?:95 % CIs below 1 at )?(?:(?P<sites>[^:()]+): )?(?P<k>\d+) of (?P<n>\d+)"
)


def table(cells: dict[str, list[str]], phases: dict[str, str] | None = None) -> pd.DataFrame:
    """Energy-ratio rows of one model: ``cells[checkpoint]`` the verdict per layer."""
    rows = []
    for checkpoint, kinds in cells.items():
        step = int(checkpoint.removeprefix("step"))
        for layer, kind in enumerate(kinds):
            rows.append(
                {
                    "model": "m",
                    "metric": "energy_ratio",
                    "proxy": "pca",
                    "control": "normal",
                    "status": "ok",
                    "estimate": {"more": 1.5, "less": 0.7, "neither": 1.05}[kind],
                    "rank": 4,
                    "phase": (phases or {}).get(checkpoint, "early" if step < 50 else "late"),
                    "checkpoint": checkpoint,
                    "step": step,
                    "site": f"residual.{layer}",
                    "layer": layer,
                    "ci_low": {"more": 1.2, "less": 0.6, "neither": 0.9}[kind],
                    "ci_high": {"more": 1.9, "less": 0.8, "neither": 1.2}[kind],
                    "p_adjusted": 0.01 if kind == "more" else 0.4,
                    "p_test": "haar_monte_carlo",
                }
            )
    return pd.DataFrame(rows)


def counted_cells(answer: str, rows: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(checkpoint, layer, verdict) of every cell the sentence counts, read from its parts."""
    out = []
    for match in PART.finditer(answer):
        checkpoints = match.group("at").split(", ")
        verdict = VERDICT_OF[match.group("verdict")]
        at = rows[rows["checkpoint"].isin(checkpoints)]
        if match.group("sites"):
            layers = [int(s.removeprefix("layer ")) for s in match.group("sites").split(", ")]
            at = at[at["layer"].isin(layers)]
        assert int(match.group("n")) == int(rows["checkpoint"].isin(checkpoints).sum()), match.group(0)
        assert int(match.group("k")) == len(at), match.group(0)
        out += [(str(c), str(layer), verdict) for c, layer in zip(at["checkpoint"], at["layer"], strict=True)]
    return out


def test_the_self_contradicting_answer_is_partitioned():
    """The reproduction: at step60 one layer is significant and one is not; the old answer said
    "more … at step60, step200 (3 of 4 comparisons …), not significantly more at step60 (1 of 2
    layers)", counting step60's non-significant layer under both verdicts."""
    rows = table({"step0": ["neither", "neither"], "step60": ["more", "neither"], "step200": ["more", "more"]})
    answer = enrichment_answer(rows, proxy="pca", control="normal", alpha=0.05)
    assert "step60, step200 (3 of 4" not in answer
    assert "at step60 (layer 0: 1 of 2 layers" in answer and "at step60 (layer 1: 1 of 2 layers)" in answer
    assert "at step200 (2 of 2 layers" in answer
    cells = counted_cells(answer, rows)
    assert sorted(cells) == sorted(
        [("step0", "0", "neither"), ("step0", "1", "neither"), ("step60", "0", "more")]
        + [("step60", "1", "neither"), ("step200", "0", "more"), ("step200", "1", "more")]
    )


KINDS = st.sampled_from(["more", "less", "neither"])


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda layers: st.dictionaries(
            st.sampled_from(["step0", "step10", "step60", "step100", "step200"]),
            st.lists(KINDS, min_size=layers, max_size=layers),
            min_size=1,
            max_size=5,
        )
    )
)
def test_no_cell_is_counted_under_two_verdicts(cells):
    rows = table(cells)
    kinds = classify(rows, "p_adjusted", 0.05)
    answer = enrichment_answer(rows, proxy="pca", control="normal", alpha=0.05)
    if answer.startswith("Yes"):  # every cell "more": one verdict, no parts
        assert (kinds == "more").all()
        return
    counted = counted_cells(answer, rows)
    expected = [(str(r.checkpoint), str(r.layer), kinds[i]) for i, r in rows.iterrows()]
    # every cell exactly once, under its own verdict
    assert sorted(counted) == sorted(expected), answer
    # the structure behind the words partitions the cells of each phase too
    for phase in rows["phase"].unique():
        at = rows["phase"] == phase
        labels = list(dict.fromkeys(rows.loc[at].sort_values("step")["checkpoint"]))
        parts = answer_parts(rows[at], kinds[at], labels)
        all_cells = [cell for part in parts for cell in part.cells]
        assert len(all_cells) == len(set(all_cells)) == int(at.sum())
