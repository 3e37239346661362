"""Types at the seams: no function, method or record in app/ or adapter/ hands an untyped value - `Any`, a bare
`dict`, `dict[str, Any]`, `Mapping[str, Any]`, or one inside a list, tuple or union - to another package, or
takes one from it, except at the JSON edges (HTTP bodies, files, downloads). ALLOWED lists those, each with
the edge it serves; UNTYPED_TODAY (tests/seams_untyped.txt) the ones not typed yet, which may only shrink;
a new one fails until it is typed (a frozen dataclass where callers read attributes, a TypedDict where they
genuinely read by key - app/core/records.py) or listed with its reason.

Read from the source with ast, like tests/test_layout.py (whose import reading this reuses):
- what is checked: a function's or method's return annotation (`module.function`), each annotated parameter
  (`module.function(param)`, *args and **kwargs included), and each annotated field of a dataclass, a pydantic
  model or a NamedTuple (`module.Class.field`; ClassVars and _private names are not fields).
- an annotation is untyped when it holds `Any`, or a mapping in it is bare or has `object` (or an untyped
  mapping) in its value type; `dict[str, float]` and TypedDicts are typed. Module-level aliases (`Config =
  dict[str, Any]`), imported ones too, are read through.
- a function is used across a boundary when a module of another package imports it, or reads it as an
  attribute of its module (`analysis.summary(...)`). A method is, when a module of another package reads an
  attribute of its name on anything but a module, `self` or `cls`, and the class's package is below it in
  EDGES (directly or through what it may import): the checker cannot know the receiver's type, so a name
  shared with another class errs toward listing it. A field is, when its class is used across a boundary
  (as a function is) or its name is read as a method's is.
- packages are EDGES' rows (tests/test_layout.py: app.core with app.core.robustness, app.service, ...);
  under adapter/ each subpackage counts on its own (adapter.server, adapter.engine), by its dotted name.

The self-tests at the bottom feed the checker synthetic sources and expect it to flag or pass them.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tests.test_layout import EDGES, from_base, row_of, source_files, under

DEFINED_IN = ("app", "adapter")  # where a returned mapping is looked for; users are every module of ours
SPLIT = ("adapter",)  # packages whose subpackages count as packages of their own
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping", "OrderedDict", "DefaultDict", "defaultdict"}
LOOSE = {"Any", "object"}  # in a mapping's values
RECORD_BASES = {"BaseModel", "NamedTuple"}  # a class with fields (and every class of ours built on one)

# -- the allowed ones: "module.function" (or "module.Class.method") -> the JSON edge it serves -------------
ALLOWED: dict[str, str] = {
    # JSON edges
    "adapter.schema.DecisionResult.public": "HTTP body: a decision's JSON response",
    "adapter.policy.CalibratedPolicy.request_fields": "HTTP body: a raw request row's fields, as its policy fills them",
    "adapter.policy.Decision.as_json": "HTTP body: the response's `decision` field",
    "app.core.robustness.report.Summary.to_json": "file: the robustness summary (the command's --out, the page's JSON download)",
    "adapter.engine.session.ModelInfo.public": "HTTP body: the model description the server reports",
    "adapter.engine.templates.load_template": "file: a policy template (data/policies/*.json)",
    "adapter.engine.templates.list_templates": "file: the policy templates (data/policies/*.json)",
    "adapter.engine.templates.load_jsonl": "file: a JSONL case file",
    "adapter.engine.templates.probe_cases": "file: data/cases/probe.jsonl",
    # tables a page shows and offers as CSV (st.dataframe / download_frame), the command prints
    "app.service.evaluate.by_version": "download: the readouts side by side, one row per run (table and CSV)",
    "app.service.evaluate.source_rows": "download: the head-source comparison (table and CSV)",
    "app.service.calibrate_panels.option_gate_rows": "download: the per-option gates and their evidence (table)",
    "app.service.label_issues.Issue.row": "download: a likely wrong label as a row of the table Calibrate and "
                                          "Review show",
    "app.service.checks.family_rows": "download: the steering families' rates (table and chart)",
    "app.service.checks.head_rows": "download: steering with the calibrated policy beside the model (table)",
    "app.service.checks.rate_rows": "download: the robustness rates with intervals (chart and table)",
    "app.service.checks.template_rows": "download: the hijack rate per steering template (chart and table)",
    "app.service.checks.OrderCheck.summary": "download: the order check's summary (JSON, summary_json)",
    "app.core.drift.Drift.to_dict": "download: two runs side by side (the drift report's JSON and HTML)",
    "app.core.drift.Pair.to_dict": "download: one row of the drift report (its JSON)",
    # what is stored as JSON or sent in a request
    "app.core.robustness.suite.Suite.to_dict": "file: a robustness suite as the run stores it (config.suite) and saves it",
    "app.core.decision_import.import_records": "file: the import summary stored with the run (config.import)",
    "app.service.evaluate.Export.to_json": "file: the exported calibrated policy (semif-policy/1 JSON), as saved and downloaded",
    "app.service.deploy.load_calibrated": "file: an uploaded calibrated policy (semif-policy/1 JSON), validated",
    "app.service.deploy.from_registry": "file: a registry version's calibrated policy (semif-policy/1 JSON), resolved and validated",
    "app.ui.resources.secrets": "file: .streamlit/secrets.toml as Streamlit reads it",
    "app.core.runs.Variant.overrides": "HTTP body: the decision request's readout/debias/permute fields for a variant",
    "app.service.decide.overrides": "HTTP body: the decision request's readout/debias/permute fields",
    "app.core.pool.request_like(state)": "HTTP body: a pool row's state as the decision request carries it (adapter.schema.State, any JSON value)",
    "adapter.engine.engine.Engine.guard_check": "HTTP body: the steering guard's finding (the response's `guard`)",
    # the exported policy file and its parts (adapter.policy validates it; docs/policy-format.md)
    "app.core.calibration.Gate.to_dict": "file: the exported policy's metrics.gate_selection",
    "app.core.calibration.Correction.to_dict": "file: the exported policy's metrics.correction.candidates",
    "app.core.heads.HeadFit.to_dict": "file: the exported policy's metrics.head.candidates",
    "app.core.labeled.ColumnMap.apply": "file: a row of an uploaded labeled set, its metadata columns as they are "
                                        "(listed by name: the `.apply` service.deploy calls is the executor's)",
    "app.core.head_sources.table_rows": "download: the head-source comparison as a table and CSV (one column title "
                                        "is computed: $ per 1,000 on the deployment's instance)",
    "app.targets.registry.config_from_form": "file: a target's config as the store saves it (JSON; per kind, its "
                                             "fields declared in registry.KINDS and checked by Kind.undeclared)",
}


# -- reading the source ---------------------------------------------------------------------------------
Where = Literal["returns", "parameter", "field"]


@dataclass(frozen=True)
class Untyped:
    """A return annotation, a parameter or a record's field that holds an untyped value."""
    module: str
    qualname: str  # function, Class.method, or Class (a field's)
    where: Where
    annotation: str
    line: int
    part: str = ""  # the parameter's or the field's name

    @property
    def name(self) -> str:
        base = f"{self.module}.{self.qualname}"
        return {"returns": base, "parameter": f"{base}({self.part})", "field": f"{base}.{self.part}"}[self.where]

    @property
    def method(self) -> bool:
        return "." in self.qualname

    @property
    def attr(self) -> str:  # the name a caller writes
        return self.qualname.rpartition(".")[2]


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def untyped(annotation: ast.expr, aliases: dict[str, ast.expr] | None = None) -> bool:
    """Whether the annotation holds Any, or a mapping in it is bare or holds object (or an untyped mapping) in
    its values."""
    aliases = aliases or {}
    nodes = [n for n in ast.walk(annotation) if isinstance(n, ast.expr)]
    subscripted = {id(n.value) for n in nodes if isinstance(n, ast.Subscript)}

    def loose(value: ast.expr) -> bool:
        return any(isinstance(n, (ast.Name, ast.Attribute)) and _base_name(n) in LOOSE for n in ast.walk(value)) \
            or untyped(value, aliases)

    def bad(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
            return untyped(ast.parse(node.value, mode="eval").body, aliases)
        if isinstance(node, ast.Subscript) and _base_name(node.value) in MAPPINGS:
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return len(args) < 2 or loose(args[-1])
        if isinstance(node, (ast.Name, ast.Attribute)) and _base_name(node) in MAPPINGS:
            return id(node) not in subscripted
        if isinstance(node, (ast.Name, ast.Attribute)) and _base_name(node) == "Any":
            return True
        return isinstance(node, ast.Name) and node.id in aliases and untyped(aliases[node.id], aliases)

    return any(bad(n) for n in nodes)


def _alias_values(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level `Name = <a type with a mapping>` and `Name: TypeAlias = ...`."""
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                and _base_name(node.annotation) == "TypeAlias":
            name, value = node.target.id, node.value
        else:
            continue
        if isinstance(value, (ast.Subscript, ast.Name, ast.Attribute, ast.BinOp)) and any(
                isinstance(n, (ast.Name, ast.Attribute)) and _base_name(n) in MAPPINGS for n in ast.walk(value)):
            out[name] = value
    return out


@dataclass(frozen=True)
class Source:
    module: str
    tree: ast.Module
    package: str  # what its relative imports are relative to

    def imports(self, known: set[str]) -> list[tuple[str, str, str | None]]:
        """Every name an import binds, module-level or local: (name, our module, name in it or None for
        the module itself)."""
        out: list[tuple[str, str, str | None]] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                out += [(a.asname, a.name, None) if a.asname else (a.name.split(".")[0], a.name.split(".")[0], None)
                        for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = from_base(node, self.package)
                out += [(a.asname or a.name, *((f"{base}.{a.name}", None) if f"{base}.{a.name}" in known
                                               else (base, a.name))) for a in node.names]
        return out

    def bindings(self, known: set[str]) -> dict[str, tuple[str, str | None]]:
        return {local: (module, name) for local, module, name in self.imports(known)}


def parse_sources(texts: dict[str, str], packages: set[str]) -> list[Source]:
    """`packages`: the modules that are a package's __init__ (relative imports resolve from themselves)."""
    return [Source(m, ast.parse(t), m if m in packages else m.rpartition(".")[0]) for m, t in texts.items()]


def package_of(module: str, packages: set[str]) -> str:
    """The package a module belongs to for this check: its EDGES row; under adapter/, its subpackage."""
    row = row_of(module, EDGES) or ".".join(module.split(".")[:2])
    if row in SPLIT:
        parts = module.split(".")
        inner = [".".join(parts[:n]) for n in range(len(parts), 1, -1) if ".".join(parts[:n]) in packages]
        return inner[0] if inner else row
    return row


def _record_classes(sources: list[Source]) -> set[tuple[str, str]]:
    """(module, class) of every dataclass, pydantic model and NamedTuple of ours: decorated @dataclass, or
    built on BaseModel, NamedTuple or a class of ours that is one (by name, through any number of levels)."""
    classes = [(s.module, c) for s in sources for c in s.tree.body if isinstance(c, ast.ClassDef)]
    out = {(m, c.name) for m, c in classes if any(_base_name(d.func if isinstance(d, ast.Call) else d) == "dataclass"
                                                  for d in c.decorator_list)}
    bases = set(RECORD_BASES)
    while True:
        more = {(m, c.name) for m, c in classes if any(_base_name(b) in bases for b in c.bases)} - out
        if not more:
            return out
        out |= more
        bases |= {name for _, name in more}


def _fields(c: ast.ClassDef) -> list[ast.AnnAssign]:
    return [f for f in c.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
            and not f.target.id.startswith("_") and _base_name(f.annotation) != "ClassVar"
            and not (isinstance(f.annotation, ast.Subscript) and _base_name(f.annotation.value) == "ClassVar")]


def untyped_seams(sources: list[Source]) -> list[Untyped]:
    """Every return annotation, annotated parameter and record field in app/ and adapter/ that is untyped,
    of module-level functions, methods and classes."""
    aliases = {s.module: _alias_values(s.tree) for s in sources}
    known = {s.module for s in sources}
    records = _record_classes(sources)
    out = []
    for s in sources:
        if not s.module.startswith(DEFINED_IN):
            continue
        seen = dict(aliases[s.module])
        for local, (mod, name) in s.bindings(known).items():  # an alias imported from another module of ours
            if name is not None and name in aliases.get(mod, {}):
                seen.setdefault(local, aliases[mod][name])
        classes = [c for c in s.tree.body if isinstance(c, ast.ClassDef)]
        defs = [(f.name, f) for f in s.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        defs += [(f"{c.name}.{f.name}", f) for c in classes
                 for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for q, f in defs:
            if f.returns is not None and untyped(f.returns, seen):
                out.append(Untyped(s.module, q, "returns", ast.unparse(f.returns), f.lineno))
            a = f.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x is not None)]:
                if arg.annotation is not None and untyped(arg.annotation, seen):
                    out.append(Untyped(s.module, q, "parameter", ast.unparse(arg.annotation), arg.lineno, arg.arg))
        for c in classes:
            if (s.module, c.name) in records:
                out += [Untyped(s.module, c.name, "field", ast.unparse(f.annotation), f.lineno, f.target.id)
                        for f in _fields(c) if isinstance(f.target, ast.Name) and untyped(f.annotation, seen)]
    return out


def uses(source: Source, known: set[str]) -> tuple[set[tuple[str, str]], set[str]]:
    """What a module reads of ours: ({(module, name)} by import or module attribute, {other attribute names})."""
    bound = source.bindings(known)
    dotted = {".".join(m.split(".")[:n]) for m in known for n in range(1, m.count(".") + 2)}  # app, app.core, ...
    named: set[tuple[str, str]] = {(m, n) for _, m, n in source.imports(known) if n is not None}

    def module_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            m, n = bound.get(node.id, (None, None))
            return m if m is not None and n is None else None
        if isinstance(node, ast.Attribute):
            inner = module_of(node.value)
            return f"{inner}.{node.attr}" if inner and f"{inner}.{node.attr}" in dotted else None
        return None

    other: set[str] = set()
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Attribute):
            owner = module_of(node.value)
            if owner is not None:
                named.add((owner, node.attr))
            elif not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                other.add(node.attr)
    return named, other


def reaches(module: str, owner: str) -> bool:
    """Whether `module` can hold an object of a class in `owner`: its EDGES row reaches the owner's, directly
    or through rows it may import (a page holds a core record handed up through the service layer)."""
    seen, todo = set(), [row_of(module, EDGES)]
    while todo:
        row = todo.pop()
        if row is None or row in seen:
            continue
        seen.add(row)
        if row_of(owner, EDGES) == row:
            return True
        todo += [row_of(t, EDGES) for t in EDGES.get(row, ())]
    return False


def crossings(sources: list[Source], packages: set[str]) -> dict[str, set[str]]:
    """{untyped return, parameter or field: the modules of other packages that use it}."""
    known = {s.module for s in sources}
    used = {s.module: uses(s, known) for s in sources}

    def users(module: str, name: str, method: bool) -> set[str]:
        home, attr = package_of(module, packages), name.rpartition(".")[2]
        return {m for m, (named, other) in used.items() if package_of(m, packages) != home
                and (attr in other and reaches(m, module) if method else (module, name) in named)}

    out: dict[str, set[str]] = {}
    for r in untyped_seams(sources):
        found = (users(r.module, r.qualname, False) | users(r.module, f"{r.qualname}.{r.part}", True)
                 if r.where == "field" else users(r.module, r.qualname, r.method))
        if found:
            out.setdefault(r.name, set()).update(found)
    return out


def tree() -> tuple[list[Source], set[str]]:
    files = source_files()
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    return parse_sources({m: p.read_text() for m, p in files.items()}, packages), packages


# -- the tests ----------------------------------------------------------------------------------------
SOURCES, PACKAGES = tree()
FOUND = crossings(SOURCES, PACKAGES)
WHERE = {r.name: f"line {r.line}: {r.where} {r.annotation}" for r in untyped_seams(SOURCES)}
EDGE_WORDS = ("HTTP body:", "file:", "download:")  # what an ALLOWED reason starts with
TODAY_FILE = Path(__file__).with_name("seams_untyped.txt")


def untyped_today(text: str) -> set[str]:
    """The names in seams_untyped.txt: one a line; blank lines and # comments skipped."""
    return {line.split("#")[0].strip() for line in text.splitlines()} - {""}


UNTYPED_TODAY = untyped_today(TODAY_FILE.read_text())


def test_no_untyped_value_crosses_a_package_boundary_but_at_the_listed_json_edges():
    new = {n: sorted(FOUND[n]) for n in sorted(set(FOUND) - set(ALLOWED) - UNTYPED_TODAY)}
    assert not new, "these hand an untyped value (Any, or a mapping with Any values) across a package boundary - " \
        "type it (a frozen dataclass, or a TypedDict where callers read by key), or list it in ALLOWED with the " \
        "JSON edge it serves:\n" + "\n".join(f"{n} ({WHERE[n]}) used by {users}" for n, users in new.items())


def test_every_allowed_one_still_crosses_and_says_why():
    gone = sorted(set(ALLOWED) - set(FOUND))
    assert not gone, f"typed or no longer used across a package boundary - drop from ALLOWED: {gone}"
    unsaid = sorted(n for n, why in ALLOWED.items() if not why.startswith(EDGE_WORDS))
    assert not unsaid, f"say which JSON edge each serves ({', '.join(EDGE_WORDS)} ...): {unsaid}"


def test_the_untyped_list_only_shrinks():
    """seams_untyped.txt: what crossed untyped when parameters, fields and Any were first checked. Typed (or
    no longer crossing): take it off the list; listed twice (there and in ALLOWED): keep the reasoned one."""
    gone = sorted(UNTYPED_TODAY - set(FOUND))
    assert not gone, f"typed or no longer used across a package boundary - delete from {TODAY_FILE.name}:\n" + \
        "\n".join(gone)
    assert not UNTYPED_TODAY & set(ALLOWED), sorted(UNTYPED_TODAY & set(ALLOWED))


# -- self-tests: the checker flags what it is there to catch, and passes what is typed -----------------
def _found(texts: dict[str, str], packages: frozenset[str] = frozenset()) -> dict[str, set[str]]:
    return crossings(parse_sources(texts, set(packages)), set(packages))


@pytest.mark.parametrize("annotation", [
    "dict", "dict[str, Any]", "Dict[str, Any]", "Mapping[str, Any]", "typing.Mapping[str, object]",
    "list[dict]", "list[dict[str, Any]]", "tuple[int, dict[str, Any]]", "dict[str, Any] | None",
    "Optional[dict]", "dict[str, list[dict]]", "dict[int, dict[str, Any]]", "'dict'", "Iterator[dict[str, Any]]",
    "Config", "list[Config]", "Any", "list[Any]", "Callable[..., Any]", "'Any'", "typing.Any | None",
])
def test_the_annotation_check_flags_untyped_mappings(annotation):
    assert untyped(ast.parse(annotation, mode="eval").body, {"Config": ast.parse("dict[str, Any]", mode="eval").body})


@pytest.mark.parametrize("annotation", [
    "Policy", "list[Policy]", "dict[str, float]", "dict[str, str | None]", "Mapping[str, int]",
    "dict[int, list[tuple[float, bool]]]", "tuple[pd.DataFrame, dict[str, np.ndarray]]", "object",
    "DecisionResult | None", "'CalibratedPolicy'", "Counter[str]",
])
def test_the_annotation_check_passes_typed_ones(annotation):
    assert not untyped(ast.parse(annotation, mode="eval").body, {})


CORE = ("from typing import Any\n"
        "Row = dict[str, Any]\n"
        "def summary() -> dict[str, Any]: ...\n"
        "def rates() -> dict[str, float]: ...\n"
        "def rows() -> list[Row]: ...\n"
        "def only_here() -> dict: ...\n"
        "class Report:\n"
        "    def to_json(self) -> dict: ...\n"
        "    def count(self) -> int: ...\n")


def test_the_checker_flags_untyped_returns_used_from_another_package():
    found = _found({"app.core.a": CORE,
                    "app.core.b": "from app.core.a import only_here\n",  # the same package: free
                    "app.service.s": "from app.core.a import summary, rates\nfrom app.core import a\n"
                                     "def f(report):\n    return a.rows(), report.to_json(), report.count()\n"})
    assert found == {"app.core.a.summary": {"app.service.s"}, "app.core.a.rows": {"app.service.s"},
                     "app.core.a.Report.to_json": {"app.service.s"}}


def test_the_checker_reads_module_attributes_aliases_and_imported_aliases():
    found = _found({"app.core.a": CORE,
                    "app.targets.t": "from app.core.a import Row\ndef spec() -> Row: ...\n",
                    "app.views.v": "import app.core.a as core_a\nx = core_a.summary\n",
                    "bench.b": "import app.core.a\nimport app.targets.t\napp.core.a.rows()\napp.targets.t.spec()\n"})
    assert found == {"app.core.a.summary": {"app.views.v"}, "app.core.a.rows": {"bench.b"},
                     "app.targets.t.spec": {"bench.b"}}


def test_the_checker_passes_typed_returns_and_self_calls():
    assert not _found({"app.core.a": CORE,
                       "app.service.s": "from app.core.a import rates, Report\n"
                                        "class Mine:\n    def go(self):\n        return self.to_json()\n"})


def test_adapter_subpackages_are_packages_of_their_own():
    engine = "def evaluate() -> list[dict]: ...\n"
    packages = frozenset({"adapter", "adapter.engine", "adapter.server"})
    found = _found({"adapter.engine.core": engine, "adapter.engine.other": "from .core import evaluate\n",
                    "adapter.server.routes": "from ..engine.core import evaluate\n",
                    "adapter.__main__": "from adapter.engine import core\ncore.evaluate()\n"}, packages)
    assert found == {"adapter.engine.core.evaluate": {"adapter.server.routes", "adapter.__main__"}}
    inside = _found({"adapter.engine.core": engine, "adapter.engine.other": "from adapter.engine.core import evaluate\n"},
                    packages)
    assert not inside, "the modules of one subpackage are one package"
    assert package_of("adapter.server", set(packages)) == "adapter.server"
    assert package_of("app.core.robustness.plan", {"app.core", "app.core.robustness"}) == "app.core"
    assert under("adapter.server.routes", package_of("adapter.server.routes", set(packages)))


PLANTED = ("from dataclasses import dataclass\n"
           "from typing import Any\n"
           "from pydantic import BaseModel\n"
           "@dataclass(frozen=True)\n"
           "class Result:\n"
           "    name: str\n"
           "    figures: dict[str, Any]\n"
           "    seen: ClassVar[dict] = {}\n"
           "class Base(BaseModel):\n"
           "    n: int\n"
           "class Model(Base):\n"
           "    extra: Any = None\n"
           "    _cache: dict = {}\n"
           "class Plain:\n"
           "    loose: dict\n"
           "def show(result: Result, options: dict[str, Any], *, n: int = 0, **kw: Any) -> str: ...\n"
           "def fine(result: Result, rates: dict[str, float]) -> list[Result]: ...\n")


def test_the_checker_flags_untyped_parameters_and_fields_used_from_another_package():
    """A planted `dict[str, Any]` parameter and field (and Any ones) fail; the typed ones beside them, a
    ClassVar, a private attribute and a plain class's annotation do not."""
    found = _found({"app.core.a": PLANTED,
                    "app.service.s": "from app.core.a import Result, Model, Plain, show, fine\n"})
    assert found == {"app.core.a.show(options)": {"app.service.s"}, "app.core.a.show(kw)": {"app.service.s"},
                     "app.core.a.Result.figures": {"app.service.s"}, "app.core.a.Model.extra": {"app.service.s"}}


def test_a_field_crosses_when_another_package_reads_it():
    """The class never imported there, only its field read off an object handed up (a page reads a core
    record through the service layer); in its own package it is free."""
    reads = "def f(r):\n    return r.figures\n"
    assert _found({"app.core.a": PLANTED, "app.views.v": reads}) == {"app.core.a.Result.figures": {"app.views.v"}}
    assert not _found({"app.core.a": PLANTED, "app.core.b": reads + "from app.core.a import show\n"})


def test_the_list_of_untyped_ones_is_read_one_a_line():
    assert untyped_today("# why\n\napp.core.a.show(options)  # a note\n app.core.a.Result.figures\n") == {
        "app.core.a.show(options)", "app.core.a.Result.figures"}
