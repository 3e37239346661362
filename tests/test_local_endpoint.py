"""Local mode (deploy/local.py) without a container runtime: the podman command it runs, the package it
will and will not run, and what the Deploy page and the CLI say when nothing can run locally. The run in
a real container is tests/image/test_image_contract.py (make image-test)."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from deploy.config import config_from_form
from deploy.errors import DeployError
from deploy.local import MODEL_DIR, LocalRunner, Runtime, extract, run_args
from deploy.prepare import prepare

TRUE = Runtime("/bin/true", None)  # a "runtime" that says yes to everything and runs nothing


def local_plan(tmp_path: Path, **form):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 2000)
    cfg = config_from_form({"region": "us-east-1", "serving": "semif", "model_path": str(gguf), "suffix": "loc1",
                            **form}, placeholders=True)
    return cfg, prepare(cfg, tmp_path / "work", unfilled=True)


def test_the_container_runs_as_sagemaker_runs_it_with_this_machines_flags(tmp_path):
    args = run_args("localhost/semif:dev", name="c1", model_dir=tmp_path, env={"SAGEMAKER_BIND_TO_PORT": "9001"},
                    labels={"k": "v"})
    assert args[-2:] == ["localhost/semif:dev", "serve"]
    assert args[args.index("-v") + 1] == f"{tmp_path.resolve()}:{MODEL_DIR}:ro"  # read-only, like SageMaker's
    assert args[args.index("--network") + 1] == "host"
    assert ["--ulimit", "nofile=4096:4096"] == args[args.index("--ulimit"):args.index("--ulimit") + 2]
    assert "SAGEMAKER_BIND_TO_PORT=9001" in args and "-d" in args
    assert Runtime("/usr/bin/podman", "/usr/sbin/runc").base() == [
        "/usr/bin/podman", "--runtime", "/usr/sbin/runc", "--cgroup-manager", "cgroupfs"]


def test_the_package_is_unpacked_as_sagemaker_does_and_a_member_outside_is_refused(tmp_path):
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        for name, data in (("model.gguf", b"GGUF"), ("policy.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = extract(good, tmp_path / "m")
    assert sorted(p.name for p in out.iterdir()) == ["model.gguf", "policy.json"]
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../outside.gguf")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"GGUF"))
    with pytest.raises(DeployError, match="cannot unpack"):
        extract(evil, tmp_path / "m2")
    assert not (tmp_path / "outside.gguf").exists()


def test_a_package_changed_since_the_plan_is_not_run(tmp_path):
    cfg, prepared = local_plan(tmp_path)
    Path(prepared.pkg.model_file).write_bytes(b"something else")
    with pytest.raises(DeployError, match="not the model.tar.gz this plan was made with"):
        LocalRunner(tmp_path / "work", runtime=TRUE).apply(cfg, prepared.steps)


def test_an_image_built_from_other_source_than_the_plan_ships_is_not_run(tmp_path):
    cfg, prepared = local_plan(tmp_path)  # /bin/true's "inspect" prints no source label
    with pytest.raises(DeployError, match=r"built from other adapter source \(unlabelled\) than this plan ships "
                                          r"\(src-[0-9a-f]{12}\): run make image"):
        LocalRunner(tmp_path / "work", runtime=TRUE).apply(cfg, prepared.steps)


def test_without_a_runtime_the_failure_says_what_installs_one_and_is_recorded(tmp_path):
    cfg, prepared = local_plan(tmp_path)
    seen = []

    class Rec:
        def planned(self, cfg, steps):
            seen.append(("planned", len(steps)))

        def finished(self, dep, action, status, detail):
            seen.append((action, status, detail))

    runner = LocalRunner(tmp_path / "work")
    runner.runtime = None
    with pytest.raises(DeployError, match="podman not found.*make image"):
        runner.apply(cfg, prepared.steps, recorder=Rec())
    assert seen[0][0] == "planned" and seen[1][:2] == ("apply-local", "failed") and "make image" in seen[1][2]


def test_the_textgen_path_cannot_run_locally(tmp_path):
    cfg, prepared = local_plan(tmp_path, serving="textgen")
    with pytest.raises(DeployError, match="SemIf image only"):
        LocalRunner(tmp_path / "work", runtime=TRUE).apply(cfg, prepared.steps)


def test_the_deploy_page_plans_a_local_run_without_aws_and_says_what_installs_a_runtime(db, monkeypatch):
    from tests.test_app import app

    monkeypatch.setattr("deploy.local.find_runtime", lambda: None)
    for var in ("SEMIF_DEPLOY_BUCKET", "SEMIF_SAGEMAKER_ROLE_ARN", "SEMIF_CODEBUILD_ROLE_ARN"):
        monkeypatch.delenv(var, raising=False)
    at = app("deploy")
    at.radio(key="dep_path").set_value("semif").run()
    at.button(key="FormSubmitter:dep_form-Plan a local run").click().run()
    assert not at.exception, at.exception
    info = " ".join(i.value for i in at.info)
    assert "No container runtime" in info and "make image" in info
    assert "dep_local" not in [b.key for b in at.button]  # nothing to press
    assert any("nothing can run in AWS" in e.value and "bucket" in e.value for e in at.error)
    (dep,) = db.list_deployments()
    assert dep["status"] == "planned"


def test_run_locally_from_the_page_becomes_a_target_and_destroy_removes_it(db, monkeypatch, tmp_path):
    """The page's Run locally and Destroy with the container calls replaced (the real container run is
    tests/image): the plan it runs is the one shown, the deployment and its audit entries are recorded,
    the running container is a SemIf target at its URL, and Destroy stops it and removes the target."""
    import subprocess

    from deploy.local import LocalEndpoint
    from tests.test_app import app

    ran, calls = [], []

    def fake_apply(self, cfg, steps, port):
        ran.append((cfg.deployment_id, [s.operation for s in steps]))
        return LocalEndpoint(cfg.deployment_id, "semif-local-x", "http://127.0.0.1:18999", self.image,
                             str(tmp_path), "0" * 64, 1.5)

    def fake_podman(self, *args, check=True, timeout=120):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "running\n", "")
    monkeypatch.setattr("deploy.local.LocalRunner.unavailable", lambda self: None)
    monkeypatch.setattr("deploy.local.LocalRunner._apply", fake_apply)
    monkeypatch.setattr("deploy.local.LocalRunner._podman", fake_podman)
    at = app("deploy")
    at.radio(key="dep_path").set_value("semif").run()
    at.button(key="FormSubmitter:dep_form-Plan a local run").click().run()
    planned = at.session_state["dep_planned"].cfg.deployment_id
    at.button(key="dep_local").click().run()
    assert not at.exception, at.exception
    assert ran and ran[0][0] == planned and "CreateModel" in ran[0][1]  # the plan that was shown
    assert any("runs locally at http://127.0.0.1:18999" in s.value for s in at.success)
    dep = db.get_deployment(planned)
    assert dep["status"] == "running-local"
    (target,) = [t for t in db.list_targets() if t["name"] == f"{dep['endpoint_name']}-local"]
    assert (target["kind"], target["config"]) == ("semif", {"url": "http://127.0.0.1:18999"})
    at.selectbox(key="dep_pick").select(planned).run()
    at.button(key="dep_destroy_local").click().run()
    assert not at.exception, at.exception
    assert calls[-1][:2] == ("rm", "-f") and calls[-1][-1] == f"semif-local-{dep['endpoint_name']}"
    assert db.get_deployment(planned)["status"] == "deleted"
    assert [a["action"] for a in db.audit_log(planned)] == ["plan", "plan", "apply-local", "destroy-local"]
    assert not any(t["name"] == f"{dep['endpoint_name']}-local" for t in db.list_targets())


def test_a_local_run_that_fails_stays_on_screen_and_is_recorded(db, monkeypatch):
    from tests.test_app import app

    monkeypatch.setattr("deploy.local.find_runtime", lambda: TRUE)  # says the image exists; labels it nothing
    at = app("deploy")
    at.radio(key="dep_path").set_value("semif").run()
    at.button(key="FormSubmitter:dep_form-Plan a local run").click().run()
    at.button(key="dep_local").click().run()
    assert not at.exception, at.exception
    assert any("Local run of" in e.value and "make image" in e.value for e in at.error)
    (dep,) = db.list_deployments()
    assert dep["status"] == "failed" and db.audit_log(dep["id"])[-1]["action"] == "apply-local"
