"""Every environment variable the workbench reads, in one place with its default (the adapter's
are in adapter/server/settings.py, their shared base in adapter/env_settings.py, deploy's in
deploy/settings.py - the AWS ones are shared from there; model discovery's in adapter/engine/models.py). `from_env()` is called where a page or a CLI starts, so
tests and users can point one process at another database or AWS endpoint; `from_env(mapping)`
reads only that mapping. A bad value (SEMIF_PORT=abc) is a SettingsError naming the variable."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from adapter.env_settings import Port, PositiveFloat, PositiveInt
from deploy.settings import AwsSettings

DEFAULT_DB = Path(__file__).resolve().parents[1] / "data" / "workbench.db"


def _one_or_zero(raw: Any) -> Any:
    if isinstance(raw, str):
        if raw.strip() not in ("0", "1"):
            raise PydanticCustomError("flag", "is not 1 or 0")
        return raw.strip() == "1"
    return raw


MLFLOW_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")
EMBEDDED_TRACKER = "embedded"  # sqlite:///<the workbench DB's folder>/mlflow.db


def _tracking_uri(raw: Any) -> Any:
    """SEMIF_MLFLOW_TRACKING_URI: empty (off), `embedded`, an MLflow tracking URI or a SageMaker MLflow ARN."""
    if not isinstance(raw, str) or not raw.strip():
        return None if isinstance(raw, str) else raw
    text = raw.strip()
    if text == EMBEDDED_TRACKER or text.startswith("arn:aws:sagemaker:") or (
            text.partition(":")[0].partition("+")[0] in MLFLOW_SCHEMES and ":" in text):
        return text
    raise PydanticCustomError("mlflow_uri", "is not an MLflow tracking URI: give `embedded` (sqlite beside the "
                              "workbench DB), sqlite:///path/mlflow.db, http(s)://host:port, a database URI, or a "
                              "SageMaker MLflow tracking server ARN (arn:aws:sagemaker:...); leave it empty for off")


class WorkbenchSettings(AwsSettings):
    # region (AWS_DEFAULT_REGION), aws_endpoint_url (SEMIF_AWS_ENDPOINT_URL: another AWS, tests: moto),
    # deploy_bucket, sagemaker_role_arn, codebuild_role_arn (SEMIF_DEPLOY_BUCKET, SEMIF_SAGEMAKER_ROLE_ARN,
    # SEMIF_CODEBUILD_ROLE_ARN: the Deploy page's defaults) come from AwsSettings
    db: Path = Field(DEFAULT_DB, validation_alias="SEMIF_DB")
    host: str = Field("127.0.0.1", validation_alias="SEMIF_HOST")  # `python -m app run`
    port: Port = Field(8501, validation_alias="SEMIF_PORT")
    max_loaded_models: PositiveInt = Field(2, validation_alias="SEMIF_MAX_LOADED_MODELS")  # local models in memory
    # sagemaker-runtime (tests: a local shim); default: SEMIF_AWS_ENDPOINT_URL
    aws_runtime_url: str | None = Field(None, validation_alias="SEMIF_AWS_RUNTIME_URL")
    deploy_poll: PositiveFloat = Field(15.0, validation_alias="SEMIF_DEPLOY_POLL")  # seconds between status polls
    # URL targets at link-local / cloud metadata addresses (app/targets/addresses.py): refused unless 1
    allow_link_local_targets: Annotated[bool, BeforeValidator(_one_or_zero)] = Field(
        False, validation_alias="SEMIF_ALLOW_LINK_LOCAL_TARGETS")
    # MLflow tracking and the policy registry (app/core/tracking.py): off unless set; nothing imports mlflow then
    mlflow_tracking_uri: Annotated[str | None, BeforeValidator(_tracking_uri)] = Field(
        None, validation_alias="SEMIF_MLFLOW_TRACKING_URI")

    @model_validator(mode="before")
    @classmethod
    def _runtime_defaults_to_the_endpoint(cls, data: Any) -> Any:
        if isinstance(data, dict):
            runtime = data.get("SEMIF_AWS_RUNTIME_URL") or data.get("aws_runtime_url")
            endpoint = data.get("SEMIF_AWS_ENDPOINT_URL") or data.get("aws_endpoint_url")
            if not runtime and endpoint:
                data = {**data, "SEMIF_AWS_RUNTIME_URL": endpoint}
        return data
