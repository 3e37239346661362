"""Every environment variable the workbench reads, in one place with its default (the adapter's
are in adapter/settings.py; model discovery's in adapter/models.py). `from_env()` is called where a
page or a CLI starts, so tests and users can point one process at another database or AWS endpoint."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

DEFAULT_DB = Path(__file__).resolve().parents[2] / "data" / "workbench.db"


@dataclass(frozen=True)
class WorkbenchSettings:
    db: Path = DEFAULT_DB  # SEMIF_DB
    host: str = "127.0.0.1"  # SEMIF_HOST: `python -m app run`
    port: int = 8501  # SEMIF_PORT
    max_loaded_models: int = 2  # SEMIF_MAX_LOADED_MODELS: local models kept in memory
    aws_endpoint_url: str | None = None  # SEMIF_AWS_ENDPOINT_URL: another AWS endpoint (tests: moto)
    aws_runtime_url: str | None = None  # SEMIF_AWS_RUNTIME_URL: sagemaker-runtime (tests: a local shim)
    deploy_poll: float = 15.0  # SEMIF_DEPLOY_POLL: seconds between status polls
    region: str = "us-east-1"  # AWS_DEFAULT_REGION
    deploy_bucket: str = ""  # SEMIF_DEPLOY_BUCKET
    sagemaker_role_arn: str = ""  # SEMIF_SAGEMAKER_ROLE_ARN
    codebuild_role_arn: str = ""  # SEMIF_CODEBUILD_ROLE_ARN

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WorkbenchSettings":
        env = os.environ if env is None else env
        loaded = env.get("SEMIF_MAX_LOADED_MODELS", "")
        return cls(db=Path(env.get("SEMIF_DB") or DEFAULT_DB), host=env.get("SEMIF_HOST") or cls.host,
                   port=int(env.get("SEMIF_PORT") or cls.port),
                   max_loaded_models=int(loaded) if loaded.isdigit() and int(loaded) > 0 else cls.max_loaded_models,
                   aws_endpoint_url=env.get("SEMIF_AWS_ENDPOINT_URL") or None,
                   aws_runtime_url=env.get("SEMIF_AWS_RUNTIME_URL") or env.get("SEMIF_AWS_ENDPOINT_URL") or None,
                   deploy_poll=float(env.get("SEMIF_DEPLOY_POLL") or cls.deploy_poll),
                   region=env.get("AWS_DEFAULT_REGION") or cls.region, deploy_bucket=env.get("SEMIF_DEPLOY_BUCKET", ""),
                   sagemaker_role_arn=env.get("SEMIF_SAGEMAKER_ROLE_ARN", ""),
                   codebuild_role_arn=env.get("SEMIF_CODEBUILD_ROLE_ARN", ""))
