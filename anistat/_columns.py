"""The columns of ``results.csv`` and ``frequency.csv``, defined once.

``anistat.analyze`` writes them, ``anistat.preflight`` plans rows with them (without importing the
analysis, which imports torch), ``anistat.reproduction`` matches rows of two bundles by their
keys and ``anistat.report`` normalises the table it renders with them. A layer-0 module of
constants, so every stage, the pure ones included, can import it.
"""

#: The columns that name the measured unit (a site of a layer of a checkpoint of a model); every
#: key of both tables starts with them.
UNIT_KEYS: tuple[str, ...] = (
    "model",
    "objective",
    "checkpoint",
    "step",
    "phase",
    "layer",
    "site",
)

#: The columns that identify a row of results.csv.
RESULT_KEYS: tuple[str, ...] = (
    *UNIT_KEYS,
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
    "m_eff",
    "n_tokens",
    "status",
    "note",
    "fallback",
)

#: The columns that identify a row of frequency.csv.
FREQUENCY_KEYS: tuple[str, ...] = (
    *UNIT_KEYS,
    "dim",
    "proxy",
    "rank",
    "control",
    "bucket",
    "metric",
)

#: Every column of frequency.csv, in order.
FREQUENCY_COLUMNS: tuple[str, ...] = (
    *UNIT_KEYS,
    "dim",
    "n_sequences",
    "n_tokens",
    "proxy",
    "rank",
    "control",
    "bucket",
    "metric",
    "estimate",
    "ci_low",
    "ci_high",
    "ci_method",
    "p_value",
    "note",
)
