"""Pure comparisons over stored results (no Streamlit): latency stats (cold apart from warm),
agreement, accuracy against labels, run diffs - and a learned head as a variant: a column derived from a
target's own rows (head_columns), compared like any target."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TypedDict

import numpy as np
import pandas as pd

from app.core import deployed
from app.core.costs import with_costs
from app.core.deployed import AsDeployed
from app.core.records import config_of
from app.core.stats import proportion
from app.core.store import Store

FrameRow = dict[str, Any]  # a row of a results frame, before pandas
from app.core.stored import NO_RESPONSE, first_response


def results_frame(runs: Sequence[Mapping[str, Any]], results_by_run: Mapping[int, Sequence[Mapping[str, Any]]]
                  ) -> pd.DataFrame:
    """One row per (target, state row): top option, probabilities, latency, error."""
    rows = []
    for run in runs:
        for r in results_by_run.get(run["id"], []):
            rows.append({"run_id": run["id"], "target": run["target_name"], "row_key": r["row_key"],
                         "position": r["position"], "state": r["state"], "label": r.get("label"), "cold": r.get("cold"),
                         "top_option": r["top_option"], "option_ids": r["option_ids"],
                         "probabilities": r["probabilities"], "label_mass": r["label_mass"],
                         "latency_s": r["latency_s"], "error": r["error"],
                         "reused": r.get("reused_from") is not None})
    return pd.DataFrame(rows, columns=["run_id", "target", "row_key", "position", "state", "label", "cold", "top_option",
                                       "option_ids", "probabilities", "label_mass", "latency_s", "error", "reused"])


def warm_calls(df: pd.DataFrame) -> pd.DataFrame:
    """The rows whose latency the figures use: a call that answered (no error), made now (not copied from a
    stored result: its latency is another run's) and warm (not a target's first call on the policy). The
    latency table and the plots read the same rows."""
    ok = df["error"].isna() if "error" in df else pd.Series(True, index=df.index)
    cold = (df["cold"] if "cold" in df else pd.Series(0, index=df.index)).fillna(0).astype(bool)
    reused = df["reused"].fillna(False).astype(bool) if "reused" in df else pd.Series(False, index=df.index)
    return df[ok & ~cold & ~reused]


LATENCY_COLUMNS = ["target", "rows", "errors", "reused", "warm_n", "p50_ms", "p95_ms", "max_ms", "iqr_ms", "cold_ms"]


def latency_stats(df: pd.DataFrame) -> pd.DataFrame:
    """Per target: warm p50 / p95 / max / interquartile range (ms) over warm_n calls, and the cold
    first call apart (the policy's first pass and correction prior, a connection: see cold_note), with
    counts of rows and errors. A row copied from a stored result (`reused`) made no call: its latency is
    another run's, and is left out."""
    out = []
    cold_col = df["cold"] if "cold" in df else pd.Series(0, index=df.index)
    for target, g in df.groupby("target", sort=False):
        ok = g["error"].isna()
        cold = cold_col.loc[g.index].fillna(0).astype(bool)
        reused = g["reused"].fillna(False).astype(bool) if "reused" in g else pd.Series(False, index=g.index)
        ok = ok & ~reused
        lat = warm_calls(g)["latency_s"].to_numpy(dtype=float) * 1000
        first = g.loc[ok & cold, "latency_s"].to_numpy(dtype=float) * 1000
        out.append({"target": target, "rows": len(g), "errors": int(g["error"].notna().sum()),
                    "reused": int(reused.sum()), "warm_n": len(lat),
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


class WarmLatency(TypedDict):
    """A target's recent warm calls (milliseconds): read by key into tables and sentences."""
    n: int
    p50_ms: float
    p95_ms: float


def warm_latencies(store: Store, target_names: set[str], head_layout: bool | None = None) -> dict[str, WarmLatency]:
    """Recent warm calls per target from every stored run: {n, p50_ms, p95_ms} (absent: none yet);
    `head_layout`: of head-layout rows only (True) or of the others (False)."""
    out: dict[str, WarmLatency] = {}
    for name, calls in store.latencies(sorted(target_names), head_layout=head_layout).items():
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


def latency_sentence(seconds: float, cold: bool, warm: WarmLatency | None, *, local: bool = True, prior: bool = False) -> str:
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


class Degenerate(TypedDict):
    """A target that answers (almost) everything with one option: a row of the comparison's table."""
    target: str
    option: str
    share: float
    n: int


def degenerate_targets(df: pd.DataFrame, min_rows: int = 10) -> list[Degenerate]:
    """Targets that answer (almost) everything with one option - SmolLM2 saying "reject" to 30 of
    30 looks healthy in a latency table: [{target, option, share, n}] for those at or above
    DEGENERATE_SHARE over at least `min_rows` answered rows."""
    out: list[Degenerate] = []
    ok = df[df["error"].isna() & df["top_option"].notna()]
    for target, g in ok.groupby("target", sort=False):
        if len(g) < min_rows:
            continue
        counts = g["top_option"].value_counts()
        share = float(counts.iloc[0] / len(g))
        if share >= DEGENERATE_SHARE:
            out.append({"target": str(target), "option": str(counts.index[0]), "share": share, "n": len(g)})
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


def diff_runs(baseline: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
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


def comparison_stats(store: Store, group_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(results frame, latency + cost table) of a saved comparison, read back from the store: the
    Compare page and `python -m app bench` show the same numbers for the same group."""
    frames = comparison_frames(store, group_id)
    return frames.results, frames.latency


@dataclass
class ComparisonFrames:
    results: pd.DataFrame  # one row per (column, state): the targets', then each target's head columns
    latency: pd.DataFrame  # per column (a head column's is its target's)
    heads: pd.DataFrame = field(default_factory=pd.DataFrame)  # per head column: read, accuracy, gated share
    head_notes: list[str] = field(default_factory=list)  # why a target got no head column


def comparison_frames(store: Store, group_id: str, picks: Sequence[AsDeployed] = ()) -> ComparisonFrames:
    """A saved comparison read back, with a derived column per (learned head, target of its model):
    see head_columns."""
    runs = store.runs_in_group(group_id)
    by_run = {r["id"]: store.results(r["id"]) for r in runs}
    head_rows, heads, notes = head_columns(runs, by_run, picks)
    df = results_frame([r for r in runs if not is_head_layout_run(r)], by_run)  # read by a head only: no column
    if head_rows:  # each head column right after its target
        parts = [pd.concat([df[df["run_id"] == r["id"]], pd.DataFrame(head_rows.get(r["id"], []))], ignore_index=True)
                 if head_rows.get(r["id"]) else df[df["run_id"] == r["id"]] for r in runs]
        df = pd.concat(parts, ignore_index=True)
    configs = {r["target_name"]: r["target"] for r in runs}
    configs |= {h["column"]: configs.get(h["target"], {}) for h in heads.to_dict("records")}  # its target's cost
    return ComparisonFrames(df, with_costs(latency_stats(df), configs, store), heads, notes)


# -- a learned head as a variant of a target ---------------------------------------------------------------
HEAD_SUMMARY_COLUMNS = ["column", "target", "calibrated", "head", "answered", "read", "fitted_rows", "labeled",
                        "accuracy", "ci_low",
                        "ci_high", "gated", "gated_share", "gated_low", "gated_high", "decided", "decided_correct",
                        "decided_accuracy", "decided_low", "decided_high"]


def is_head_layout_run(run: Mapping[str, Any]) -> bool:
    """A comparison run that read its rows in the head layout for a learned head (runner.run_policy)."""
    return bool(config_of(run).get("head_layout"))


def head_column_name(target: str, pick: AsDeployed) -> str:
    """'local · head (calibrated #3)', or 'local · as deployed (calibrated #4)' for one without a head."""
    return f"{target} · {'head' if pick.has_head else 'as deployed'} ({pick.label})"


def head_columns(runs: Sequence[Mapping[str, Any]], results_by_run: Mapping[int, Sequence[Mapping[str, Any]]],
                 picks: Sequence[AsDeployed]) -> tuple[dict[int, list[FrameRow]], pd.DataFrame, list[str]]:
    """For each picked head and each target whose rows it can read - the head's model (sha256), rows
    rendered as its calibrated policy renders them, hidden states where it reads them - a column
    "TARGET · head (calibrated #N)": per state the head's own answer (the argmax of its probabilities)
    as `top_option`, and the calibrated policy's decision through its gate (`decision`, `gated`,
    `reason`), each by CalibratedPolicy.apply on the target's stored row. Its latency is the target's
    (the head adds a dot product on a vector the target returned: microseconds). Returns (run id -> the
    rows of its head columns, one summary row per column, why each other target got none)."""
    rows_by_run: dict[int, list[FrameRow]] = {}
    summary: list[FrameRow] = []
    notes: list[str] = []
    for p in picks:
        for run in runs:
            if is_head_layout_run(run) != p.head_layout:
                continue  # the other layout's rows: a column comes from the run in the head's own layout
            target = run["target_name"]
            results = results_by_run.get(run["id"], [])
            why = _no_head_column(p, target, [r for r in results if not r.get("error") and r.get("probabilities")])
            if why:
                notes.append(why)
                continue
            name = head_column_name(target, p)
            rows = []
            for r in results:
                a = deployed.answer(p.policy, r)
                error = r.get("error") or (None if a is None or a.read else
                                           f"the head could not read this row: {a.unread}")
                fitted_on = p.fitted_on(r["state"])  # its label is not counted: the head was fitted on it
                rows.append({"run_id": run["id"], "target": name, "row_key": r["row_key"], "position": r["position"],
                             "state": r["state"], "label": None if fitted_on else r.get("label"), "cold": r.get("cold"),
                             "top_option": a.top if a else None, "option_ids": r["option_ids"],
                             "probabilities": a.probabilities if a and a.read else None,
                             "label_mass": r.get("label_mass"), "latency_s": r["latency_s"], "error": error,
                             "variant_of": target, "decision": a.option_id if a and a.read else None,
                             "gated": a.gated if a and a.read else None, "reason": a.reason if a else None,
                             "fitted_on": fitted_on})
            rows_by_run.setdefault(run["id"], []).extend(rows)
            answered = sum(1 for r in results if not r.get("error") and r.get("probabilities"))
            summary.append(_head_summary(name, target, p, rows, answered))
    return rows_by_run, pd.DataFrame(summary, columns=HEAD_SUMMARY_COLUMNS), notes


def _no_head_column(p: AsDeployed, target: str, answered: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a target gets no column for this head (None: it gets one)."""
    if not answered:
        return f"{target}: no answered row, so no column for the head of {p.label}."
    response = first_response(answered) or NO_RESPONSE
    sha = response.model_sha256
    if sha != p.policy.model.sha256:
        runs_on = f"runs {response.model_file} ({sha[:12]})" if sha else "names no model sha256 (not a llama.cpp model)"
        if p.has_head:
            return (f"{target} {runs_on}, not the model the head of {p.label} was fitted on ({p.policy.model.file}, "
                    f"{p.policy.model.sha256[:12]}): no head column - a head reads its own model's hidden states.")
        return (f"{target} {runs_on}, not the model {p.label} was calibrated on ({p.policy.model.file}, "
                f"{p.policy.model.sha256[:12]}): no column - as deployed, every row of another model goes to its "
                "fallback.")
    rendered = sorted({w for r in answered if (w := deployed.rendering_problem(p.policy, r))})
    if rendered:
        return (f"{target}: its rows were {rendered[0]} than the rows the head of {p.label} was fitted on "
                f"({p.rendering_name}, its question, options and examples): no head column.")
    answers = [deployed.answer(p.policy, r) for r in answered]
    if not any(a is not None and a.read for a in answers):
        first = answers[0]
        return (f"{target}: the head of {p.label} could read none of its rows "
                f"({first.unread if first else 'no answer'}): no head column.")
    return None


def _head_summary(name: str, target: str, p: AsDeployed, rows: list[FrameRow], answered: int) -> FrameRow:
    """A head column in numbers: rows its target answered and it read; how many of those the head was
    fitted on (their labels are not counted: in-sample); its accuracy (its own answer, on the other
    labeled rows); the share its gate sent to the fallback; the accuracy of what it decided - each with
    its Wilson 95% interval."""
    read = [r for r in rows if r["top_option"] is not None]
    fitted = sum(bool(r.get("fitted_on")) for r in read)  # the head's own training rows: not counted below
    labeled = [r for r in read if r["label"] is not None and not r.get("fitted_on")]
    right = sum(r["top_option"] == r["label"] for r in labeled)
    gated = sum(bool(r["gated"]) for r in read)
    decided = [r for r in labeled if not r["gated"]]
    decided_right = sum(r["decision"] == r["label"] for r in decided)
    acc, share = proportion(right, len(labeled)), proportion(gated, len(read))
    dec = proportion(decided_right, len(decided))
    return {"column": name, "target": target, "calibrated": p.label, "head": p.policy.correction_name, "answered": answered,
            "read": len(read), "fitted_rows": fitted, "labeled": len(labeled), "accuracy": acc.rate, "ci_low": acc.low,
            "ci_high": acc.high,
            "gated": gated, "gated_share": share.rate, "gated_low": share.low, "gated_high": share.high,
            "decided": len(decided), "decided_correct": decided_right, "decided_accuracy": dec.rate,
            "decided_low": dec.low, "decided_high": dec.high}
