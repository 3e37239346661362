"""Plans: the ordered AWS API calls of a deployment, as data. Pure functions - nothing here talks
to AWS - so a plan can be printed, validated offline against botocore's service model, reviewed,
recorded, and then executed exactly as shown (deploy/executor.py runs these steps, no others).

A plan is built from a finished Package (deploy/package.py): the tarball's sha256 and the image
tag are real values before anyone confirms. The only values filled in at apply time are the AWS
account id (`<account-id>`, from STS, when not given; see bind_account) and the CodeBuild build id."""
from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from .autoscaling import DIMENSION, METRIC, decisions_per_second, policy_name, resource_id, target_invocations_per_minute
from .config import ACCOUNT_PLACEHOLDER, DeployConfig

# call: one API call as written | upload: a streamed S3 put of a local file (skipped when the same
# sha256 is there) | wait-*: poll the named Describe call until a terminal state | read-output: GetObject
# of a transform result
Action = Literal["call", "upload", "wait-build", "wait-endpoint", "wait-deleted", "wait-transform", "read-output"]
BUILD_ID = "<build id>"  # StartBuild's answer, used by the wait-build step
RUNTIME_PLACEHOLDERS = {BUILD_ID}


@dataclass
class Step:
    service: str  # botocore service name, e.g. sagemaker, application-autoscaling
    operation: str  # botocore operation name, e.g. CreateEndpointConfig
    params: dict[str, Any]
    description: str
    action: Action = "call"
    extra: dict[str, Any] = field(default_factory=dict)  # executor hints (local file, image tag), not sent

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Step:
        return cls(**{k: d[k] for k in ("service", "operation", "params", "description", "action", "extra") if k in d})


@dataclass(frozen=True)
class Package:
    """What packaging produced: the local files, their checksums and their S3 keys."""
    key: str
    sha256: str
    model_file: str
    source_key: str = ""  # the SemIf build context zip (empty when no image is built)
    source_sha256: str = ""
    source_file: str = ""


def package_keys(cfg: DeployConfig) -> tuple[str, str]:
    """(model.tar.gz key, build context key): the context is shared, keyed by its hash in the tag."""
    return f"{cfg.prefix}/{cfg.deployment_id}/model.tar.gz", f"{cfg.prefix}/build/semif-adapter-src.zip"


def model_data_url(cfg: DeployConfig, pkg: Package) -> str:
    return f"s3://{cfg.bucket}/{pkg.key}"


def environment(cfg: DeployConfig) -> dict[str, str]:
    """Container environment. The DLC maps SM_LLAMA_CPP_FOO_BAR=v to --foo-bar v; the SemIf adapter
    reads the same settings as SM_SEMIF_*."""
    if cfg.serving == "textgen":
        env = {"SM_LLAMA_CPP_CTX_SIZE": str(cfg.ctx_size)}
        if cfg.compute == "gpu":
            env["SM_LLAMA_CPP_N_GPU_LAYERS"] = str(cfg.gpu_layers)
        if cfg.threads:
            env["SM_LLAMA_CPP_THREADS"] = str(cfg.threads)
    else:
        env = {"SM_SEMIF_CTX_SIZE": str(cfg.ctx_size),
               "SM_SEMIF_N_GPU_LAYERS": str(cfg.gpu_layers if cfg.compute == "gpu" else 0)}
        if cfg.threads:
            env["SM_SEMIF_THREADS"] = str(cfg.threads)
    return {**env, **cfg.extra_env}


def production_variant(cfg: DeployConfig) -> dict[str, Any]:
    v: dict[str, Any] = {
        "VariantName": "AllTraffic", "ModelName": cfg.model_name, "InitialInstanceCount": cfg.instance_count,
        "InitialVariantWeight": 1.0, "ModelDataDownloadTimeoutInSeconds": cfg.download_timeout,
        "ContainerStartupHealthCheckTimeoutInSeconds": cfg.startup_timeout}
    if cfg.compute == "gpu":
        v["InstancePools"] = [{"InstanceType": t, "Priority": p} for t, p in cfg.pools]
        v["VariantInstanceProvisionTimeoutInSeconds"] = cfg.provision_timeout
        v["InferenceAmiVersion"] = cfg.inference_ami  # the CUDA DLC is CUDA 13
    else:
        v["InstanceType"] = cfg.instance_type
    return v


def image_tag(pkg: Package) -> str:
    return "src-" + pkg.source_sha256[:12]


def image(cfg: DeployConfig, pkg: Package) -> str:
    """The container image the model runs: the DLC, a given SemIf image, or the one we build."""
    if cfg.serving == "textgen":
        return cfg.base_image
    return cfg.image_uri or f"{cfg.repository_uri}:{image_tag(pkg)}"


def upload_step(bucket: str, key: str, sha256: str, file: str, what: str, description: str) -> Step:
    return Step("s3", "PutObject", {"Bucket": bucket, "Key": key, "Metadata": {"sha256": sha256}}, description,
                action="upload", extra={"what": what, "file": file})


def build_steps(cfg: DeployConfig, pkg: Package) -> list[Step]:
    """The SemIf child image: ECR repository, CodeBuild project (privileged docker), one build."""
    env = [{"name": "BASE_IMAGE", "value": cfg.base_image, "type": "PLAINTEXT"},
           {"name": "IMAGE_REPO_URI", "value": cfg.repository_uri, "type": "PLAINTEXT"},
           {"name": "IMAGE_TAG", "value": image_tag(pkg), "type": "PLAINTEXT"},
           {"name": "DLC_REGISTRY", "value": cfg.base_image.split("/")[0], "type": "PLAINTEXT"},
           {"name": "LLAMA_CMAKE_ARGS", "type": "PLAINTEXT",
            "value": "-DGGML_CUDA=on -DGGML_NATIVE=OFF" if cfg.compute == "gpu" else "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"}]
    return [
        upload_step(cfg.bucket, pkg.source_key, pkg.source_sha256, pkg.source_file, "source",
                    "upload the image build context (zip)"),
        Step("ecr", "CreateRepository", {"repositoryName": cfg.repository, "imageTagMutability": "MUTABLE",
                                         "imageScanningConfiguration": {"scanOnPush": True},
                                         "tags": [{"Key": t["Key"], "Value": t["Value"]} for t in cfg.tags()]},
             "ECR repository for the SemIf image (reused if it exists)"),
        Step("codebuild", "CreateProject", {
            "name": cfg.project, "description": "Builds the SemIf adapter image FROM the llama.cpp DLC",
            "source": {"type": "S3", "location": f"{cfg.bucket}/{pkg.source_key}", "buildspec": "deploy/buildspec.yml"},
            "artifacts": {"type": "NO_ARTIFACTS"},
            "environment": {"type": "LINUX_CONTAINER", "image": "aws/codebuild/standard:7.0",
                            "computeType": "BUILD_GENERAL1_LARGE", "privilegedMode": True,
                            "environmentVariables": env},
            "serviceRole": cfg.codebuild_role_arn, "timeoutInMinutes": 60,
            "tags": [{"key": t["Key"], "value": t["Value"]} for t in cfg.tags()]},
             "CodeBuild project (privileged, for docker build/push; reused if it exists)"),
        Step("codebuild", "StartBuild", {"projectName": cfg.project, "environmentVariablesOverride": env,
                                         "sourceLocationOverride": f"{cfg.bucket}/{pkg.source_key}"},
             "build and push the image (skipped when the tag is already in ECR)",
             extra={"image_tag": image_tag(pkg), "repository": cfg.repository}),
        Step("codebuild", "BatchGetBuilds", {"ids": [BUILD_ID]}, "poll the build to a terminal state",
             action="wait-build"),
    ]


def model_steps(cfg: DeployConfig, pkg: Package) -> list[Step]:
    """model.tar.gz in S3 and the SageMaker model on top of it (shared by endpoints and transforms)."""
    return [
        upload_step(cfg.bucket, pkg.key, pkg.sha256, pkg.model_file, "model",
                    "upload model.tar.gz (skipped when the same object is there)"),
        Step("sagemaker", "CreateModel", {
            "ModelName": cfg.model_name, "ExecutionRoleArn": cfg.role_arn, "Tags": cfg.tags(),
            "PrimaryContainer": {"Image": image(cfg, pkg), "ModelDataUrl": model_data_url(cfg, pkg),
                                 "Environment": environment(cfg)}},
             f"SageMaker model on {'the llama.cpp DLC' if cfg.serving == 'textgen' else 'the SemIf image'}"),
    ]


def serve_steps(cfg: DeployConfig, pkg: Package) -> list[Step]:
    where = (f"GPU pool {', '.join(t for t, _ in sorted(cfg.pools, key=lambda x: x[1]))}" if cfg.compute == "gpu"
             else f"CPU {cfg.instance_type}")
    return model_steps(cfg, pkg) + [
        Step("sagemaker", "CreateEndpointConfig", {"EndpointConfigName": cfg.endpoint_config_name, "Tags": cfg.tags(),
                                                   "ProductionVariants": [production_variant(cfg)]},
             "endpoint config: " + where),
        Step("sagemaker", "CreateEndpoint", {"EndpointName": cfg.endpoint_name, "EndpointConfigName": cfg.endpoint_config_name,
                                             "Tags": cfg.tags()}, "the endpoint"),
        Step("sagemaker", "DescribeEndpoint", {"EndpointName": cfg.endpoint_name},
             "wait until InService (or report FailureReason)", action="wait-endpoint"),
    ]


def autoscaling_steps(cfg: DeployConfig) -> list[Step]:
    """Register the variant as a scalable target and track invocations per instance. Runs after
    the endpoint is InService (Application Auto Scaling refuses a variant that is not)."""
    a = cfg.autoscaling
    if a is None:
        return []
    dps = decisions_per_second(cfg)
    if dps is None:
        raise ValueError(f"no default throughput for {cfg.instance_type if cfg.compute == 'cpu' else cfg.pools}: "
                         "measure decisions per second per instance and set autoscaling.decisions_per_second")
    target = target_invocations_per_minute(dps, a.utilisation)
    where = {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(cfg.endpoint_name), "ScalableDimension": DIMENSION}
    return [
        Step("application-autoscaling", "RegisterScalableTarget",
             {**where, "MinCapacity": a.min_instances, "MaxCapacity": a.max_instances},
             f"autoscaling: {a.min_instances}..{a.max_instances} instances"),
        Step("application-autoscaling", "PutScalingPolicy", {
            **where, "PolicyName": policy_name(cfg.endpoint_name), "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": {
                "TargetValue": target, "PredefinedMetricSpecification": {"PredefinedMetricType": METRIC},
                "ScaleInCooldown": a.scale_in_cooldown, "ScaleOutCooldown": a.scale_out_cooldown}},
             f"scale on {METRIC}: target {target:g}/min per instance "
             f"({dps:g} decisions/s x 60 x {a.utilisation:g} utilisation)"),
    ]


def deployment_plan(cfg: DeployConfig, pkg: Package) -> list[Step]:
    steps = build_steps(cfg, pkg) if cfg.builds_image else []
    return steps + serve_steps(cfg, pkg) + autoscaling_steps(cfg)


def teardown_plan(endpoint: str, endpoint_config: str, model: str, autoscaling: bool = False) -> list[Step]:
    """Reverse order of creation: the scaling policy and target first (a deleted endpoint would
    leave them dangling). The ECR repository and CodeBuild project are shared and kept."""
    where = {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(endpoint), "ScalableDimension": DIMENSION}
    scaling = [Step("application-autoscaling", "DeleteScalingPolicy", {**where, "PolicyName": policy_name(endpoint)},
                    "delete the scaling policy"),
               Step("application-autoscaling", "DeregisterScalableTarget", dict(where),
                    "deregister the scalable target")] if autoscaling else []
    return scaling + [
        Step("sagemaker", "DeleteEndpoint", {"EndpointName": endpoint}, "delete the endpoint"),
        Step("sagemaker", "DescribeEndpoint", {"EndpointName": endpoint}, "wait until it is gone", action="wait-deleted"),
        Step("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": endpoint_config}, "delete the endpoint config"),
        Step("sagemaker", "DeleteModel", {"ModelName": model}, "delete the model")]


def _replace_in(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {k: _replace_in(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_in(v, old, new) for v in value]
    return copy.copy(value)


def bind_account(steps: list[Step], account_id: str) -> list[Step]:
    """The plan with `<account-id>` replaced by the real account (known only after STS, which the
    Deploy page does not call before confirmation). The one substitution apply makes; the bound
    plan is what gets validated, recorded and executed."""
    return [replace(s, params=_replace_in(s.params, ACCOUNT_PLACEHOLDER, account_id),
                    extra=_replace_in(s.extra, ACCOUNT_PLACEHOLDER, account_id)) for s in steps]


def placeholders(value: Any) -> set[str]:
    """Every `<...>` placeholder left in a plan's params (the build id excepted)."""
    return set(re.findall(r"<[a-z][a-z -]*>", repr(value))) - RUNTIME_PLACEHOLDERS
