"""Settings read from the environment (pydantic-settings): the adapter's, the decision log's, deploy's
and the workbench's. A mapping given to from_env is the only source; an empty variable is the
default; a bad value is an error naming the variable, the value and what is expected."""
from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from adapter.server.decision_log import NAMESPACE, DecisionLogSettings
from adapter.env_settings import MIB, SettingsError
from adapter.server.settings import AdapterSettings
from tests.conftest import ROOT


def test_adapter_defaults_and_names():
    s = AdapterSettings.from_env({})
    assert (s.host, s.port, s.api_key, s.model_aliases, s.max_queue, s.max_body, s.request_timeout) == \
        ("127.0.0.1", 8080, None, ("jev-latest", "semif-latest"), 16, 6 * MIB, 60.0)
    s = AdapterSettings.from_env({"SM_SEMIF_HOST": "0.0.0.0", "SAGEMAKER_BIND_TO_PORT": "9000", "SM_SEMIF_API_KEY": "k",
                                  "SM_SEMIF_MODEL_ALIASES": "a, b,", "SM_SEMIF_MAX_BODY_BYTES": "1024",
                                  "SM_SEMIF_MAX_DECODED_BYTES": "2048", "SM_SEMIF_POLICY": "p.json",
                                  "SM_SEMIF_REQUEST_TIMEOUT": "2.5", "SM_SEMIF_MODEL_RELEASE_DATE": "2025-01-31"})
    assert (s.host, s.port, s.api_key, s.model_aliases, s.max_body, s.max_decoded, s.policy_paths) == \
        ("0.0.0.0", 9000, "k", ("a", "b"), 1024, 2048, "p.json")
    assert (s.request_timeout, s.model_release_date) == (2.5, "2025-01-31")


def test_an_explicit_mapping_is_the_only_source(monkeypatch):
    monkeypatch.setenv("SM_SEMIF_MAX_ROWS", "7")
    monkeypatch.setenv("SM_SEMIF_DECISION_LOG", "stdout")
    assert AdapterSettings.from_env().max_rows == 7 and AdapterSettings().max_rows == 7  # os.environ by default
    assert AdapterSettings.from_env({}).max_rows == 256
    assert AdapterSettings.from_env({"SM_SEMIF_MAX_QUEUE": "3"}).max_rows == 256
    assert DecisionLogSettings.from_env({}).destination is None
    assert DecisionLogSettings.from_env().destination == "stdout"


def test_empty_is_the_default_but_empty_aliases_are_none():
    s = AdapterSettings.from_env({"SM_SEMIF_HOST": "", "SAGEMAKER_BIND_TO_PORT": "", "SM_SEMIF_MAX_QUEUE": "",
                                  "SM_SEMIF_API_KEY": "", "SM_SEMIF_LOG_LEVEL": ""})
    assert (s.host, s.port, s.max_queue, s.api_key, s.log_level) == ("127.0.0.1", 8080, 16, None, "info")
    assert AdapterSettings.from_env({"SM_SEMIF_MODEL_ALIASES": ""}).model_aliases == ()


@pytest.mark.parametrize("env, message", [
    ({"SM_SEMIF_MAX_QUEUE": "x"}, "SM_SEMIF_MAX_QUEUE='x' is not a whole number"),
    ({"SM_SEMIF_MAX_ROWS": "2.5"}, "SM_SEMIF_MAX_ROWS='2.5' is not a whole number"),
    ({"SM_SEMIF_MAX_COST": "0"}, "SM_SEMIF_MAX_COST='0' must be positive"),
    ({"SM_SEMIF_BODY_TIMEOUT": "soon"}, "SM_SEMIF_BODY_TIMEOUT='soon' is not a number"),
    ({"SM_SEMIF_REQUEST_TIMEOUT": "-1"}, "SM_SEMIF_REQUEST_TIMEOUT='-1' must be positive"),
    ({"SM_SEMIF_SHUTDOWN_GRACE": "nan"}, "SM_SEMIF_SHUTDOWN_GRACE='nan' is not a finite number"),
    ({"SM_SEMIF_MODEL_RELEASE_DATE": "31/01/2025"}, "SM_SEMIF_MODEL_RELEASE_DATE='31/01/2025' is not a YYYY-MM-DD date"),
    ({"SAGEMAKER_BIND_TO_PORT": "http"}, "SAGEMAKER_BIND_TO_PORT='http' is not a whole number"),
    ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "SAGEMAKER_BIND_TO_PORT='70000' is not a port number"),
])
def test_a_bad_adapter_value_names_the_variable(env, message):
    with pytest.raises(SettingsError) as err:
        AdapterSettings.from_env(env)
    assert str(err.value).startswith(message)


def test_every_bad_value_is_named_at_once():
    with pytest.raises(SettingsError) as err:
        AdapterSettings.from_env({"SM_SEMIF_MAX_QUEUE": "x", "SM_SEMIF_MAX_ROWS": "-2"})
    assert "SM_SEMIF_MAX_QUEUE='x'" in str(err.value) and "SM_SEMIF_MAX_ROWS='-2' must be positive" in str(err.value)


def test_settings_are_immutable_and_copied_with_updates():
    s = AdapterSettings.from_env({"SM_SEMIF_MAX_ROWS": "9"})
    with pytest.raises(ValidationError, match="frozen"):  # the frozen model's own refusal, not any error
        s.port = 1  # type: ignore[misc]
    assert s.port == 8080
    t = s.model_copy(update={"port": 0, "host": "0.0.0.0"})
    assert (t.port, t.host, t.max_rows, s.port) == (0, "0.0.0.0", 9, 8080)


def test_decision_log_settings(tmp_path):
    d = DecisionLogSettings.from_env({})
    assert (d.destination, d.log_states, d.namespace) == (None, False, NAMESPACE)
    d = DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": " stdout ", "SM_SEMIF_LOG_STATES": "Yes",
                                      "SM_SEMIF_METRICS_NAMESPACE": " "})
    assert (d.destination, d.log_states, d.namespace) == ("stdout", True, NAMESPACE)
    assert DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": "off", "SM_SEMIF_LOG_STATES": "0"}).destination is None
    path = str(tmp_path / "d.jsonl")
    assert DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": path}).destination == path
    with pytest.raises(SettingsError, match=r"^SM_SEMIF_LOG_STATES='maybe' is not 1/0"):
        DecisionLogSettings.from_env({"SM_SEMIF_LOG_STATES": "maybe"})
    with pytest.raises(SettingsError, match=r"SM_SEMIF_DECISION_LOG=.* folder that does not exist .*create it"):
        DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": str(tmp_path / "nope" / "d.jsonl")})


def test_serve_refuses_a_bad_variable_before_loading_a_model():
    env = {**__import__("os").environ, "SM_SEMIF_MAX_QUEUE": "many", "SAGEMAKER_BIND_TO_PORT": "abc"}
    proc = subprocess.run([sys.executable, "-m", "adapter", "serve", "--port", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "SM_SEMIF_MAX_QUEUE='many' is not a whole number" in proc.stderr
    assert "SAGEMAKER_BIND_TO_PORT='abc' is not a whole number" in proc.stderr


def test_deploy_patterns_check_the_whole_value():
    import re

    from deploy.config import (BUCKET_PATTERN, BUCKET_RE, DEFAULT_CPU_INSTANCE, INSTANCE_RE, NAME_RE, REGION_RE,
                               ROLE_RE, SAGEMAKER_NAME_PATTERN, FormErrors, config_from_form)

    assert NAME_RE.match("semif-gpu-1") and not NAME_RE.match("semif-gpu-1\n") and not NAME_RE.match("-x")
    assert BUCKET_RE.match("my-models") and not BUCKET_RE.match("my-models\n") and not BUCKET_RE.match("My_Models")
    assert REGION_RE.match("eu-west-1") and not REGION_RE.match("eu-west-1 ") and INSTANCE_RE.match(DEFAULT_CPU_INSTANCE)
    assert ROLE_RE.match("arn:aws:iam::123456789012:role/sm") and not ROLE_RE.match("arn:aws:iam::1:role/sm")
    assert re.fullmatch(SAGEMAKER_NAME_PATTERN, "a" * 63) and not re.fullmatch(SAGEMAKER_NAME_PATTERN, "a" * 64)
    assert re.fullmatch(BUCKET_PATTERN, "abc") and not re.fullmatch(BUCKET_PATTERN, "ab")
    from deploy.plan import Step
    from deploy.validate import rule_errors

    assert rule_errors(Step("sagemaker", "DescribeTransformJob", {"TransformJobName": "tf-1\n"}, "wait"))
    assert not rule_errors(Step("sagemaker", "DescribeTransformJob", {"TransformJobName": "tf-1"}, "wait"))
    form = {"region": "us-east-1", "bucket": "my-models", "role_arn": "arn:aws:iam::123456789012:role/sm",
            "serving": "textgen"}
    assert config_from_form(form).instance_type == DEFAULT_CPU_INSTANCE
    with pytest.raises(FormErrors) as err:
        config_from_form({**form, "bucket": "My_Models"})
    assert set(err.value.errors) == {"bucket"}


def test_readouts_corrections_and_guards_are_what_requests_accept_and_what_every_form_offers():
    """Each list is spelled once (its Literal); checked against the values written out here: a request
    accepts each of them and nothing else, and the commands and the service layer (the pages' forms)
    offer exactly them."""
    import argparse

    from adapter.guard import GUARDS
    from adapter.schema import DEBIAS, READOUTS, DecisionRequest
    from app.cli import calibrate, check, robustness
    from app.service import checks, decide, policies
    from tests.conftest import routing_row

    expected = {"readout": ("letters", "option-words"), "debias": ("none", "content-free"),
                "guard": ("none", "precheck", "erase-and-check")}
    assert (READOUTS, DEBIAS, GUARDS) == tuple(expected.values())
    for field, values in expected.items():
        for value in values:
            assert getattr(DecisionRequest.model_validate(routing_row("s", **{field: value})), field) == value
        with pytest.raises(ValidationError, match=field):
            DecisionRequest.model_validate(routing_row("s", **{field: "words"}))
    assert (policies.READOUTS, policies.DEBIAS, policies.GUARDS) == tuple(expected.values())
    assert (decide.READOUT_CHOICES, decide.DEBIAS_CHOICES, checks.GUARDS) == tuple(expected.values())
    sub = argparse.ArgumentParser().add_subparsers()
    for command in (calibrate, check, robustness):
        command.add_parser(sub)
    offered = {(name, a.dest): tuple(a.choices) for name, p in sub.choices.items() for a in p._actions
               if a.choices and a.dest in expected}
    assert offered == {("calibrate", "readout"): expected["readout"], ("calibrate", "debias"): expected["debias"],
                       ("calibrate", "guard"): expected["guard"],
                       ("check", "readout"): expected["readout"], ("check", "debias"): expected["debias"],
                       ("robustness", "guard"): expected["guard"]}, offered


def test_deploy_settings(monkeypatch):
    from deploy.settings import DeploySettings

    monkeypatch.setenv("SEMIF_SAGEMAKER_ROLE_ARN", "arn:aws:iam::123456789012:role/from-os")
    d = DeploySettings.from_env({})
    assert (d.region, d.aws_endpoint_url, d.deploy_bucket, d.sagemaker_role_arn, d.codebuild_role_arn, d.audit_log) == \
        ("us-east-1", None, "", "", "", "var/deploy-audit.jsonl")  # no made-up bucket or role
    d = DeploySettings.from_env({"AWS_DEFAULT_REGION": "eu-west-1", "SEMIF_AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
                                 "SEMIF_DEPLOY_BUCKET": "b-1", "SEMIF_CODEBUILD_ROLE_ARN": "cb",
                                 "SEMIF_DEPLOY_AUDIT_LOG": "/tmp/a.jsonl", "AWS_DEFAULT_REGION_X": "ignored"})
    assert (d.region, d.aws_endpoint_url, d.deploy_bucket, d.codebuild_role_arn, d.audit_log) == \
        ("eu-west-1", "http://127.0.0.1:5000", "b-1", "cb", "/tmp/a.jsonl")
    assert DeploySettings.from_env().sagemaker_role_arn.endswith("/from-os")


def test_workbench_settings(monkeypatch, tmp_path):
    from app.settings import DEFAULT_DB, WorkbenchSettings

    monkeypatch.setenv("SEMIF_PORT", "9999")
    w = WorkbenchSettings.from_env({})
    assert (w.db, w.host, w.port, w.max_loaded_models, w.aws_endpoint_url, w.aws_runtime_url, w.deploy_poll) == \
        (DEFAULT_DB, "127.0.0.1", 8501, 2, None, None, 15.0)  # the mapping only: SEMIF_PORT from os.environ unseen
    assert (w.region, w.deploy_bucket, w.sagemaker_role_arn, w.codebuild_role_arn) == ("us-east-1", "", "", "")
    assert WorkbenchSettings.from_env().port == 9999
    w = WorkbenchSettings.from_env({"SEMIF_DB": str(tmp_path / "w.db"), "SEMIF_HOST": "0.0.0.0", "SEMIF_PORT": "8600",
                                    "SEMIF_MAX_LOADED_MODELS": "3", "SEMIF_AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
                                    "SEMIF_DEPLOY_POLL": "0.5", "AWS_DEFAULT_REGION": "eu-west-1",
                                    "SEMIF_DEPLOY_BUCKET": "b-1", "SEMIF_SAGEMAKER_ROLE_ARN": "sm",
                                    "SEMIF_CODEBUILD_ROLE_ARN": "cb"})
    assert (w.db, w.host, w.port, w.max_loaded_models, w.deploy_poll) == (tmp_path / "w.db", "0.0.0.0", 8600, 3, 0.5)
    assert w.aws_runtime_url == w.aws_endpoint_url == "http://127.0.0.1:5000"  # the runtime defaults to the endpoint
    assert (w.region, w.deploy_bucket, w.sagemaker_role_arn, w.codebuild_role_arn) == ("eu-west-1", "b-1", "sm", "cb")
    w = WorkbenchSettings.from_env({"SEMIF_AWS_ENDPOINT_URL": "http://e", "SEMIF_AWS_RUNTIME_URL": "http://r"})
    assert (w.aws_endpoint_url, w.aws_runtime_url) == ("http://e", "http://r")


@pytest.mark.parametrize("env, message", [
    ({"SEMIF_PORT": "abc"}, "SEMIF_PORT='abc' is not a whole number"),
    ({"SEMIF_PORT": "123456"}, "SEMIF_PORT='123456' is not a port number"),
    ({"SEMIF_MAX_LOADED_MODELS": "0"}, "SEMIF_MAX_LOADED_MODELS='0' must be positive"),
    ({"SEMIF_MAX_LOADED_MODELS": "two"}, "SEMIF_MAX_LOADED_MODELS='two' is not a whole number"),
    ({"SEMIF_DEPLOY_POLL": "often"}, "SEMIF_DEPLOY_POLL='often' is not a number"),
])
def test_a_bad_workbench_value_names_the_variable(env, message):
    from app.settings import WorkbenchSettings

    with pytest.raises(SettingsError) as err:
        WorkbenchSettings.from_env(env)
    assert str(err.value).startswith(message)
