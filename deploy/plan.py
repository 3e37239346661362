"""Plans: the ordered AWS API calls of a deployment, as data. Pure functions - nothing here talks
to AWS - so a plan can be printed, validated offline against botocore's service model, reviewed
and only then executed."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .config import DeployConfig


@dataclass
class Step:
    service: str
    operation: str  # botocore operation name, e.g. CreateEndpointConfig
    params: dict
    description: str
    kind: str = "call"  # call | upload (streamed S3 put with progress) | wait-build | wait-endpoint
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Package:
    """What the packaging step produced (or will): the S3 coordinates of model.tar.gz."""
    key: str
    sha256: str = "<computed at apply>"
    source_key: str = ""  # the SemIf build context zip
    source_sha256: str = "<computed at apply>"


def model_data_url(cfg: DeployConfig, pkg: Package) -> str:
    return f"s3://{cfg.bucket}/{pkg.key}"


def environment(cfg: DeployConfig) -> dict[str, str]:
    """Container environment. The DLC maps SM_LLAMA_CPP_FOO_BAR=v to --foo-bar v; the SemIf adapter
    reads the same settings as SM_SEMIF_*."""
    if cfg.path == "textgen":
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


def production_variant(cfg: DeployConfig) -> dict:
    v = {"VariantName": "AllTraffic", "ModelName": cfg.model_name, "InitialInstanceCount": cfg.instance_count,
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
    return "src-" + pkg.source_sha256[:12] if not pkg.source_sha256.startswith("<") else "src-<sha>"


def build_steps(cfg: DeployConfig, pkg: Package) -> list[Step]:
    """The SemIf child image: ECR repository, CodeBuild project (privileged docker), one build."""
    env = [{"name": "BASE_IMAGE", "value": cfg.base_image, "type": "PLAINTEXT"},
           {"name": "IMAGE_REPO_URI", "value": cfg.repository_uri, "type": "PLAINTEXT"},
           {"name": "IMAGE_TAG", "value": image_tag(pkg), "type": "PLAINTEXT"},
           {"name": "DLC_REGISTRY", "value": cfg.base_image.split("/")[0], "type": "PLAINTEXT"},
           {"name": "LLAMA_CMAKE_ARGS", "type": "PLAINTEXT",
            "value": "-DGGML_CUDA=on -DGGML_NATIVE=OFF" if cfg.compute == "gpu" else "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"}]
    return [
        Step("s3", "PutObject", {"Bucket": cfg.bucket, "Key": pkg.source_key}, "upload the image build context (zip)",
             kind="upload", extra={"what": "source"}),
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
             "build and push the image (skipped when the tag is already in ECR)", extra={"image_tag": image_tag(pkg)}),
        Step("codebuild", "BatchGetBuilds", {"ids": ["<build id>"]}, "poll the build to a terminal state",
             kind="wait-build"),
    ]


def serve_steps(cfg: DeployConfig, pkg: Package) -> list[Step]:
    image = cfg.base_image if cfg.path == "textgen" else (cfg.image_uri or f"{cfg.repository_uri}:{image_tag(pkg)}")
    return [
        Step("s3", "PutObject", {"Bucket": cfg.bucket, "Key": pkg.key, "Metadata": {"sha256": pkg.sha256}},
             "upload model.tar.gz (skipped when the same object is there)", kind="upload", extra={"what": "model"}),
        Step("sagemaker", "CreateModel", {
            "ModelName": cfg.model_name, "ExecutionRoleArn": cfg.role_arn, "Tags": cfg.tags(),
            "PrimaryContainer": {"Image": image, "ModelDataUrl": model_data_url(cfg, pkg), "Environment": environment(cfg)}},
             f"SageMaker model on {'the llama.cpp DLC' if cfg.path == 'textgen' else 'the SemIf image'}"),
        Step("sagemaker", "CreateEndpointConfig", {"EndpointConfigName": cfg.endpoint_config_name, "Tags": cfg.tags(),
                                                   "ProductionVariants": [production_variant(cfg)]},
             "endpoint config: " + (f"GPU pool {', '.join(t for t, _ in sorted(cfg.pools, key=lambda x: x[1]))}"
                                    if cfg.compute == "gpu" else f"CPU {cfg.instance_type}")),
        Step("sagemaker", "CreateEndpoint", {"EndpointName": cfg.endpoint_name, "EndpointConfigName": cfg.endpoint_config_name,
                                             "Tags": cfg.tags()}, "the endpoint"),
        Step("sagemaker", "DescribeEndpoint", {"EndpointName": cfg.endpoint_name},
             "wait until InService (or report FailureReason)", kind="wait-endpoint"),
    ]


def deployment_plan(cfg: DeployConfig, pkg: Package) -> list[Step]:
    steps = []
    if cfg.path == "semif" and not cfg.image_uri:
        steps += build_steps(cfg, pkg)
    return steps + serve_steps(cfg, pkg)


def teardown_plan(endpoint: str, endpoint_config: str, model: str) -> list[Step]:
    """Reverse order of creation. The ECR repository and CodeBuild project are shared across
    deployments and are kept."""
    return [Step("sagemaker", "DeleteEndpoint", {"EndpointName": endpoint}, "delete the endpoint"),
            Step("sagemaker", "DescribeEndpoint", {"EndpointName": endpoint}, "wait until it is gone",
                 kind="wait-deleted"),
            Step("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": endpoint_config}, "delete the endpoint config"),
            Step("sagemaker", "DeleteModel", {"ModelName": model}, "delete the model")]


def default_package(cfg: DeployConfig) -> Package:
    return Package(key=f"{cfg.prefix}/{cfg.deployment_id}/model.tar.gz",
                   source_key=f"{cfg.prefix}/build/semif-adapter-src.zip")
