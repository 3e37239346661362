"""Local mode (what SageMaker's own Python SDK calls it): a deployment plan run in the SemIf image on
this machine's container runtime (podman) instead of in AWS.

The same plan as for AWS, read the way SageMaker reads it: the model.tar.gz its upload step names
(checked against the sha256 the plan carries) is extracted into a folder that is mounted read-only at
/opt/ml/model, the CreateModel step's Environment is passed as is, and the container is started as
SageMaker starts it (`IMAGE serve`), with SAGEMAKER_BIND_TO_PORT set to a free local port. What differs
is said where it is done: the image is the local one `make image` built (SEMIF_IMAGE, default
localhost/semif:dev) instead of the ECR tag, the adapter listens on 127.0.0.1 only, and there is no
memory limit. The podman flags this machine needs are docs/deploy.md's (crun fails on hybrid cgroups;
the default rlimits exceed the sandbox's; host networking only).

Recording is the caller's, through the same Recorder as the executor (actions `apply-local` and
`destroy-local`)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .config import DeployConfig
from .errors import DeployError
from .executor import Recorder
from .package import sha256_file
from .plan import Step

IMAGE = "localhost/semif:dev"  # what `make image` builds (SEMIF_IMAGE overrides both)
MODEL_DIR = "/opt/ml/model"
LABEL = "org.semif.local-endpoint"
INSTALL_HINT = ("`make image` installs podman, buildah and runc from Debian and builds the SemIf image "
                "(docs/deploy.md, \"The image, built and tested here\")")
STOP_GRACE = 30  # SageMaker's: SIGTERM, then SIGKILL 30 s later

Event = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Runtime:
    """The container runtime: podman, driven through runc (crun fails on this host's hybrid cgroups)."""
    podman: str
    runc: str | None

    def base(self) -> list[str]:
        return [self.podman, *(["--runtime", self.runc, "--cgroup-manager", "cgroupfs"] if self.runc else [])]


def find_runtime() -> Runtime | None:
    """podman on PATH (with runc when there is one), else None."""
    podman = shutil.which("podman")
    return Runtime(podman, shutil.which("runc")) if podman else None


def image_name() -> str:
    return os.environ.get("SEMIF_IMAGE") or IMAGE


def missing(runtime: Runtime | None, image: str) -> str | None:
    """Why a local run cannot start here (no runtime, no image), with what fixes it; None when it can."""
    if runtime is None:
        return f"No container runtime is installed (podman not found): {INSTALL_HINT}."
    if subprocess.run([*runtime.base(), "image", "exists", image], capture_output=True).returncode != 0:
        return f"The SemIf image {image} is not built on this machine: {INSTALL_HINT}."
    return None


def container_name(endpoint_name: str) -> str:
    return f"semif-local-{endpoint_name}"


def run_args(image: str, *, name: str, model_dir: Path | None, env: dict[str, str],
             labels: dict[str, str] | None = None, detach: bool = True) -> list[str]:
    """`podman run ...` (after Runtime.base()) as SageMaker runs the image: `IMAGE serve`, the model
    read-only at /opt/ml/model; with the flags this machine needs: rlimits inside the sandbox's hard
    limits, host networking."""
    args = ["run", *(["-d"] if detach else []), "--name", name,
            "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096", "--network", "host"]
    if model_dir is not None:
        args += ["-v", f"{Path(model_dir).resolve()}:{MODEL_DIR}:ro"]
    for k, v in (labels or {}).items():
        args += ["--label", f"{k}={v}"]
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    return args + [image, "serve"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def extract(tarball: Path, dest: Path) -> Path:
    """model.tar.gz unpacked as SageMaker unpacks it into /opt/ml/model (a fresh folder; members that
    would land outside it, links and devices refused by tarfile's `data` filter)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise DeployError(f"cannot unpack {tarball}: {exc}") from None
    return dest


def wait_ready(url: str, timeout: float, alive: Callable[[], str | None]) -> float:
    """Seconds until GET /ping answered 200; DeployError when the container exits or the time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(url + "/ping", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        gone = alive()
        if gone:
            raise DeployError(gone)
        time.sleep(0.25)
    raise DeployError(f"{url}/ping did not answer 200 within {timeout:.0f} s (the plan's startup health check "
                      "timeout)")


@dataclass(frozen=True)
class LocalEndpoint:
    deployment_id: str
    container: str
    url: str
    image: str
    model_dir: str
    model_sha256: str
    ready_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LocalRunner:
    """Runs a deployment plan's SemIf container locally (see the module doc); `destroy` stops and removes it."""

    def __init__(self, work_dir: Path, *, runtime: Runtime | None = None, image: str | None = None,
                 on_event: Event | None = None):
        self.work_dir = Path(work_dir)
        self.runtime = runtime if runtime is not None else find_runtime()
        self.image = image or image_name()
        self.on_event: Event = on_event or (lambda e: None)

    def _podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        if self.runtime is None:
            raise DeployError(f"No container runtime is installed (podman not found): {INSTALL_HINT}.")
        done = subprocess.run([*self.runtime.base(), *args], capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise DeployError(f"podman {args[0]} failed: {(done.stderr or done.stdout).strip()[-800:]}")
        return done

    def unavailable(self) -> str | None:
        return missing(self.runtime, self.image)

    def apply(self, cfg: DeployConfig, steps: list[Step], *, recorder: Recorder | None = None,
              port: int | None = None) -> LocalEndpoint:
        """Start the plan's container and wait for /ping; the recorder gets the plan and the outcome."""
        if recorder:
            recorder.planned(cfg, steps)
        try:
            ep = self._apply(cfg, steps, port)
        except (DeployError, subprocess.TimeoutExpired) as exc:
            if recorder:
                recorder.finished(cfg.deployment_id, "apply-local", "failed", str(exc))
            raise DeployError(str(exc)) from None
        if recorder:
            recorder.finished(cfg.deployment_id, "apply-local", "running-local", json.dumps(ep.to_dict()))
        return ep

    def _apply(self, cfg: DeployConfig, steps: list[Step], port: int | None) -> LocalEndpoint:
        if cfg.serving != "semif":
            raise DeployError("local mode runs the SemIf image only: the llama.cpp DLC (serving path textgen) cannot "
                              "be pulled here")
        why = self.unavailable()
        if why:
            raise DeployError(why)
        model = next((s for s in steps if s.action == "upload" and s.extra.get("what") == "model"), None)
        create = next((s for s in steps if s.operation == "CreateModel"), None)
        if model is None or create is None:
            raise DeployError("this plan has no model upload and CreateModel step: plan again")
        tarball, sha = Path(model.extra["file"]), model.params["Metadata"]["sha256"]
        self.on_event({"phase": "package", "message": f"checking {tarball.name} against the plan's sha256"})
        if not tarball.is_file() or sha256_file(tarball) != sha:
            raise DeployError(f"{tarball} is not the model.tar.gz this plan was made with (sha256 {sha[:12]}): "
                              "plan again")
        self._same_source(create.params["PrimaryContainer"]["Image"])
        name = container_name(cfg.endpoint_name)
        self._podman("rm", "-f", "-t", "0", name, check=False)  # a previous local run of the same endpoint
        model_dir = extract(tarball, self.work_dir / cfg.deployment_id / "opt-ml-model")
        port = port or free_port()
        env = {**create.params["PrimaryContainer"].get("Environment", {}),
               "SAGEMAKER_BIND_TO_PORT": str(port), "SM_SEMIF_HOST": "127.0.0.1"}
        self.on_event({"phase": "wait", "message": f"starting {self.image} as {name} on 127.0.0.1:{port}"})
        self._podman(*run_args(self.image, name=name, model_dir=model_dir, env=env, labels={LABEL: cfg.deployment_id}))
        url = f"http://127.0.0.1:{port}"
        timeout = float(next((s.params["ProductionVariants"][0].get("ContainerStartupHealthCheckTimeoutInSeconds", 600)
                              for s in steps if s.operation == "CreateEndpointConfig"), 600))
        try:
            ready = wait_ready(url, timeout, lambda: self._exited(name))
        except DeployError:
            self._podman("rm", "-f", "-t", "0", name, check=False)
            raise
        self.on_event({"phase": "done", "message": f"{name} answers /ping at {url} after {ready:.1f} s"})
        return LocalEndpoint(cfg.deployment_id, name, url, self.image, str(model_dir), sha, round(ready, 2))

    def _same_source(self, planned_image: str) -> None:
        """The plan's image is tagged with the hash of the adapter source it is built from (src-...);
        `make image` labels the local image with the same: a local run tests the code that would ship."""
        want = planned_image.rsplit(":", 1)[-1]
        if not want.startswith("src-"):
            return  # a given image URI: nothing to compare with
        have = self._podman("image", "inspect", "--format", '{{index .Labels "org.semif.source"}}', self.image,
                            check=False).stdout.strip()
        if have != want:
            raise DeployError(f"the local image {self.image} was built from other adapter source ({have or 'unlabelled'}) "
                              f"than this plan ships ({want}): run make image, then run locally again")

    def _exited(self, name: str) -> str | None:
        state = self._podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name, check=False)
        if state.returncode == 0 and not state.stdout.startswith("exited"):
            return None
        logs = self._podman("logs", "--tail", "20", name, check=False)
        return f"the container stopped ({state.stdout.strip() or 'gone'}):\n{(logs.stdout + logs.stderr)[-1500:]}"

    def status(self, endpoint_name: str) -> str:
        """'running', 'exited', ... or 'gone'."""
        done = self._podman("inspect", "--format", "{{.State.Status}}", container_name(endpoint_name), check=False)
        return done.stdout.strip() if done.returncode == 0 else "gone"

    def destroy(self, deployment_id: str, endpoint_name: str, *, recorder: Recorder | None = None) -> str:
        """Stop (SIGTERM, SIGKILL after SageMaker's 30 s) and remove the container; 'deleted'."""
        name = container_name(endpoint_name)
        try:
            self._podman("rm", "-f", "-t", str(STOP_GRACE), name, timeout=STOP_GRACE + 60)
        except (DeployError, subprocess.TimeoutExpired) as exc:
            if recorder:
                recorder.finished(deployment_id, "destroy-local", "destroy-failed", str(exc))
            raise DeployError(str(exc)) from None
        shutil.rmtree(self.work_dir / deployment_id / "opt-ml-model", ignore_errors=True)
        if recorder:
            recorder.finished(deployment_id, "destroy-local", "deleted", f"stopped and removed the container {name}")
        return "deleted"
