"""No page function over 60 lines: a page lays out what app/service builds (a display object per panel),
so a long page function is logic that belongs below it. Counted from the `def` line to the last line.

Every file of app/views and app/ui is held to it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 60
FOLDERS = ("app/views", "app/ui")


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int]]:
    """(name, lines) of every function, nested ones included, longer than `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                out.append((node.name, lines))
    return out


def files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_view_function_over_60_lines(path: Path) -> None:
    found = long_functions(path.read_text())
    assert not found, f"{path.relative_to(ROOT)}: {', '.join(f'{n} ({k} lines)' for n, k in found)} - build the " \
                      "panel in app/service and lay it out here"


def test_there_are_pages_to_check() -> None:
    assert len(files()) >= 20


def test_the_size_check_counts_def_to_last_line() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    assert not long_functions(f"def f():\n{body}\n")  # 60 lines: fine
    assert long_functions(f"def f():\n{body}\n    return 1\n") == [("f", 61)]
    nested = "def outer():\n    def inner():\n" + "\n".join(f"        y{i} = {i}" for i in range(61)) + "\n"
    assert ("inner", 62) in long_functions(nested)
