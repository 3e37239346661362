"""Two runs side by side: the drift numbers against a direct computation, on two real local models
(SmolLM2 vs Qwen2.5-Coder-0.5B on the same labeled rows), in History and Compare (AppTest), and the
self-contained HTML report / JSON."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as st
from streamlit.testing.v1 import AppTest

from app.core import drift

from app.ui import drift_report
from app.core.gates import Gate
from app.core.store import Store
from tests.conftest import ROOT, two_model_runs

MAIN = str(ROOT / "app" / "main.py")


def direct(a_rows: list[dict], b_rows: list[dict], shift: float = 0.10) -> dict:
    """The comparison computed here from the stored results, without app.drift."""
    a = {r["row_key"]: r for r in a_rows}
    out = {"fixed": 0, "broken": 0, "changed-wrong": 0, "changed": 0, "shift": 0, "right_a": [], "right_b": []}
    for r in b_rows:
        ra = a[r["row_key"]]
        ta, tb = int(np.argmax(ra["probabilities"])), int(np.argmax(r["probabilities"]))
        ids, label = r["option_ids"], r["label"]
        if ta != tb:
            out["fixed" if ids[tb] == label else "broken" if ids[ta] == label else "changed-wrong"] += 1
        elif np.max(np.abs(np.array(r["probabilities"]) - np.array(ra["probabilities"]))) > shift:
            out["shift"] += 1
        out["right_a"].append(ids[ta] == label)
        out["right_b"].append(ids[tb] == label)
    out["flips"] = out["fixed"] + out["broken"] + out["changed-wrong"]
    n = out["fixed"] + out["broken"]
    out["p"] = st.binomtest(out["fixed"], n, 0.5).pvalue if n else 1.0
    # the interval McNemar's exact test inverts (issue 35: one paired test, its interval on the same pairs)
    ci = st.binomtest(out["fixed"], n, 0.5).proportion_ci(0.95, method="exact") if n else None
    pairs = len(out["right_a"])
    out["ci"] = (n / pairs * (2 * ci.low - 1), n / pairs * (2 * ci.high - 1)) if ci is not None else (0.0, 0.0)
    out["acc_a"], out["acc_b"] = float(np.mean(out["right_a"])), float(np.mean(out["right_b"]))

    def ece(rows):
        conf = np.array([max(r["probabilities"]) for r in rows])
        ok = np.array([r["option_ids"][int(np.argmax(r["probabilities"]))] == r["label"] for r in rows], float)
        bins = np.clip(np.ceil(conf * 10) - 1, 0, 9)
        return sum((bins == b).sum() / len(rows) * abs(ok[bins == b].mean() - conf[bins == b].mean())
                   for b in range(10) if (bins == b).any())

    out["ece_a"], out["ece_b"] = ece(list(a.values())), ece(b_rows)
    return out


def test_synthetic_pairs_every_kind_and_a_null_comparison():
    def row(key, label, probs, state="s"):
        return {"row_key": key, "state": state, "label": label, "option_ids": ["x", "y", "z"], "probabilities": probs,
                "top_option": "xyz"[int(np.argmax(probs))]}

    a = [row("fix", "y", [0.6, 0.3, 0.1]), row("break", "x", [0.6, 0.3, 0.1]), row("cw", "z", [0.6, 0.3, 0.1]),
         row("shift", "x", [0.6, 0.3, 0.1]), row("same", "x", [0.6, 0.3, 0.1]), row("other", "x", [0.6, 0.3, 0.1]),
         row("nolabel", None, [0.6, 0.3, 0.1])]
    b = [row("fix", "y", [0.2, 0.7, 0.1]), row("break", "x", [0.2, 0.7, 0.1]), row("cw", "z", [0.2, 0.7, 0.1]),
         row("shift", "x", [0.9, 0.05, 0.05]), row("same", "x", [0.62, 0.28, 0.1]),
         row("other", "x", [0.6, 0.3, 0.1], state="another state"), row("nolabel", None, [0.1, 0.1, 0.8])]
    d = drift.compare(a, b, gate=Gate(threshold=0.65))
    assert d.rows == {"fixed": ["fix"], "broken": ["break"], "changed-wrong": ["cw"], "changed": ["nolabel"],
                      "shift": ["shift"], "same": ["same"]}
    assert d.unmatched == 1 and d.labeled == 5 and d.flips == 4  # "other": same key, another state
    assert d.per_class["x"]["broken"] == 1 and d.per_class["(no label)"]["changed"] == 1
    assert d.mcnemar_p == 1.0  # one fixed, one broken: no evidence either way
    assert d.gate_b.coverage.k == 5 and d.gate_a.coverage.k == 0  # B's confident rows decided at 0.65, none of A's
    same = drift.compare(a, a)
    assert same.flips == 0 and same.accuracy_diff == 0 and same.accuracy_diff_ci == (0.0, 0.0) and same.mcnemar_p == 1.0
    assert json.loads(drift_report.json_text(d))["counts"]["broken"] == 1


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, engine, qwen05):
    path = tmp_path_factory.mktemp("drift") / "wb.db"
    store = Store(path)
    run_a, run_b = two_model_runs(store, engine, qwen05, 12, tmp_path=path.parent)
    return path, run_a, run_b


def test_history_compare_with_shows_the_numbers_and_the_report_holds_them(two_models, monkeypatch):
    path, run_a, run_b = two_models
    monkeypatch.setenv("SEMIF_DB", str(path))
    store = Store(path)
    a_rows, b_rows = store.results(run_a), store.results(run_b)
    want = direct(a_rows, b_rows)
    assert want["flips"] > 0  # two models really disagree on some rows

    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    at.switch_page("views/history.py").run()
    at.selectbox(key="hist_open").select(run_b).run()
    at.selectbox(key="hist_cmp").select(run_a).run()
    assert not at.exception, at.exception
    shown = {m.label: m.value for m in at.metric}
    assert shown["Flips"] == str(want["flips"]) and shown["Broken"] == str(want["broken"])
    assert shown["Fixed"] == str(want["fixed"]) and shown["Changed-wrong"] == str(want["changed-wrong"])
    assert shown["Shifts"] == str(want["shift"])
    assert shown["McNemar exact p"] == f"{want['p']:.4f}"
    assert shown["Accuracy A"] == f"{want['acc_a']:.1%}" and shown["Accuracy B"] == f"{want['acc_b']:.1%}"
    assert shown["B − A, 95% CI"] == f"{want['ci'][0]:+.1%} to {want['ci'][1]:+.1%}"
    gates = next(df.value for df in at.dataframe if "coverage" in df.value.columns)
    assert list(gates["ECE"]) == [round(want["ece_a"], 4), round(want["ece_b"], 4)]
    assert all(c.startswith("100.0%") for c in gates["coverage"])  # no gate: every row decided
    rows = next(df.value for df in at.dataframe if "a_top_in_b" in df.value.columns)
    assert sorted(rows.loc[rows["kind"] == "broken", "row_key"]) == sorted(
        r["row_key"] for r in b_rows if r["top_option"] != r["label"]
        and {x["row_key"]: x for x in a_rows}[r["row_key"]]["top_option"] == r["label"])
    at.multiselect(key="hist_drift_kinds").set_value(["broken"]).run()
    rows = next(df.value for df in at.dataframe if "a_top_in_b" in df.value.columns)
    assert set(rows["kind"]) <= {"broken"} and len(rows) == want["broken"]
    assert len(at.get("download_button")) >= 3  # the run's CSV, the report, the JSON

    d = drift.compare(a_rows, b_rows, labels={"a": f"#{run_a}", "b": f"#{run_b}"})
    page = drift_report.html_report(d, "test")
    assert f"<tr><th>flips</th><td>{want['flips']}</td></tr>" in page
    assert f"<tr><th>McNemar exact p</th><td>{want['p']:.4f}</td></tr>" in page
    assert f"{want['ci'][0]:+.1%} to {want['ci'][1]:+.1%}" in page
    assert "<script src=" not in page and page.count("Plotly.newPlot") == 3 and len(page) > 1_000_000  # inlined
    data = json.loads(page.split('<script type="application/json" id="drift-data">')[1].split("</script>")[0])
    assert data["counts"]["broken"] == want["broken"] and data["mcnemar_exact_p"] == pytest.approx(want["p"])
    assert data["accuracy_diff_ci95"] == pytest.approx(list(want["ci"]))


def test_compare_page_puts_two_targets_side_by_side(two_models, monkeypatch, engine, qwen05):
    from adapter.engine.templates import load_template
    from app.core.runner import Case, run_policy
    from app.targets.local import LocalTarget

    path, _, _ = two_models
    monkeypatch.setenv("SEMIF_DB", str(path))
    store = Store(path)
    states = ["I was charged twice for March", "The app crashes when I open reports", "My parcel never arrived",
              "I cannot sign in after the password reset"]
    targets = [LocalTarget("local", {}, lambda m: engine),
               LocalTarget("local-qwen2.5-coder-0.5b", {"model": "qwen2.5-coder-0.5b"}, lambda m: qwen05)]
    group, (ra, rb) = run_policy(store, load_template("ticket-routing"), [Case(f"s{i}", s) for i, s in enumerate(states)],
                                 targets, kind="compare")
    tops = [(x["top_option"], y["top_option"]) for x, y in zip(store.results(ra), store.results(rb))]
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    at.switch_page("views/compare.py").run()
    assert at.selectbox(key="cmp_open").value == group
    assert at.selectbox(key="cmp_drift_a").value == ra and at.selectbox(key="cmp_drift_b").value == rb
    shown = {m.label: m.value for m in at.metric}
    assert shown["Flips"] == str(sum(x != y for x, y in tops))  # no labels: every flip is "changed"
    assert shown["Changed"] == shown["Flips"] and shown["Broken"] == "0"
    assert any("No labels on these rows" in c.value for c in at.caption)
