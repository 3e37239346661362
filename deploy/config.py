"""What a deployment is: one packaged model, a serving path (text-gen DLC or SemIf image), CPU or
a GPU instance pool, and the AWS coordinates. Pure data; names are generated with a suffix."""
from __future__ import annotations

import re
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

DLC_ACCOUNT = "763104351884"
DLC_IMAGES = {"cpu": "llama-cpp:server-sagemaker-cpu-v1", "gpu": "llama-cpp:server-sagemaker-cuda-v1"}
DEFAULT_POOLS = [("ml.g6e.xlarge", 1), ("ml.g6.xlarge", 2), ("ml.g5.xlarge", 3), ("ml.g4dn.xlarge", 4)]
CUDA13_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
PATHS = ("textgen", "semif")
COMPUTES = ("cpu", "gpu")


def dlc_image(region: str, compute: str, account: str = DLC_ACCOUNT) -> str:
    return f"{account}.dkr.ecr.{region}.amazonaws.com/{DLC_IMAGES[compute]}"


def suffix() -> str:
    return datetime.now(timezone.utc).strftime("%m%d%H%M") + secrets.token_hex(2)


@dataclass
class DeployConfig:
    region: str
    bucket: str
    role_arn: str  # SageMaker execution role (reads the model from S3, pulls the image)
    path: str = "semif"  # textgen | semif
    compute: str = "cpu"  # cpu | gpu
    model_path: str = ""  # the GGUF to package (default: the shipped model)
    policy_path: str = ""  # optional calibrated policy shipped inside model.tar.gz
    codebuild_role_arn: str = ""  # needed for the semif path (builds the child image)
    account_id: str = "<account-id>"  # resolved with STS at apply time
    instance_type: str = "ml.c7i.xlarge"  # CPU
    pools: list[tuple[str, int]] = field(default_factory=lambda: list(DEFAULT_POOLS))  # GPU: (type, priority)
    instance_count: int = 1
    inference_ami: str = CUDA13_AMI
    startup_timeout: int = 600
    download_timeout: int = 900
    provision_timeout: int = 1800
    ctx_size: int = 4096
    threads: int = 0
    gpu_layers: int = 999
    extra_env: dict[str, str] = field(default_factory=dict)
    prefix: str = "models/semif"
    name_suffix: str = field(default_factory=suffix)
    repository: str = "semif-adapter"
    project: str = "semif-adapter-build"
    image_uri: str = ""  # a prebuilt SemIf image: skips the CodeBuild steps
    deployment_id: str = ""

    def __post_init__(self):
        if not self.deployment_id:
            self.deployment_id = f"{self.path}-{self.compute}-{self.name_suffix}"

    @property
    def model_name(self) -> str:
        return f"{self.deployment_id}-model"

    @property
    def endpoint_config_name(self) -> str:
        return f"{self.deployment_id}-config"

    @property
    def endpoint_name(self) -> str:
        return self.deployment_id

    @property
    def base_image(self) -> str:
        return dlc_image(self.region, self.compute)

    @property
    def repository_uri(self) -> str:
        return f"{self.account_id}.dkr.ecr.{self.region}.amazonaws.com/{self.repository}"

    def tags(self) -> list[dict[str, str]]:
        return [{"Key": "semif:deployment", "Value": self.deployment_id},
                {"Key": "semif:path", "Value": self.path}, {"Key": "semif:compute", "Value": self.compute},
                {"Key": "created-by", "Value": "semif-workbench"}]

    def to_dict(self) -> dict:
        return asdict(self)


NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
