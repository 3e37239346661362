"""Every page under Streamlit's AppTest, against a real SQLite file and the real local model."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.store import Store
from tests.conftest import ROOT, scored_rows

MAIN = str(ROOT / "app" / "main.py")


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "wb.db"
    monkeypatch.setenv("SEMIF_DB", str(path))
    return Store(path)


def frame_with(at: AppTest, column: str):
    """The first dataframe on the page that has this column (dataframes are not keyed widgets)."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no dataframe with column {column!r}")


def app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    if page:
        at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def test_first_start_teaches_then_runs_and_saves(db):
    at = app()
    assert "Welcome" in at.info[0].value
    at.button(key="pg_seed").click().run()
    assert len(db.list_policies()) == len(list((ROOT / "data" / "policies").glob("*.json")))
    at.selectbox(key="pg_policy").select("ticket-routing").run()
    at.button(key="pg_run").click().run()
    assert "State** is empty" in at.error[0].value and db.list_runs() == []  # validated, nothing run
    at.text_area(key="pg_state").input("After I reset my password the site says my account is locked.").run()
    at.button(key="pg_run").click().run()
    assert not at.exception
    (run,) = db.list_runs()
    (res,) = db.results(run["id"])
    assert run["kind"] == "playground" and run["status"] == "done" and run["model"].startswith("SmolLM2")
    assert res["option_ids"] == ["access", "billing", "technical", "shipping"]
    assert abs(sum(res["probabilities"]) - 1) < 1e-9
    assert at.metric[0].value == res["top_option"] == "access"
    assert len(at.get("plotly_chart")) == 1


def test_failing_target_shows_its_error_and_the_rest_still_works(db):
    db.save_target("down", "semif", {"url": "http://127.0.0.1:9"})
    at = app()
    at.button(key="pg_seed").click().run()
    at.text_area(key="pg_state").input("My parcel is lost").run()
    at.multiselect(key="pg_targets").set_value(["local", "down"]).run()
    at.button(key="pg_run").click().run()
    assert not at.exception
    assert any("This target failed: cannot reach" in e.value for e in at.error)
    assert len(at.get("plotly_chart")) == 1  # the local target's chart is still there
    runs = db.list_runs()
    assert {r["target_name"]: r["status"] for r in runs} == {"local": "done", "down": "failed"}


def test_policy_form_validation_then_save_and_json_round_trip(db):
    at = app("policies")
    assert at.selectbox(key="pol_pick").value == "__new__"
    at.text_input(key="pol_name___new__").input("Escalation check")
    at.text_area(key="pol_question___new__").input("Should this go to a human?")
    at.run()
    # options default to two empty rows: the form refuses to save and says why, next to the field
    at.button(key="FormSubmitter:pol_form___new__-Save policy").click().run()
    assert any("options" in e.value for e in at.error) and db.list_policies() == []
    at.text_area(key="pol_json___new__").input(
        '{"name": "Escalation check", "question": "Human needed?", '
        '"options": [{"id": "yes", "description": ""}, {"id": "no", "description": ""}]}')
    at.button(key="pol_apply___new__").click().run()
    (p,) = db.list_policies()
    assert p["id"] == "escalation-check" and [o["id"] for o in p["options"]] == ["yes", "no"]
    assert at.selectbox(key="pol_pick").value == "escalation-check"
    assert '"escalation-check"' in at.text_area(key="pol_json_escalation-check").value  # JSON view of the saved one
    at.text_area(key="pol_json_escalation-check").input('{"name": "x", "question": "q", "options": []}')
    at.button(key="pol_apply_escalation-check").click().run()
    assert any("options" in e.value for e in at.error)
    assert db.get_policy("escalation-check")["question"] == "Human needed?"  # nothing saved was lost
    at.button(key="pol_dup").click().run()
    assert {x["id"] for x in db.list_policies()} == {"escalation-check", "escalation-check-copy2"}


def test_policy_from_template_and_delete(db):
    at = app("policies")
    at.selectbox(key="pol_tpl").select("refund-check").run()
    at.button(key="pol_add_tpl").click().run()
    assert db.get_policy("refund-check")["options"][0]["id"] == "yes"
    at.button(key="pol_delete").click().run()
    assert db.list_policies() == []


def test_compare_with_uploaded_csv(db):
    at = app()
    at.button(key="pg_seed").click().run()
    at.switch_page("pages/compare.py").run()
    at.selectbox(key="cmp_policy").select("ticket-routing").run()
    csv = b"id,state\nt1,I was charged twice this month\nt2,The app crashes on start\nt3,Parcel never came\n"
    at.file_uploader(key="cmp_upload").set_value(("states.csv", csv, "text/csv")).run()
    at.button(key="cmp_run").click().run()
    assert not at.exception
    (run,) = db.list_runs(kind="compare")
    assert [r["row_key"] for r in db.results(run["id"])] == ["t1", "t2", "t3"]
    stats = frame_with(at, "p50_ms")
    assert list(stats["target"]) == ["local"] and stats.loc[0, "rows"] == 3
    table = frame_with(at, "disagree")
    assert list(table["row_key"]) == ["t1", "t2", "t3"]
    assert at.get("download_button")


def test_compare_rejects_a_bad_upload_and_runs_nothing(db):
    at = app()
    at.button(key="pg_seed").click().run()
    at.switch_page("pages/compare.py").run()
    at.file_uploader(key="cmp_upload").set_value(("states.csv", b"id,state\na,fine\nb,\n", "text/csv")).run()
    at.button(key="cmp_run").click().run()
    assert "row 3, column state" in at.error[0].value
    assert db.list_runs() == []


def test_history_open_pin_diff_delete(db):
    at = app()
    at.button(key="pg_seed").click().run()
    at.selectbox(key="pg_policy").select("ticket-routing").run()
    at.text_area(key="pg_state").input("Refund my double charge").run()
    at.button(key="pg_run").click().run()
    at.selectbox(key="pg_readout").select("letters").run()
    at.button(key="pg_run").click().run()
    first, second = sorted(r["id"] for r in db.list_runs())
    at.switch_page("pages/history.py").run()
    assert len(frame_with(at, "baseline")) == 2
    at.selectbox(key="hist_open").select(first).run()
    at.button(key="hist_pin").click().run()
    assert db.pinned_run()["id"] == first
    at.selectbox(key="hist_open").select(second).run()
    diff = frame_with(at, "max_shift")
    assert list(diff["row_key"]) == ["playground"]
    at.button(key="hist_delete").click().run()
    assert [r["id"] for r in db.list_runs()] == [first] and db.results(second) == []


def test_targets_page_add_validate_and_test_connection(db, adapter_server):
    at = app("targets")
    at.selectbox(key="tg_kind").select("semif").run()
    at.text_input(key="tg_name").input("adapter")
    at.text_input(key="tg_url").input("localhost:8080")
    at.button(key="FormSubmitter:tg_form-Save target").click().run()
    assert any("url" in e.value for e in at.error) and db.list_targets() == []
    at.text_input(key="tg_url").input(adapter_server.url)
    at.button(key="FormSubmitter:tg_form-Save target").click().run()
    assert db.list_targets()[0]["config"]["url"] == adapter_server.url
    at.button(key="tg_test_adapter").click().run()
    assert any("is up" in s.value for s in at.success)


def test_calibrate_page_evaluates_compares_readouts_and_exports(db):
    at = app()
    at.button(key="pg_seed").click().run()
    at.switch_page("pages/calibrate.py").run()
    assert "Import a labeled set" in at.info[0].value
    at.button(key="cal_ship").click().run()
    assert {s["name"] for s in db.list_labeled_sets()} >= {"refund-check.jsonl", "ticket-routing.jsonl"}
    at.selectbox(key="cal_policy").select("refund-check").run()
    at.multiselect(key="cal_variants").set_value(["policy default", "letters"]).run()
    at.button(key="cal_run").click().run()
    assert not at.exception
    runs = db.list_runs(kind="eval")
    assert len(runs) == 2 and all(r["status"] == "done" and r["n_rows"] == scored_rows("refund-check") for r in runs)
    table = frame_with(at, "ece_after_T")
    assert sorted(table["readout"]) == ["default", "letters"] and (table["rows"] == scored_rows("refund-check")).all()
    # the 135M model cannot reach 90% on this set: the page says so and exports a safe policy
    assert any("unreachable" in e.value for e in at.error)
    at.checkbox(key="cal_manual").check().run()
    at.slider(key="cal_gate").set_value(0.6).run()
    download = at.get("download_button")[0]
    assert download.proto.label.startswith("Download calibrated policy")
    # the numbers on the page are the exported rule applied to the stored results
    from app import evaluation

    rid = at.selectbox(key="cal_run_pick").value
    cal = evaluation.calibrate_run(db, rid, target_accuracy=0.9)
    config = evaluation.build_policy(db, rid, cal, threshold=0.6, fallback="human-review")
    cov = config["metrics"]["at_gate"]["coverage"]
    assert any(m.value == f"{cov:.1%}" for m in at.metric)
    # running again reuses the finished runs (no new rows scored)
    at.button(key="cal_run").click().run()
    assert len(db.list_runs(kind="eval")) == 2


@pytest.fixture
def runtime_shim(adapter_server):
    from tests.shim import RuntimeShim

    shim = RuntimeShim({"*": adapter_server.url})  # every endpoint name reaches the adapter process
    yield shim
    shim.stop()


def test_deploy_page_plan_confirm_invoke_destroy(db, aws_env, runtime_shim, monkeypatch):
    monkeypatch.setenv("SEMIF_AWS_ENDPOINT_URL", aws_env)
    monkeypatch.setenv("SEMIF_AWS_RUNTIME_URL", runtime_shim.url)
    monkeypatch.setenv("SEMIF_DEPLOY_POLL", "0.01")
    at = app("deploy")
    assert aws_env in at.info[0].value  # the page says where AWS calls go
    at.radio(key="dep_path").set_value("semif")
    at.radio(key="dep_compute").set_value("gpu")
    at.text_input(key="dep_bucket").input("semif-test-models")
    at.text_input(key="dep_role").input("arn:aws:iam::123456789012:role/sm")
    at.button(key="FormSubmitter:dep_form-Plan").click().run()
    assert any("CodeBuild role ARN" in e.value for e in at.error) and db.list_deployments() == []
    at.text_input(key="dep_cb_role").input("arn:aws:iam::123456789012:role/cb")
    at.button(key="FormSubmitter:dep_form-Plan").click().run()
    assert not at.exception
    assert any("depending on which pool wins" in m.value for m in at.markdown)
    calls = frame_with(at, "call")["call"].tolist()
    assert calls[:3] == ["s3.PutObject", "ecr.CreateRepository", "codebuild.CreateProject"]
    assert "sagemaker.CreateEndpointConfig" in calls
    assert at.button(key="dep_go").disabled  # not before the acknowledgement
    at.checkbox(key="dep_ack").check().run()
    at.button(key="dep_go").click().run()
    assert not at.exception, at.exception
    (dep,) = db.list_deployments()
    assert dep["status"] == "InService" and dep["compute"] == "gpu"
    assert [a["action"] for a in db.audit_log(dep["id"])] == ["plan", "apply"]
    assert any(t["name"] == dep["endpoint_name"] and t["kind"] == "sagemaker" for t in db.list_targets())
    # the new endpoint is offered as a target in the Playground
    at.switch_page("pages/playground.py").run()
    at.button(key="pg_seed").click().run()
    assert dep["endpoint_name"] in at.multiselect(key="pg_targets").options
    # invoke it: the real boto3 sagemaker-runtime client -> the shim -> the adapter process
    at.selectbox(key="pg_policy").select("ticket-routing").run()
    at.text_area(key="pg_state").input("I was charged twice for my order").run()
    at.multiselect(key="pg_targets").set_value(["local", dep["endpoint_name"]]).run()
    at.button(key="pg_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    runs = {r["target_name"]: db.results(r["id"])[0] for r in db.list_runs(kind="playground")}
    assert runs[dep["endpoint_name"]]["probabilities"] == runs["local"]["probabilities"]
    assert any("agree" in s.value for s in at.success)
    at.switch_page("pages/deploy.py").run()
    at.selectbox(key="dep_pick").select(dep["id"]).run()
    assert at.button(key="dep_destroy").disabled
    at.text_input(key="dep_confirm_name").input(dep["endpoint_name"]).run()
    at.button(key="dep_destroy").click().run()
    assert db.get_deployment(dep["id"])["status"] == "deleted"
    assert [a["action"] for a in db.audit_log(dep["id"])] == ["plan", "apply", "destroy"]
    import boto3

    sm = boto3.client("sagemaker", region_name="us-east-1", endpoint_url=aws_env)
    assert dep["endpoint_name"] not in [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]
