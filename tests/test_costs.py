"""Prices: one deployment, one price - Compare and Deploy price a GPU pool on its first choice."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from app.core import costs
from app.core.deploy_records import record_planned
from app.core.store import Store
from deploy.config import DeployConfig
from deploy.pricing import HOURLY_USD, cost_per_1000, first_choice, usd_per_1000


def test_a_gpu_pool_is_priced_on_its_first_choice_in_compare_and_deploy(tmp_path):
    store = Store(tmp_path / "wb.db")
    pools = [("ml.g4dn.xlarge", 1), ("ml.g6e.xlarge", 2)]  # the first choice is not the dearest
    cfg = DeployConfig(region="us-east-1", bucket="b", role_arn="arn:aws:iam::123456789012:role/r", serving="semif",
                       compute="gpu", pools=pools, deployment_id="semif-gpu-test")
    record_planned(store, cfg, [])
    target = {"name": "ep", "kind": "sagemaker", "config": {"endpoint_name": cfg.endpoint_name}}
    price, what = costs.instance_price(target, store)
    deploy_type = first_choice(cfg.compute, cfg.instance_type, cfg.pools)
    assert deploy_type == "ml.g4dn.xlarge" and price == HOURLY_USD[deploy_type] and "first choice" in what
    # the same $ per 1,000 decisions on both pages for the same throughput
    stats = pd.DataFrame([{"target": "ep", "p50_ms": 500.0}])
    compare = costs.with_costs(stats, {"ep": target}, store)["usd_per_1000"][0]
    deploy, _ = cost_per_1000(deploy_type, 1000 / 500.0)
    assert math.isclose(compare, deploy)


def test_local_targets_have_throughput_but_no_price():
    out = costs.with_costs(pd.DataFrame([{"target": "local", "p50_ms": 250.0}]), {"local": {"kind": "local"}})
    assert out["decisions_per_s"][0] == 4.0 and math.isnan(out["usd_per_1000"][0])
    assert "no price" in out["cost_note"][0]


# -- instance_price: where a target's hourly price comes from ----------------------------------------
def _deploy(store: Store, **kw) -> dict:
    """A deployment recorded as the Deploy page records a plan; the target the endpoint becomes."""
    cfg = DeployConfig(region="us-east-1", bucket="b", role_arn="arn:aws:iam::123456789012:role/r", serving="semif",
                       **kw)
    record_planned(store, cfg, [])
    return {"name": cfg.endpoint_name, "kind": "sagemaker",
            "config": {"endpoint_name": cfg.endpoint_name, "region": "us-east-1"}}


def test_a_targets_own_hourly_price_comes_first_whatever_its_kind(tmp_path):
    store = Store(tmp_path / "wb.db")
    assert costs.instance_price({"kind": "semif", "config": {"url": "http://h", "hourly_usd": 0.5}}, None) == \
        (0.5, "the target's own hourly price")
    assert costs.instance_price({"kind": "chat", "config": {"hourly_usd": "1.25"}}, None) == \
        (1.25, "the target's own hourly price")  # a number typed as text is read as one
    # set on a SageMaker target it wins over the deployment's instance type
    target = _deploy(store, compute="cpu", instance_type="ml.m5.xlarge", deployment_id="semif-cpu-own")
    target["config"]["hourly_usd"] = 3.0
    assert costs.instance_price(target, store) == (3.0, "the target's own hourly price")


def test_a_gpu_pool_is_priced_on_priority_1_not_the_first_listed_nor_the_dearest(tmp_path):
    store = Store(tmp_path / "wb.db")
    pools = [("ml.g6e.xlarge", 2), ("ml.g5.xlarge", 1), ("ml.g4dn.xlarge", 3)]  # dearest listed first, priority 2
    target = _deploy(store, compute="gpu", pools=pools, deployment_id="semif-gpu-prio")
    assert costs.instance_price(target, store) == (1.41, "ml.g5.xlarge (its GPU pool's first choice)")
    assert HOURLY_USD["ml.g5.xlarge"] == 1.41 < HOURLY_USD["ml.g6e.xlarge"]  # the table this test reads


def test_a_cpu_deployment_is_priced_on_its_instance_type(tmp_path):
    store = Store(tmp_path / "wb.db")
    target = _deploy(store, compute="cpu", instance_type="ml.m5.xlarge", deployment_id="semif-cpu-m5")
    assert costs.instance_price(target, store) == (0.23, "ml.m5.xlarge")
    # an endpoint not deployed from here, with its type written on the target
    own = {"kind": "sagemaker", "config": {"endpoint_name": "elsewhere", "instance_type": "ml.c7i.2xlarge"}}
    assert costs.instance_price(own, store) == (0.43, "ml.c7i.2xlarge")


def test_unknown_prices_are_none(tmp_path):
    store = Store(tmp_path / "wb.db")
    assert costs.instance_price({"kind": "sagemaker", "config": {"endpoint_name": "nobody-deployed-it"}}, store) == \
        (None, "")
    assert costs.instance_price({"kind": "sagemaker", "config": {"endpoint_name": "x"}}, None) == (None, "")
    assert costs.instance_price({"kind": "semif", "config": {"url": "http://h"}}, store) == (None, "")
    assert costs.instance_price({}, store) == (None, "")
    target = _deploy(store, compute="cpu", instance_type="ml.c99.xlarge", deployment_id="semif-cpu-odd")
    assert costs.instance_price(target, store) == (None, "")  # a type the price table does not know


def test_a_gpu_pool_whose_first_choice_has_no_price_is_unknown_not_the_cpu_default(tmp_path):
    store = Store(tmp_path / "wb.db")
    pools = [("ml.p4d.24xlarge", 1), ("ml.g5.xlarge", 2)]
    target = _deploy(store, compute="gpu", pools=pools, deployment_id="semif-gpu-p4d")
    assert cost_per_1000("ml.p4d.24xlarge", 2.0)[0] is None  # what the Deploy page says
    assert costs.instance_price(target, store) == (None, "")


# -- with_costs: decisions/s and $ per 1,000 decisions per row -----------------------------------------
def test_with_costs_local_priced_and_unknown_rows():
    stats = pd.DataFrame([{"target": "local", "p50_ms": 125.0, "rows": 3},
                          {"target": "priced", "p50_ms": 200.0, "rows": 5},
                          {"target": "mystery", "p50_ms": 400.0, "rows": 7},
                          {"target": "never-answered", "p50_ms": float("nan"), "rows": 0}])
    targets = {"local": {"kind": "local", "config": {"hourly_usd": 9.0}},  # local: never priced, even when set
               "priced": {"kind": "semif", "config": {"url": "http://h", "hourly_usd": 0.72}},
               "mystery": {"kind": "semif", "config": {"url": "http://m"}},
               "never-answered": {"kind": "semif", "config": {"hourly_usd": 0.72}}}
    out = costs.with_costs(stats, targets)
    assert list(out["target"]) == list(stats["target"]) and list(out["rows"]) == [3, 5, 7, 0]  # the input kept
    assert "decisions_per_s" not in stats  # and not changed
    # 1000 ms / p50: 8, 5, 2.5 decisions/s
    assert out["decisions_per_s"][:3].tolist() == [8.0, 5.0, 2.5] and math.isnan(out["decisions_per_s"][3])
    assert math.isnan(out["usd_per_1000"][0])
    assert out["cost_note"][0] == "local: 8.00 decisions/s on this machine, one at a time; no price"
    # $0.72/h / 3600 s = $0.0002/s; at 5 decisions/s -> $0.00004 per decision -> $0.04 per 1,000
    assert out["usd_per_1000"][1] == pytest.approx(0.04)
    assert out["cost_note"][1] == "$0.72/h for the target's own hourly price / (5.00 decisions/s at warm p50, one call at a time)"
    assert math.isnan(out["usd_per_1000"][2]) and out["cost_note"][2].startswith("price unknown")
    assert math.isnan(out["usd_per_1000"][3]) and out["cost_note"][3].startswith("price unknown")  # no latency, no rate


def test_with_costs_prices_a_deployed_endpoint_from_the_store(tmp_path):
    store = Store(tmp_path / "wb.db")
    target = _deploy(store, compute="cpu", instance_type="ml.c7i.xlarge", deployment_id="semif-cpu-c7i")
    out = costs.with_costs(pd.DataFrame([{"target": target["name"], "p50_ms": 50.0}]), {target["name"]: target}, store)
    # $0.21/h at 20 decisions/s: 0.21 / 3600 / 20 * 1000 = 0.0029166...
    assert out["usd_per_1000"][0] == pytest.approx(0.21 / 72) and "ml.c7i.xlarge" in out["cost_note"][0]


def test_one_rule_for_usd_per_1000_decisions():
    """Compare's $/1,000 (a target's own price) and Deploy's (the price table) are one function."""
    assert costs.usd_per_1000 is usd_per_1000  # Compare prices with the function Deploy prices with, not a copy
    assert usd_per_1000(0.36, 1.0) == pytest.approx(0.1)  # $0.36/h, one a second: 3,600 an hour -> $0.10
    assert usd_per_1000(0.72, 5.0) == pytest.approx(0.04)  # 18,000 an hour
    assert usd_per_1000(1.41, 8.0, concurrency=2) == pytest.approx(1.41 / 57.6)  # 57,600 an hour
