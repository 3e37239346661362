"""What a deployment is: one packaged model, a serving path (text-gen DLC or SemIf image), CPU or
a GPU instance pool, optional autoscaling, and the AWS coordinates. Pure data; names get a suffix.

`config_from_form` is the one way from user input (CLI flags or the Deploy page's widgets) to a
DeployConfig, so both front ends accept and reject exactly the same things."""
from __future__ import annotations

import math
import re
import secrets
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any, Literal, Mapping, get_args

Serving = Literal["textgen", "semif"]  # llama.cpp DLC chat completions | the SemIf adapter image
Compute = Literal["cpu", "gpu"]  # one CPU instance type | a GPU instance pool
SERVINGS: tuple[Serving, ...] = get_args(Serving)
COMPUTES: tuple[Compute, ...] = get_args(Compute)

DLC_ACCOUNT = "763104351884"
DLC_IMAGES: dict[Compute, str] = {"cpu": "llama-cpp:server-sagemaker-cpu-v1", "gpu": "llama-cpp:server-sagemaker-cuda-v1"}
DEFAULT_POOLS = [("ml.g6e.xlarge", 1), ("ml.g6.xlarge", 2), ("ml.g5.xlarge", 3), ("ml.g4dn.xlarge", 4)]
CUDA13_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
ACCOUNT_PLACEHOLDER = "<account-id>"  # filled from STS at apply time when not given (see plan.bind_account)
# What a plan shows where the person has not given the bucket or a role yet (config_from_form(placeholders=True)):
# a plan may be read without them, but nothing is ever called with them (validate_plan refuses them at apply).
BUCKET_PLACEHOLDER = "<deploy-bucket>"
ROLE_PLACEHOLDER = "<sagemaker-role-arn>"
CODEBUILD_ROLE_PLACEHOLDER = "<codebuild-role-arn>"
FORM_PLACEHOLDERS = frozenset({BUCKET_PLACEHOLDER, ROLE_PLACEHOLDER, CODEBUILD_ROLE_PLACEHOLDER})
PLACEHOLDER_HINTS = {ACCOUNT_PLACEHOLDER: "the account id comes from STS at apply",
                     BUCKET_PLACEHOLDER: "give the S3 bucket: --bucket or SEMIF_DEPLOY_BUCKET",
                     ROLE_PLACEHOLDER: "give the SageMaker execution role: --role-arn or SEMIF_SAGEMAKER_ROLE_ARN",
                     CODEBUILD_ROLE_PLACEHOLDER: "give the CodeBuild service role: --codebuild-role-arn or "
                                                 "SEMIF_CODEBUILD_ROLE_ARN"}
# DeployConfig field -> (ProductionVariant parameter, min, max): SageMaker's limits, which botocore does not check
VARIANT_TIMEOUTS = {"provision_timeout": ("VariantInstanceProvisionTimeoutInSeconds", 300, 3600),
                    "startup_timeout": ("ContainerStartupHealthCheckTimeoutInSeconds", 60, 3600),
                    "download_timeout": ("ModelDataDownloadTimeoutInSeconds", 60, 3600)}
DEFAULT_PREFIX = "models/semif"  # S3 key prefix of packages and transform inputs/outputs
DEFAULT_CPU_INSTANCE = "ml.c7i.xlarge"  # a CPU endpoint's instance type when none is given
DEFAULT_TRANSFORM_INSTANCE = "ml.c5.xlarge"  # a Batch Transform job's instance type when none is given

# The shapes AWS accepts, for every front end (this module's form, the Deploy page, the target forms):
# the *_PATTERN strings are for re.fullmatch; the *_RE objects are anchored at both ends (\Z: a
# trailing newline is refused too), so .match and .fullmatch both check the whole string.
SAGEMAKER_NAME_PATTERN = r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"  # endpoint, endpoint config, model, transform job
REGION_PATTERN = r"[a-z]{2}(-[a-z]+)+-\d"
BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
ROLE_ARN_PATTERN = r"arn:aws[a-z-]*:iam::\d{12}:role/\S+"
INSTANCE_TYPE_PATTERN = r"ml\.[a-z0-9]+\.[a-z0-9]+"


def _whole(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"(?:{pattern})\Z")


NAME_RE = _whole(SAGEMAKER_NAME_PATTERN)
REGION_RE = _whole(REGION_PATTERN)
BUCKET_RE = _whole(BUCKET_PATTERN)
ROLE_RE = _whole(ROLE_ARN_PATTERN)
INSTANCE_RE = _whole(INSTANCE_TYPE_PATTERN)
EXPECTED = {ROLE_RE.pattern: "arn:aws:iam::<12-digit account>:role/<role name>",  # shown with a refused value
            BUCKET_RE.pattern: "3-63 lower-case letters, digits, dots and hyphens, starting and ending with a "
                               "letter or digit (e.g. my-semif-models)",
            REGION_RE.pattern: "a region code such as us-east-1",
            NAME_RE.pattern: "1-63 letters, digits and hyphens"}


def dlc_image(region: str, compute: Compute, account: str = DLC_ACCOUNT) -> str:
    return f"{account}.dkr.ecr.{region}.amazonaws.com/{DLC_IMAGES[compute]}"


def suffix() -> str:
    return datetime.now(timezone.utc).strftime("%m%d%H%M") + secrets.token_hex(2)


@dataclass
class Autoscaling:
    """Target tracking on SageMakerVariantInvocationsPerInstance (see deploy/autoscaling.py)."""
    min_instances: int = 1
    max_instances: int = 2
    decisions_per_second: float | None = None  # measured per instance; None = the family's default
    utilisation: float = 0.7  # aim below saturation so latency stays flat while scaling out
    scale_in_cooldown: int = 300
    scale_out_cooldown: int = 60


@dataclass
class DeployConfig:
    region: str
    bucket: str
    role_arn: str  # SageMaker execution role (reads the model from S3, pulls the image)
    serving: Serving = "semif"
    compute: Compute = "cpu"
    model_path: str = ""  # the GGUF to package (default: the shipped model)
    policy_path: str = ""  # optional calibrated policy shipped inside model.tar.gz
    codebuild_role_arn: str = ""  # needed for the semif path (builds the child image)
    account_id: str = ACCOUNT_PLACEHOLDER  # resolved with STS at apply time
    instance_type: str = DEFAULT_CPU_INSTANCE  # CPU
    pools: list[tuple[str, int]] = field(default_factory=lambda: list(DEFAULT_POOLS))  # GPU: (type, priority)
    instance_count: int = 1
    inference_ami: str = CUDA13_AMI
    startup_timeout: int = 600
    download_timeout: int = 900
    provision_timeout: int = 1800
    ctx_size: int = 8192  # 255 /v1/systemone choices fit (4,096 did not)
    threads: int = 0
    gpu_layers: int = 999
    extra_env: dict[str, str] = field(default_factory=dict)
    prefix: str = DEFAULT_PREFIX
    name_suffix: str = field(default_factory=suffix)
    repository: str = "semif-adapter"
    project: str = "semif-adapter-build"
    image_uri: str = ""  # a prebuilt SemIf image: skips the CodeBuild steps
    autoscaling: Autoscaling | None = None
    decisions_per_second: float | None = None  # measured per instance (the cost per 1,000), with or without autoscaling
    deployment_id: str = ""

    def __post_init__(self) -> None:
        if not self.deployment_id:
            self.deployment_id = f"{self.serving}-{self.compute}-{self.name_suffix}"

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

    @property
    def builds_image(self) -> bool:
        """Whether the plan builds the SemIf child image (and so needs CodeBuild and the account id)."""
        return self.serving == "semif" and not self.image_uri

    def tags(self) -> list[dict[str, str]]:
        return [{"Key": "semif:deployment", "Value": self.deployment_id},
                {"Key": "semif:path", "Value": self.serving}, {"Key": "semif:compute", "Value": self.compute},
                {"Key": "created-by", "Value": "semif-workbench"}]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeployConfig:
        """Inverse of to_dict, also for JSON round trips (pools come back as lists) and records
        written before the `path` -> `serving` rename."""
        d = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        if "path" in data and "serving" not in d:
            d["serving"] = data["path"]
        d["pools"] = [(str(t), int(p)) for t, p in d.get("pools", DEFAULT_POOLS)]
        if isinstance(d.get("autoscaling"), Mapping):
            d["autoscaling"] = Autoscaling(**d["autoscaling"])
        return cls(**d)


class FormErrors(ValueError):
    """Every problem in a form, keyed by the form field it belongs to."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def form_text(form: Mapping[str, Any], key: str) -> str:
    v = form.get(key)
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).strip()


def text_problem(value: str, label: str, pattern: re.Pattern[str] | None = None, required: bool = False,
                 why: str = "") -> str | None:
    """What is wrong with a form's text value (None: nothing): missing when required, or not the shape."""
    if not value and required:
        return f"{label} is required{why}"
    if value and pattern and not pattern.fullmatch(value):
        shape = EXPECTED.get(pattern.pattern, "")
        return f"{label} {value!r} is not valid" + (f": write it as {shape}" if shape else "")
    return None


def parse_pools(value: Any) -> list[tuple[str, int]]:
    """Pool entries as 'TYPE:PRIORITY' strings, (type, priority) pairs or {instance_type, priority}
    rows (the page's table; empty rows are dropped). Raises ValueError naming the bad entry."""
    out = []
    for item in value or []:
        t: Any
        p: Any
        if isinstance(item, str):
            t, _, p = item.partition(":")
        elif isinstance(item, Mapping):
            t, p = item.get("instance_type"), item.get("priority")
        else:
            t, p = item
        t = "" if t is None or (isinstance(t, float) and math.isnan(t)) else str(t).strip()
        if not t:
            continue
        try:
            prio = float(p)
        except (TypeError, ValueError):
            prio = math.nan
        if not prio.is_integer():
            raise ValueError(f"{item!r}: write TYPE:PRIORITY with an integer priority, e.g. ml.g6.xlarge:1")
        if not INSTANCE_RE.fullmatch(t):
            raise ValueError(f"{t!r} is not a SageMaker instance type (ml.FAMILY.SIZE)")
        out.append((t, int(prio)))
    return out


def config_from_form(form: Mapping[str, Any], *, placeholders: bool = False) -> DeployConfig:
    """A DeployConfig from form fields (strings or typed values; empty = default), or FormErrors
    naming each bad field. Fields: region, bucket, role_arn, serving, compute, model_path,
    policy_path, codebuild_role_arn, account_id, instance_type, instance_count, pools, image_uri,
    ctx_size, startup_timeout, download_timeout, provision_timeout, suffix, and for autoscaling
    autoscale_max (0/empty = off), autoscale_min, decisions_per_second, utilisation,
    scale_in_cooldown, scale_out_cooldown.

    The bucket and the role ARNs are required; with `placeholders=True` (a plan to read, never to
    run) a missing one becomes BUCKET_PLACEHOLDER, ROLE_PLACEHOLDER or CODEBUILD_ROLE_PLACEHOLDER."""
    errors: dict[str, str] = {}
    kw: dict[str, Any] = {}

    def text(key: str, label: str, pattern: re.Pattern[str] | None = None, required: bool = False, why: str = "") -> str:
        v = form_text(form, key)
        problem = text_problem(v, label, pattern, required, why)
        if problem:
            errors[key] = problem
        return v

    def number(key: str, label: str, default: float, lo: float, hi: float, integer: bool = True) -> Any:
        raw = form_text(form, key)
        if not raw:
            return default
        try:
            v = float(raw)
        except ValueError:
            errors[key] = f"{label} must be a number, not {raw!r}"
            return default
        if integer and not v.is_integer():
            errors[key] = f"{label} must be a whole number"
        elif not lo <= v <= hi:
            errors[key] = f"{label} must be between {lo:g} and {hi:g}"
        return int(v) if integer and v.is_integer() else v

    serving = form_text(form, "serving") or "semif"
    compute = form_text(form, "compute") or "cpu"
    if serving not in SERVINGS:
        errors["serving"] = f"serving path must be one of {', '.join(SERVINGS)}"
    if compute not in COMPUTES:
        errors["compute"] = f"compute must be one of {', '.join(COMPUTES)}"
    def required(key: str, label: str, pattern: re.Pattern[str], placeholder: str, needed: bool = True,
                 why: str = "") -> str:
        if placeholders and needed and not form_text(form, key):
            return placeholder
        return text(key, label, pattern, needed, why)

    kw["region"] = text("region", "Region", REGION_RE, True)
    kw["bucket"] = required("bucket", "S3 bucket", BUCKET_RE, BUCKET_PLACEHOLDER)
    kw["role_arn"] = required("role_arn", "SageMaker execution role ARN", ROLE_RE, ROLE_PLACEHOLDER)
    kw["image_uri"] = text("image_uri", "Image URI")
    needs_build = serving == "semif" and not kw["image_uri"]
    kw["codebuild_role_arn"] = required("codebuild_role_arn", "CodeBuild role ARN", ROLE_RE, CODEBUILD_ROLE_PLACEHOLDER,
                                        needs_build, " for the SemIf path (it builds the image)")
    kw["model_path"] = text("model_path", "Model path")
    kw["policy_path"] = text("policy_path", "Policy path")
    account = text("account_id", "AWS account id", re.compile(r"^\d{12}$"))
    if account:
        kw["account_id"] = account
    kw["instance_type"] = text("instance_type", "CPU instance type", INSTANCE_RE) or DEFAULT_CPU_INSTANCE
    kw["instance_count"] = number("instance_count", "Instance count", 1, 1, 100)
    kw["ctx_size"] = number("ctx_size", "Context size", 8192, 256, 131072)
    for key, (param, lo, hi) in VARIANT_TIMEOUTS.items():
        kw[key] = number(key, param, {"provision_timeout": 1800, "startup_timeout": 600, "download_timeout": 900}[key],
                         lo, hi)
    if form.get("pools") is not None:
        try:
            kw["pools"] = parse_pools(form["pools"])
            if compute == "gpu" and not kw["pools"]:
                errors["pools"] = "a GPU deployment needs at least one pool entry"
        except ValueError as exc:
            errors["pools"] = str(exc)
    name_suffix = text("suffix", "Name suffix", re.compile(r"^[a-zA-Z0-9-]{1,30}$"))
    if name_suffix:
        kw["name_suffix"] = name_suffix
    max_n = number("autoscale_max", "Autoscaling maximum", 0, 0, 100)
    dps = number("decisions_per_second", "Decisions per second", 0, 0.001, 1e6, integer=False) or None
    if dps:  # a measured pace prices the plan also without autoscaling (it was read only with autoscaling on)
        kw["decisions_per_second"] = dps
    if max_n:
        a = Autoscaling(min_instances=number("autoscale_min", "Autoscaling minimum", 1, 1, 100),
                        max_instances=max_n,
                        decisions_per_second=dps,
                        utilisation=number("utilisation", "Utilisation", 0.7, 0.05, 1.0, integer=False),
                        scale_in_cooldown=number("scale_in_cooldown", "Scale-in cooldown", 300, 0, 86400),
                        scale_out_cooldown=number("scale_out_cooldown", "Scale-out cooldown", 60, 0, 86400))
        if "autoscale_min" not in errors and "autoscale_max" not in errors:
            if a.min_instances > a.max_instances:
                errors["autoscale_min"] = f"minimum {a.min_instances} is above the maximum {a.max_instances}"
            elif not a.min_instances <= kw["instance_count"] <= a.max_instances:
                errors["instance_count"] = f"instance count must lie within autoscaling {a.min_instances}..{a.max_instances}"
        kw["autoscaling"] = a
    if errors:
        raise FormErrors(errors)
    return DeployConfig(serving=serving, compute=compute, **kw)  # type: ignore[arg-type]
