"""Prices: one deployment, one price - Compare and Deploy price a GPU pool on its first choice."""
from __future__ import annotations

import math

import pandas as pd

from app.core import costs
from app.core.deploy_records import record_planned
from app.core.store import Store
from deploy.config import DeployConfig
from deploy.pricing import HOURLY_USD, cost_per_1000, first_choice


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
