"""The layout the README promises, checked on the source: pages and commands collect input and show
results - every action goes through app/service - and the rooms below them import no UI."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"
# where scoring, gating, pricing and planning live: never imported by a page, a command or a UI helper
LOGIC = ("app.core.runner", "app.core.evaluation", "app.core.calibration", "app.core.costs", "app.core.analysis",
         "app.core.order_sensitivity", "app.core.reuse", "app.core.check", "app.core.decision_import",
         "deploy.plan", "deploy.prepare", "deploy.package", "deploy.pricing", "deploy.validate", "deploy.autoscaling",
         "deploy.executor", "adapter.engine", "adapter.calibrated")


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


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


def test_pages_import_only_the_service_layer_and_ui_helpers():
    for page in pages():
        ours = {m for m in imports(page) if m.split(".")[0] in ("app", "adapter", "deploy")}
        stray = sorted(m for m in ours if not m.startswith(("app.service", "app.ui")))
        assert not stray, f"{page.name} imports {stray}: call app/service instead"


def test_commands_and_ui_helpers_import_no_scoring_gating_pricing_or_planning():
    for path in sorted((APP / "cli").glob("*.py")) + sorted((APP / "ui").glob("*.py")) + pages():
        used = {m for m in imports(path) if m.startswith(LOGIC)}
        assert not used, f"{path.relative_to(ROOT)} imports {sorted(used)}: that logic belongs behind app/service"


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
              "views/deploy.py": {"deploy.plan", "deploy.apply", "deploy.destroy"},
              "views/policies.py": {"policies.save", "policies.add_template", "policies.duplicate"},
              "views/targets.py": {"targets.add", "targets.test"},
              "views/review.py": {"review.queue", "review.label", "review.add_version"},
              "views/history.py": {"production.import_log", "production.replay"},
              "cli/calibrate.py": {"evaluate.evaluate_one", "evaluate.calibrate", "evaluate.export"},
              "cli/bench.py": {"decide.bench"}, "cli/check.py": {"ci_check.check"},
              "cli/robustness.py": {"checks.robustness_check"}, "cli/import_log.py": {"production.import_log"}}
    for where, actions in expect.items():
        assert actions <= listed[where], f"{where} calls {sorted(listed[where])}; expected {sorted(actions)} among them"


def test_the_domain_and_the_service_layer_never_import_streamlit():
    for room in ("core", "service", "targets"):
        for path in sorted((APP / room).glob("*.py")):
            assert not any(m.split(".")[0] in ("streamlit", "plotly") for m in imports(path)), path.name
