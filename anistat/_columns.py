"""The columns of ``results.csv``, defined once.

``anistat.analyze`` writes them, ``anistat.preflight`` plans rows with them (without importing the
analysis, which imports torch), and ``anistat.reproduction`` matches rows of two bundles by their
keys. A layer-0 module, so every stage can import it.
"""

#: The columns that identify a row of results.csv (and, with ``bucket``, of frequency.csv).
RESULT_KEYS: tuple[str, ...] = (
    "model",
    "objective",
    "checkpoint",
    "step",
    "phase",
    "layer",
    "site",
    "rank",
    "dim",
    "proxy",
    "control",
    "metric",
)

#: Every column of results.csv, in order: the keys, then the numbers and their provenance.
RESULT_COLUMNS: tuple[str, ...] = (
    *RESULT_KEYS,
    "estimate",
    "control_mean",
    "control_sd",
    "ci_low",
    "ci_high",
    "ci_method",
    "p_value",
    "p_adjusted",
    "p_test",
    "p_value_paper",
    "effect_size",
    "effect_size_kind",
    "se",
    "n_controls",
    "n_sequences",
    "n_clusters",
    "n_eff",
    "n_tokens",
    "status",
    "note",
    "fallback",
)
