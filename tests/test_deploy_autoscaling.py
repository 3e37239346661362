"""Issue 12, real-time side: autoscaling is part of the plan (validated against the
application-autoscaling service model), applied after InService, removed before the endpoint;
and the cost per 1,000 decisions, checked against numbers worked out by hand."""
from __future__ import annotations

import json
import subprocess
import sys

import boto3
import pytest

from deploy import pricing
from deploy.autoscaling import decisions_per_second, resource_id, target_invocations_per_minute
from deploy.config import Autoscaling, DeployConfig
from deploy.executor import Executor
from deploy.package import build_package
from deploy.plan import deployment_plan, teardown_plan
from deploy.validate import botocore_errors, validate_plan
from tests.conftest import ROOT

REGION = "us-east-1"
BUCKET = "semif-test-models"


def cfg(**kw) -> DeployConfig:
    base = dict(region=REGION, bucket=BUCKET, role_arn="arn:aws:iam::123456789012:role/sm", serving="textgen",
                instance_type="ml.c5.xlarge", name_suffix="as1")
    return DeployConfig(**{**base, **kw})


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + b"\1" * 2048)
    return path


def test_target_value_from_throughput_by_hand():
    assert target_invocations_per_minute(0.5, 0.7) == 21.0  # 0.5/s x 60 s x 0.7
    assert target_invocations_per_minute(8, 0.5) == 240.0
    with pytest.raises(ValueError):
        target_invocations_per_minute(0, 0.7)
    assert decisions_per_second(cfg(instance_type="ml.c7i.xlarge", autoscaling=Autoscaling())) == 0.5  # family default
    assert decisions_per_second(cfg(autoscaling=Autoscaling(decisions_per_second=3.0))) == 3.0  # a measurement wins
    gpu = cfg(compute="gpu", pools=[("ml.g6e.xlarge", 1), ("ml.g4dn.xlarge", 2)], autoscaling=Autoscaling())
    assert decisions_per_second(gpu) == 4.0  # the pool may land on its slowest type
    assert decisions_per_second(cfg(instance_type="ml.r5.xlarge", autoscaling=Autoscaling())) is None


def test_autoscaling_is_in_the_plan_after_in_service_and_validates(tiny_gguf, tmp_path):
    c = cfg(instance_count=2, autoscaling=Autoscaling(min_instances=1, max_instances=4, decisions_per_second=2.0,
                                                      utilisation=0.5, scale_in_cooldown=600, scale_out_cooldown=30))
    steps = deployment_plan(c, build_package(c, tmp_path, gguf=tiny_gguf))
    ops = [s.operation for s in steps]
    assert ops[-3:] == ["DescribeEndpoint", "RegisterScalableTarget", "PutScalingPolicy"]
    assert steps[-3].action == "wait-endpoint" and validate_plan(steps, REGION) == []
    reg, pol = steps[-2].params, steps[-1].params
    assert reg == {"ServiceNamespace": "sagemaker", "ResourceId": "endpoint/textgen-cpu-as1/variant/AllTraffic",
                   "ScalableDimension": "sagemaker:variant:DesiredInstanceCount", "MinCapacity": 1, "MaxCapacity": 4}
    tt = pol["TargetTrackingScalingPolicyConfiguration"]
    assert tt == {"TargetValue": 60.0,  # 2/s x 60 x 0.5
                  "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
                  "ScaleInCooldown": 600, "ScaleOutCooldown": 30}
    assert "60/min" in steps[-1].description
    bad = steps[-2].__class__(**{**steps[-2].to_dict(), "params": {**reg, "MinCapacity": "one"}})
    assert any("MinCapacity" in e for e in botocore_errors(bad))  # the real application-autoscaling model
    bad.params["MinCapacity"] = 5
    assert any("MinCapacity <= MaxCapacity" in e for e in validate_plan([bad], REGION))
    ops = [s.operation for s in teardown_plan("ep", "ep-config", "ep-model", autoscaling=True)]
    assert ops[:3] == ["DeleteScalingPolicy", "DeregisterScalableTarget", "DeleteEndpoint"]
    assert validate_plan(teardown_plan("ep", "ep-config", "ep-model", autoscaling=True), REGION) == []
    assert deployment_plan(cfg(), build_package(cfg(), tmp_path, gguf=tiny_gguf))[-1].operation == "DescribeEndpoint"


def test_apply_registers_scaling_and_destroy_removes_it_against_moto(aws_env, tiny_gguf, tmp_path):
    c = cfg(name_suffix="as2", autoscaling=Autoscaling(min_instances=1, max_instances=3))
    events: list[dict] = []
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.01, on_event=events.append)
    out = ex.apply(c, pkg=build_package(c, tmp_path, gguf=tiny_gguf))
    results = [(s["operation"], s["result"]) for s in out["steps"]]
    assert results[-3:] == [("DescribeEndpoint", "InService"), ("RegisterScalableTarget", "done"),
                            ("PutScalingPolicy", "done")]
    aas = boto3.client("application-autoscaling", region_name=REGION, endpoint_url=aws_env)
    rid = resource_id(c.endpoint_name)
    (policy,) = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid)["ScalingPolicies"]
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 16.8  # c5 default 0.4/s x 60 x 0.7
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[rid])["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 3)
    assert ex.is_autoscaled(c.endpoint_name)
    again = ex.apply(c, pkg=build_package(c, tmp_path, gguf=tiny_gguf))  # idempotent: upserts, no duplicates
    assert len(aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid)["ScalingPolicies"]) == 1
    assert again["status"]["status"] == "InService"
    done = ex.destroy(c.endpoint_name, c.endpoint_config_name, c.model_name)  # asks AAS whether to remove scaling
    assert [d["operation"] for d in done][:3] == ["DeleteScalingPolicy", "DeregisterScalableTarget", "DeleteEndpoint"]
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=rid)["ScalingPolicies"] == []
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[rid])["ScalableTargets"] == []
    assert ex.status(c.endpoint_name)["status"] == "NotFound"
    gone = ex.destroy(c.endpoint_name, c.endpoint_config_name, c.model_name, autoscaling=True)  # twice: all gone
    assert {d["result"] for d in gone} <= {"already gone", "deleted"}


def test_cli_plan_shows_autoscaling(tiny_gguf, tmp_path):
    out = subprocess.run([sys.executable, "-m", "deploy", "plan", "--serving", "textgen", "--bucket", BUCKET,
                          "--suffix", "as3", "--model", str(tiny_gguf), "--work-dir", str(tmp_path),
                          "--autoscale-max", "5", "--decisions-per-second", "1.5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    calls = json.loads(out.stdout)["calls"]
    assert [c["call"] for c in calls][-2:] == ["application-autoscaling.RegisterScalableTarget",
                                               "application-autoscaling.PutScalingPolicy"]
    assert calls[-1]["params"]["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 63.0  # 1.5 x 60 x 0.7


# -- cost per 1,000 decisions ------------------------------------------------------------------------------------
def test_cost_per_1000_by_hand():
    usd, note = pricing.cost_per_1000("ml.c7i.xlarge", 0.5)
    assert usd == pytest.approx(0.21 / 1800 * 1000) == pytest.approx(0.116667, abs=1e-6)  # 0.5/s = 1,800/h
    assert "fully busy" in note and pricing.PRICES_SOURCE in note
    usd, _ = pricing.cost_per_1000("ml.g5.xlarge", 8, concurrency=2)
    assert usd == pytest.approx(1.41 / 57_600 * 1000) == pytest.approx(0.024479, abs=1e-6)  # 16/s = 57,600/h
    assert pricing.cost_per_1000("ml.g4dn.xlarge", 1)[0] == pytest.approx(0.74 / 3.6)  # 3,600/h: $0.2056
    assert pricing.cost_per_1000("ml.x9.huge", 1)[0] is None and "no price" in pricing.cost_per_1000("ml.x9.huge", 1)[1]
    assert pricing.cost_per_1000("ml.c5.xlarge", 0)[0] is None
    assert pricing.PRICES_SOURCE.startswith("https://aws.amazon.com/sagemaker/pricing") and pricing.PRICES_AS_OF
