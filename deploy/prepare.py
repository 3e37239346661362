"""Package, then plan, then validate - the one path from a DeployConfig to the steps a person is
shown and the executor runs (the CLI and the workbench's Deploy page both call it). The model is
packaged first, so the plan carries the real sha256 and image tag. Calls no AWS API."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import DeployConfig
from .package import build_package
from .plan import Package, Step, deployment_plan
from .validate import validate_plan


@dataclass
class Prepared:
    pkg: Package
    steps: list[Step]
    errors: list[str]  # botocore's ParamValidator and our own rules; empty when the plan may run


def prepare(cfg: DeployConfig, work_dir: Path, *, unfilled: bool = False) -> Prepared:
    """ValueError / FileNotFoundError when the model cannot be packaged (the message says why).
    `unfilled`: the plan is only printed, and may keep the bucket and role placeholders."""
    pkg = build_package(cfg, work_dir)
    steps = deployment_plan(cfg, pkg)
    return Prepared(pkg, steps, validate_plan(steps, cfg.region, allow_account_placeholder=True,
                                              allow_form_placeholders=unfilled))


def revalidate(cfg: DeployConfig, pkg: Package) -> Prepared:
    """The same plan rebuilt from a kept package (a page rerun): no packaging again."""
    steps = deployment_plan(cfg, pkg)
    return Prepared(pkg, steps, validate_plan(steps, cfg.region, allow_account_placeholder=True))
