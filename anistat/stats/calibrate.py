"""Calibration simulation: does the engine hold its level and cover its CIs?

Synthetic data (actual per-token gradients, generated with numpy). Per simulation:

* a proxy ``U`` (``d x k``) uniform on the Grassmannian, and ``n`` controls: ``"haar"``
  (uniform k-subspaces; U is then exchangeable with the controls under H0, so the
  Monte-Carlo test is exact) or ``"normal"`` (the paper's control, uniform in ``U``'s
  orthogonal complement);
* ``S`` sequences with ``T_s ~ U{t_min..t_max}`` tokens and a scale
  ``c_s ~ LogNormal(0, scale_sd)``. Tokens of a sequence share a random rank-``m`` "topic"
  subspace (rows of ``B_s``, i.i.d. ``N(0, 1/m)``), so each sequence is anisotropic and its
  tokens are correlated (share ``rho`` of their variance)::

      g_i = c_s A (sqrt(rho) B_s^T f_i + sqrt(1 - rho) e_i),   f_i ~ N(0, I_m), e_i ~ N(0, I_d)
      A = I + (sqrt(r) - 1) U U^T     (planted enrichment of U's subspace)

  The topic subspaces are random, so the population second moment is
  ``Sigma ∝ A^2 = I + (r - 1) U U^T`` and, for any basis ``B``, the population energy fraction
  is ``(k + (r - 1) ||U^T B||_F^2) / (d + (r - 1) k)``.

The *planted ratio* ``rho_p`` is the population ratio ``E(U) / E_Q[E(Q)]`` against the control
distribution: ``r = rho_p`` for normal controls and ``r = rho_p (d - k) / (d - rho_p k)`` for
Haar controls. ``rho_p = 1`` is the null for both tests.

Each simulated data set goes through :func:`anistat.stats.analyze_energy` (the same entry
point as real data). Reported per planted ratio: rejection rate at ``alpha`` of the
Monte-Carlo test and of the sign-flip test (type-I error at ``rho_p = 1``, power otherwise),
and coverage of the CIs of the energy fraction (target: ``E_pop(U)``) and of the energy ratio
(target: ``E_pop(U) / mean_j E_pop(Q_j)`` for the drawn controls — the bootstrap holds the
control draw fixed, so that is its estimand). Rates carry binomial standard errors.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from .energy import analyze_energy

GOALS = {"type1": (0.04, 0.06), "coverage": (0.94, 0.96)}


@dataclass(frozen=True)
class CalibrationResult:
    """Summary of :func:`run_calibration`.

    ``conditions``: one dict per planted ratio (rates, standard errors, coverage, mean CI
    widths, BCa fallbacks). ``checks``: goal name -> ``{"value", "low", "high", "passed"}``.
    """

    settings: dict
    conditions: tuple
    type1_mc: float
    type1_sign_flip: float
    coverage_fraction: float
    coverage_ratio: float
    power_mc: dict
    power_sign_flip: dict
    checks: dict
    elapsed_s: float
    simulations: dict = field(default_factory=dict, repr=False)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(list(self.conditions))


def _haar(rng, shape_lead, d, k):
    z = rng.standard_normal(shape_lead + (d, k))
    q, _ = np.linalg.qr(z)
    return q


def _simulate_one(rng, planted, cfg):
    d, k, n, s = cfg["dim"], cfg["rank"], cfg["n_controls"], cfg["n_sequences"]
    kind = cfg["control_kind"]
    r = planted if kind == "normal" else planted * (d - k) / (d - planted * k)
    u = _haar(rng, (), d, k)
    if kind == "haar":
        q = _haar(rng, (n,), d, k)
    else:
        z = rng.standard_normal((n, d, k))
        z -= u @ (u.T @ z)
        q, _ = np.linalg.qr(z)
    a_mat = np.eye(d) + (np.sqrt(r) - 1.0) * (u @ u.T)
    tmin, tmax = cfg["tokens_per_sequence"]
    t_len = rng.integers(tmin, tmax + 1, size=s)
    rho, m = cfg["within_correlation"], cfg["topic_rank"]
    # within-sequence structure: tokens share a random rank-m "topic" subspace B_s
    topics = rng.standard_normal((s, m, d)) / np.sqrt(m)           # rows span B_s
    zt = np.sqrt(rho) * (rng.standard_normal((s, tmax, m)) @ topics)
    zt += np.sqrt(1 - rho) * rng.standard_normal((s, tmax, d))
    zt *= (np.arange(tmax)[None, :] < t_len[:, None])[:, :, None]  # pad tokens -> 0
    zt *= np.exp(cfg["scale_sd"] * rng.standard_normal(s))[:, None, None]
    g = zt.reshape(-1, d) @ a_mat                                   # (S*T, d), A symmetric
    bases = np.concatenate([u[None], q], axis=0)                   # (n+1, d, k)
    proj = g @ bases.transpose(1, 0, 2).reshape(d, -1)
    proj *= proj
    e = proj.reshape(s, tmax, (n + 1) * k).sum(axis=1).reshape(s, n + 1, k).sum(axis=2)
    g *= g
    total = g.reshape(s, -1).sum(axis=1)
    # population targets
    pop = lambda b: (k + (r - 1) * np.sum((u.T @ b) ** 2, axis=(-2, -1))) / (d + (r - 1) * k)  # noqa: E731
    frac_pop = pop(u)
    ratio_pop = frac_pop / pop(q).mean()
    res = analyze_energy(e[:, 0], e[:, 1:], total, rank=k, dim=d,
                         n_bootstrap=cfg["n_bootstrap"], ci_level=cfg["ci_level"],
                         ci_method=cfg["ci_method"], n_permutations=cfg["n_permutations"],
                         # a fresh bootstrap / sign-flip stream per simulated study: with one shared
                         # seed every study would reuse the same weights matrix, and that single
                         # matrix's Monte-Carlo error (≈ sqrt(2/B) in the bootstrap SE) would bias
                         # the coverage of all studies the same way instead of averaging out
                         seed=int(rng.integers(2**63 - 1)))
    f, rt = res["energy_fraction"], res["energy_ratio"]
    return (res.mc_p_value, res.sign_flip.p_value, f.estimate, f.ci_low, f.ci_high, frac_pop,
            rt.estimate, rt.ci_low, rt.ci_high, ratio_pop, float(f.ci_method != cfg["ci_method"]),
            float(rt.ci_method != cfg["ci_method"]))


_COLS = ("p_mc", "p_sign_flip", "fraction", "fraction_ci_low", "fraction_ci_high",
         "fraction_true", "ratio", "ratio_ci_low", "ratio_ci_high", "ratio_true",
         "fraction_fallback", "ratio_fallback")


def _run_block(args):
    cond_index, planted, sims, cfg = args
    out = np.empty((len(sims), len(_COLS)))
    for row, i in enumerate(sims):
        rng = np.random.default_rng(np.random.SeedSequence([cfg["seed"], cond_index, i]))
        out[row] = _simulate_one(rng, planted, cfg)
    return cond_index, sims, out


def _rate(x):
    x = np.asarray(x, dtype=float)
    m = float(x.mean())
    return m, float(np.sqrt(m * (1 - m) / x.size))


def run_calibration(n_simulations: int = 2000, seed: int = 0,
                    planted_ratios=(1.0, 1.1, 1.25, 1.5, 2.0), n_controls: int = 99,
                    n_sequences: int = 100, *, dim: int = 24, rank: int = 3,
                    tokens_per_sequence=(4, 16), within_correlation: float = 0.5,
                    topic_rank: int = 2, scale_sd: float = 0.25, control_kind: str = "haar",
                    n_bootstrap: int = 1000, n_permutations: int = 999, alpha: float = 0.05,
                    ci_level: float = 0.95, ci_method: str = "bca", n_jobs: int = 1,
                    keep_simulations: bool = False) -> CalibrationResult:
    """Run the calibration study (see the module docstring). Deterministic given ``seed``.

    ``n_jobs > 1`` spreads simulations over processes (results identical to ``n_jobs=1``).
    The null condition is ``planted_ratio == 1.0``; type-I error is NaN if it is absent.
    """
    if control_kind not in ("haar", "normal"):
        raise ValueError("control_kind must be 'haar' or 'normal'")
    planted_ratios = tuple(float(x) for x in planted_ratios)
    if any(pr * rank >= dim or pr <= 0 for pr in planted_ratios):
        raise ValueError(f"planted ratios must be in (0, dim/rank) = (0, {dim / rank:g})")
    if int(n_simulations) < 1:
        raise ValueError("n_simulations must be >= 1")
    cfg = dict(n_simulations=int(n_simulations), seed=int(seed), planted_ratios=planted_ratios,
               n_controls=int(n_controls), n_sequences=int(n_sequences), dim=int(dim),
               rank=int(rank), tokens_per_sequence=tuple(int(x) for x in tokens_per_sequence),
               within_correlation=float(within_correlation), topic_rank=int(topic_rank),
               scale_sd=float(scale_sd),
               control_kind=control_kind, n_bootstrap=int(n_bootstrap),
               n_permutations=int(n_permutations), alpha=float(alpha),
               ci_level=float(ci_level), ci_method=ci_method)
    t0 = time.perf_counter()
    block = 50
    tasks = [(ci, pr, list(range(a, min(a + block, n_simulations))), cfg)
             for ci, pr in enumerate(planted_ratios) for a in range(0, n_simulations, block)]
    results = np.empty((len(planted_ratios), n_simulations, len(_COLS)))
    if n_jobs > 1:
        with ProcessPoolExecutor(max_workers=int(n_jobs)) as ex:
            for ci, sims, out in ex.map(_run_block, tasks):
                results[ci, sims] = out
    else:
        for task in tasks:
            ci, sims, out = _run_block(task)
            results[ci, sims] = out
    elapsed = time.perf_counter() - t0

    rows = []
    for ci, pr in enumerate(planted_ratios):
        r = dict(zip(_COLS, results[ci].T))
        rej_mc, se_mc = _rate(r["p_mc"] <= alpha)
        rej_sf, se_sf = _rate(r["p_sign_flip"] <= alpha)
        cov_f, se_cf = _rate((r["fraction_ci_low"] <= r["fraction_true"])
                             & (r["fraction_true"] <= r["fraction_ci_high"]))
        cov_r, se_cr = _rate((r["ratio_ci_low"] <= r["ratio_true"])
                             & (r["ratio_true"] <= r["ratio_ci_high"]))
        rows.append({
            "planted_ratio": pr, "n_simulations": int(n_simulations),
            "rejection_mc": rej_mc, "rejection_mc_se": se_mc,
            "rejection_sign_flip": rej_sf, "rejection_sign_flip_se": se_sf,
            "coverage_fraction": cov_f, "coverage_fraction_se": se_cf,
            "coverage_ratio": cov_r, "coverage_ratio_se": se_cr,
            "miss_low_fraction": float(np.mean(r["fraction_true"] < r["fraction_ci_low"])),
            "miss_high_fraction": float(np.mean(r["fraction_true"] > r["fraction_ci_high"])),
            "mean_ratio_estimate": float(r["ratio"].mean()),
            "mean_ratio_true": float(r["ratio_true"].mean()),
            "mean_fraction_ci_width": float(np.mean(r["fraction_ci_high"] - r["fraction_ci_low"])),
            "mean_ratio_ci_width": float(np.mean(r["ratio_ci_high"] - r["ratio_ci_low"])),
            "bca_fallbacks": int(r["fraction_fallback"].sum() + r["ratio_fallback"].sum()),
        })
    null = [row for row in rows if row["planted_ratio"] == 1.0]
    t1_mc = null[0]["rejection_mc"] if null else np.nan
    t1_sf = null[0]["rejection_sign_flip"] if null else np.nan
    cov_f = float(np.mean([row["coverage_fraction"] for row in rows]))
    cov_r = float(np.mean([row["coverage_ratio"] for row in rows]))

    def check(v, band):
        return {"value": v, "low": band[0], "high": band[1],
                "passed": bool(np.isfinite(v) and band[0] <= v <= band[1])}

    checks = {"type1_mc": check(t1_mc, GOALS["type1"]),
              "type1_sign_flip": check(t1_sf, GOALS["type1"]),
              "coverage_fraction": check(cov_f, GOALS["coverage"]),
              "coverage_ratio": check(cov_r, GOALS["coverage"])}
    sims = ({f"{pr:g}": dict(zip(_COLS, results[ci].T)) for ci, pr in enumerate(planted_ratios)}
            if keep_simulations else {})
    return CalibrationResult(
        settings={**cfg, "planted_ratios": list(planted_ratios),
                  "tokens_per_sequence": list(cfg["tokens_per_sequence"])},
        conditions=tuple(rows), type1_mc=float(t1_mc), type1_sign_flip=float(t1_sf),
        coverage_fraction=cov_f, coverage_ratio=cov_r,
        power_mc={row["planted_ratio"]: row["rejection_mc"] for row in rows},
        power_sign_flip={row["planted_ratio"]: row["rejection_sign_flip"] for row in rows},
        checks=checks, elapsed_s=float(elapsed), simulations=sims)


def _figure(result: CalibrationResult):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    rows = result.conditions
    x = [r["planted_ratio"] for r in rows]
    alpha = result.settings["alpha"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    ax = axes[0]
    for key, label, marker in (("rejection_mc", "Monte-Carlo test", "o"),
                               ("rejection_sign_flip", "sign-flip test", "s")):
        y = np.array([r[key] for r in rows])
        se = np.array([r[key + "_se"] for r in rows])
        ax.errorbar(x, y, yerr=1.96 * se, marker=marker, capsize=3, label=label)
    ax.axhline(alpha, color="grey", ls="--", lw=1, label=f"alpha = {alpha:g}")
    ax.set_xlabel("planted energy ratio")
    ax.set_ylabel(f"rejection rate at alpha = {alpha:g}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Power curve (type-I error at ratio 1)")
    ax.legend(loc="lower right")
    ax = axes[1]
    for key, label, marker in (("coverage_fraction", "energy fraction", "o"),
                               ("coverage_ratio", "energy ratio", "s")):
        y = np.array([r[key] for r in rows])
        se = np.array([r[key + "_se"] for r in rows])
        ax.errorbar(x, y, yerr=1.96 * se, marker=marker, capsize=3, label=label)
    lvl = result.settings["ci_level"]
    ax.axhline(lvl, color="grey", ls="--", lw=1, label=f"nominal {lvl:g}")
    ax.axhspan(*GOALS["coverage"], color="grey", alpha=0.15)
    ax.set_xlabel("planted energy ratio")
    ax.set_ylabel("CI coverage")
    ax.set_ylim(min(0.85, ax.get_ylim()[0]), 1.0)
    ax.set_title(f"{result.settings['ci_method']} {lvl:.0%} CI coverage")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig, plt


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if not np.isfinite(obj) else float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_calibration_report(result: CalibrationResult, out_dir) -> dict:
    """Write ``calibration.csv``, ``.json``, ``.png``, ``.pdf`` and ``.html`` into ``out_dir``.

    Returns ``{kind: path}``. The HTML is self-contained (figure as base64 PNG, escaped text).
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"calibration.{k}")
             for k in ("csv", "json", "png", "pdf", "html")}
    result.to_frame().to_csv(paths["csv"], index=False)
    payload = {k: v for k, v in asdict(result).items() if k != "simulations"}
    with open(paths["json"], "w", encoding="utf-8") as fh:
        json.dump(_jsonable(payload), fh, indent=2, allow_nan=False)
    fig, plt = _figure(result)
    fig.savefig(paths["pdf"])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130)
    plt.close(fig)
    png = buf.getvalue()
    with open(paths["png"], "wb") as fh:
        fh.write(png)
    esc = html.escape
    df = result.to_frame()
    cols = ["planted_ratio", "rejection_mc", "rejection_sign_flip", "coverage_fraction",
            "coverage_ratio", "mean_ratio_estimate", "mean_ratio_true", "bca_fallbacks"]
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{esc(format(row[c], '.4g'))}</td>" for c in cols) + "</tr>"
                   for _, row in df.iterrows())
    checks = "".join(
        f"<li>{esc(name)}: {esc(format(c['value'], '.4f'))} (goal [{c['low']}, {c['high']}]) — "
        f"<b>{'pass' if c['passed'] else 'FAIL'}</b></li>" for name, c in result.checks.items())
    settings = esc(json.dumps(_jsonable(result.settings)))
    doc = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<title>anistat calibration</title><style>body{font-family:sans-serif;max-width:60em;"
        "margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:right}</style></head><body>"
        "<h1>anistat statistics engine — calibration</h1>"
        f"<p>{esc(str(result.settings['n_simulations']))} simulations per planted ratio, "
        f"{esc(f'{result.elapsed_s:.1f}')} s.</p><ul>{checks}</ul>"
        f"<img alt='power curve and coverage' src='data:image/png;base64,"
        f"{base64.b64encode(png).decode('ascii')}' style='max-width:100%'>"
        f"<table><tr>{head}</tr>{body}</table><h2>Settings</h2><pre>{settings}</pre>"
        "</body></html>")
    with open(paths["html"], "w", encoding="utf-8") as fh:
        fh.write(doc)
    return paths
