"""Pure comparisons over stored results (no Streamlit): latency stats (cold apart from warm),
agreement, accuracy against labels, run diffs."""
from __future__ import annotations

import numpy as np
import pandas as pd

from app.core.costs import with_costs
from app.core.stats import proportion


def results_frame(runs: list[dict], results_by_run: dict[int, list[dict]]) -> pd.DataFrame:
    """One row per (target, state row): top option, probabilities, latency, error."""
    rows = []
    for run in runs:
        for r in results_by_run.get(run["id"], []):
            rows.append({"run_id": run["id"], "target": run["target_name"], "row_key": r["row_key"],
                         "position": r["position"], "state": r["state"], "label": r.get("label"), "cold": r.get("cold"),
                         "top_option": r["top_option"], "option_ids": r["option_ids"],
                         "probabilities": r["probabilities"], "label_mass": r["label_mass"],
                         "latency_s": r["latency_s"], "error": r["error"]})
    return pd.DataFrame(rows, columns=["run_id", "target", "row_key", "position", "state", "label", "cold", "top_option",
                                       "option_ids", "probabilities", "label_mass", "latency_s", "error"])


LATENCY_COLUMNS = ["target", "rows", "errors", "warm_n", "p50_ms", "p95_ms", "max_ms", "iqr_ms", "cold_ms"]


def latency_stats(df: pd.DataFrame) -> pd.DataFrame:
    """Per target: warm p50 / p95 / max / interquartile range (ms) over warm_n calls, and the cold
    first call apart (the policy's first pass and correction prior, a connection: see cold_note), with
    counts of rows and errors."""
    out = []
    cold_col = df["cold"] if "cold" in df else pd.Series(0, index=df.index)
    for target, g in df.groupby("target", sort=False):
        ok = g["error"].isna()
        cold = cold_col.loc[g.index].fillna(0).astype(bool)
        lat = g.loc[ok & ~cold, "latency_s"].to_numpy(dtype=float) * 1000
        first = g.loc[ok & cold, "latency_s"].to_numpy(dtype=float) * 1000
        out.append({"target": target, "rows": len(g), "errors": int((~ok).sum()), "warm_n": len(lat),
                    "p50_ms": float(np.percentile(lat, 50)) if len(lat) else np.nan,
                    "p95_ms": float(np.percentile(lat, 95)) if len(lat) else np.nan,
                    "max_ms": float(lat.max()) if len(lat) else np.nan,
                    "iqr_ms": float(np.percentile(lat, 75) - np.percentile(lat, 25)) if len(lat) else np.nan,
                    "cold_ms": float(first.max()) if len(first) else np.nan})
    df_out = pd.DataFrame(out, columns=LATENCY_COLUMNS)
    if len(df_out):  # ratios against the first target (the benchmark's baseline)
        df_out["p50_vs_first"] = df_out["p50_ms"] / df_out["p50_ms"].iloc[0]
        df_out["p95_vs_first"] = df_out["p95_ms"] / df_out["p95_ms"].iloc[0]
    return df_out


def warm_latencies(store, target_names) -> dict[str, dict]:
    """Recent warm calls per target from every stored run: {n, p50_ms, p95_ms} (absent: none yet)."""
    out = {}
    for name, calls in store.latencies(sorted(target_names)).items():
        warm = np.array([s for s, cold in calls if not cold], float) * 1000
        if len(warm):
            out[name] = {"n": len(warm), "p50_ms": float(np.percentile(warm, 50)),
                         "p95_ms": float(np.percentile(warm, 95))}
    return out


def cold_note(local: bool, prior: bool) -> str:
    """What a target's first call on a policy (runner.is_cold) paid for. It computes the policy's first
    pass (the prompt prefix later calls reuse) and, with the content-free correction, the policy's prior
    (three more passes on the empty states, cached after). A local model is loaded before the clock
    starts (Target.prepare), so its load is not in the time; a remote target's call includes setting
    up the connection and whatever the server does on its first request."""
    work = "the policy's first pass" + (" and its content-free correction prior (3 more passes)" if prior else "")
    if local:
        return f"first call on this policy: {work}; the model load is not timed"
    return f"first call on this policy: connection set-up, {work}"


def latency_sentence(seconds: float, cold: bool, warm: dict | None, *, local: bool = True, prior: bool = False) -> str:
    """One call's latency with its context: cold (and what that paid for: `local` target, content-free
    `prior` computed) or warm, and the recent warm distribution."""
    this = f"this call {_ms(seconds * 1000)}" + (f" ({cold_note(local, prior)})" if cold else " (warm)")
    if not warm:
        return this + " · no warm calls measured yet"
    return this + f" · recent warm calls: p50 {_ms(warm['p50_ms'])}, p95 {_ms(warm['p95_ms'])}, n={warm['n']}"


def _ms(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


def accuracy_by_target(df: pd.DataFrame) -> pd.DataFrame:
    """Per target: labeled rows answered, correct, wrong, accuracy with its Wilson 95% interval
    (rows without a label are left out)."""
    rows = []
    labeled = df[df["label"].notna() & df["error"].isna()]
    for target, g in labeled.groupby("target", sort=False):
        correct = int((g["top_option"] == g["label"]).sum())
        p = proportion(correct, len(g))
        rows.append({"target": target, "labeled": len(g), "correct": correct, "wrong": len(g) - correct,
                     "accuracy": p.rate, "ci_low": p.low, "ci_high": p.high})
    return pd.DataFrame(rows, columns=["target", "labeled", "correct", "wrong", "accuracy", "ci_low", "ci_high"])


DEGENERATE_SHARE = 0.9  # a target that puts this share of its rows on one option is not really deciding


def degenerate_targets(df: pd.DataFrame, min_rows: int = 10) -> list[dict]:
    """Targets that answer (almost) everything with one option - SmolLM2 saying "reject" to 30 of
    30 looks healthy in a latency table: [{target, option, share, n}] for those at or above
    DEGENERATE_SHARE over at least `min_rows` answered rows."""
    out = []
    ok = df[df["error"].isna() & df["top_option"].notna()]
    for target, g in ok.groupby("target", sort=False):
        if len(g) < min_rows:
            continue
        counts = g["top_option"].value_counts()
        share = float(counts.iloc[0] / len(g))
        if share >= DEGENERATE_SHARE:
            out.append({"target": target, "option": counts.index[0], "share": share, "n": len(g)})
    return out


def confusion_by_target(df: pd.DataFrame, option_ids: list[str]) -> dict[str, list[list[int]]]:
    """Per target: counts of (label, chosen option) over labeled answered rows, in option order."""
    out = {}
    labeled = df[df["label"].notna() & df["error"].isna() & df["top_option"].notna()]
    index = {o: i for i, o in enumerate(option_ids)}
    for target, g in labeled.groupby("target", sort=False):
        m = [[0] * len(option_ids) for _ in option_ids]
        for label, top in zip(g["label"], g["top_option"]):
            if label in index and top in index:
                m[index[label]][index[top]] += 1
        out[target] = m
    return out


def top_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows x targets table of top options (None where the target failed)."""
    if df.empty:
        return pd.DataFrame()
    t = df.drop_duplicates(["position", "row_key", "target"]).set_index(["position", "row_key", "target"])
    t = t["top_option"].unstack("target").sort_index()
    return t.reindex(columns=list(dict.fromkeys(df["target"])))


def agreement_matrix(df: pd.DataFrame) -> pd.DataFrame:
    """Share of rows where two targets chose the same top option (rows both answered)."""
    t = top_table(df)
    names = list(t.columns)
    m = pd.DataFrame(np.nan, index=names, columns=names)
    for a in names:
        for b in names:
            both = t[a].notna() & t[b].notna()
            if both.any():
                m.loc[a, b] = float((t.loc[both, a] == t.loc[both, b]).mean())
    return m


def disagreements(df: pd.DataFrame) -> pd.DataFrame:
    """One row per state: its label (if any), each target's top option, `disagree` (targets differ)
    and `wrong` (some target's answer is not the label)."""
    t = top_table(df)
    if t.empty:
        return pd.DataFrame(columns=["row_key", "state", "label", "disagree", "wrong"])
    targets = list(t.columns)
    answered = t.notna()
    disagree = t.apply(lambda r: r.dropna().nunique() > 1, axis=1)
    out = t.copy()
    out["disagree"] = disagree & (answered.sum(axis=1) > 1)
    out = out.reset_index()
    first = df.drop_duplicates("row_key").set_index("row_key")
    out.insert(2, "state", out["row_key"].map(first["state"]))
    out.insert(3, "label", out["row_key"].map(first["label"]))
    has_label = out["label"].notna()
    out["wrong"] = has_label & out[targets].apply(lambda col: col.notna() & (col != out["label"])).any(axis=1)
    return out.drop(columns=["position"])


def diff_runs(baseline: list[dict], other: list[dict]) -> pd.DataFrame:
    """Per row present in both runs - the same row key *and* the same state (Playground runs all use
    the key "playground": two of them are the same row only when they decided the same state) -
    top option change and probability shift."""
    base = {r["row_key"]: r for r in baseline if r.get("probabilities")}
    rows = []
    for r in other:
        b = base.get(r["row_key"])
        if b is None or not r.get("probabilities") or b.get("state") != r.get("state"):
            continue
        pb = dict(zip(b["option_ids"], b["probabilities"]))
        po = dict(zip(r["option_ids"], r["probabilities"]))
        shifts = {k: po.get(k, 0.0) - pb.get(k, 0.0) for k in dict.fromkeys([*pb, *po])}
        biggest = max(shifts, key=lambda k: abs(shifts[k]))
        rows.append({"row_key": r["row_key"], "state": r["state"], "baseline_top": b["top_option"],
                     "top": r["top_option"], "changed": b["top_option"] != r["top_option"],
                     "max_shift": abs(shifts[biggest]), "shift_option": biggest, "shift": shifts[biggest]})
    return pd.DataFrame(rows, columns=["row_key", "state", "baseline_top", "top", "changed", "max_shift",
                                       "shift_option", "shift"])


def comparison_stats(store, group_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(results frame, latency + cost table) of a saved comparison, read back from the store: the
    Compare page and `python -m app bench` show the same numbers for the same group."""
    runs = store.runs_in_group(group_id)
    df = results_frame(runs, {r["id"]: store.results(r["id"]) for r in runs})
    return df, with_costs(latency_stats(df), {r["target_name"]: r["target"] for r in runs}, store)
