"""No page prints an object by accident (issue 44): Streamlit's *magic* st.write()s every bare expression
statement of a page script that is not a call - `st.success(...) if ok else st.info(...)` written as a
statement rendered a DeltaGenerator's whole docstring under the Calibrate page's recommendation.

Two checks: the page scripts (app/main.py and app/views/*.py, the files Streamlit runs with magic) hold no
such statement; and every page, rendered by AppTest on a seeded workbench, shows no `help` element
(what st.write of an object draws) - with a page that does the dump to prove the check can fail."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "app" / "views").glob("*.py"))
QUIET = (ast.Call, ast.Yield, ast.YieldFrom, ast.Await)


def magic_statements(source: str) -> list[int]:
    """Lines of the bare expression statements magic would st.write (calls, yields and docstrings it skips)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):  # magic leaves a class body alone (only its methods are walked)
            continue
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if not isinstance(stmt, ast.Expr) or isinstance(stmt.value, QUIET):
                continue
            docstring = (i == 0 and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
                         and isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)))
            if not docstring:
                out.append(stmt.lineno)
    return out


def test_the_static_check_sees_a_conditional_expression_statement():
    assert magic_statements("import streamlit as st\ndef f(ok):\n    st.success('a') if ok else st.info('b')\n") == [3]
    assert magic_statements("def f():\n    '''doc'''\n    st.info('x')\n    return 1\n") == []
    assert magic_statements("class C:\n    '''doc'''\n    def m(self):\n        self.x\n") == [4]


@pytest.mark.parametrize("path", [ROOT / "app" / "main.py", *[p for p in PAGES if p.name != "__init__.py"]],
                         ids=lambda p: p.name)
def test_no_page_script_holds_a_statement_magic_would_print(path):
    lines = magic_statements(path.read_text())
    assert not lines, f"{path.relative_to(ROOT)}:{lines}: a bare expression statement - Streamlit's magic prints " \
                      "its value (write an if statement, or assign it)"


def dumps(at: AppTest) -> list[str]:
    return [str(getattr(e, "proto", e))[:200] for e in at.get("help")]


def test_the_rendered_check_fails_on_a_dump(tmp_path):
    page = tmp_path / "bad.py"
    page.write_text("import streamlit as st\nok = True\nst.success('a') if ok else st.info('b')\n")
    at = AppTest.from_file(str(page), default_timeout=60).run()
    assert dumps(at), "the check must see what magic draws"


def test_no_page_draws_a_dump(db):
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300)
    at.run()
    assert not dumps(at)
    at.button(key="pg_seed").click().run()  # the templates, so that pages have something to show
    for path in PAGES:
        if path.name == "__init__.py":
            continue
        at.switch_page(f"views/{path.name}").run()
        assert not at.exception, (path.name, at.exception)
        assert not dumps(at), (path.name, dumps(at))
