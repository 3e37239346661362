"""The environment deploy/ reads, in one place (pydantic-settings, on the same base as the adapter's:
exact variable names, an empty variable is the default, `from_env(mapping)` reads only that mapping).

`AwsSettings` is what the Deploy page and `python -m deploy` share: where AWS calls go and the
defaults of the deployment form. The bucket and the role ARNs have no default: a made-up one fails
late in AWS (or, for a bucket, uploads into someone else's), so `apply` refuses to start without
them (deploy/cli.py)."""
from __future__ import annotations

from pydantic import Field

from adapter.env_settings import EnvSettings

DEFAULT_REGION = "us-east-1"
DEFAULT_AUDIT_LOG = "var/deploy-audit.jsonl"


class AwsSettings(EnvSettings):
    region: str = Field(DEFAULT_REGION, validation_alias="AWS_DEFAULT_REGION")
    aws_endpoint_url: str | None = Field(None, validation_alias="SEMIF_AWS_ENDPOINT_URL")  # another AWS (tests: moto)
    deploy_bucket: str = Field("", validation_alias="SEMIF_DEPLOY_BUCKET")  # where model.tar.gz goes
    sagemaker_role_arn: str = Field("", validation_alias="SEMIF_SAGEMAKER_ROLE_ARN")  # the endpoint's execution role
    codebuild_role_arn: str = Field("", validation_alias="SEMIF_CODEBUILD_ROLE_ARN")  # builds the SemIf image


class DeploySettings(AwsSettings):
    audit_log: str = Field(DEFAULT_AUDIT_LOG, validation_alias="SEMIF_DEPLOY_AUDIT_LOG")  # python -m deploy's ledger
