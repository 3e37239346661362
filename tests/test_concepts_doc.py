"""docs/concepts.md says where each concept lives: every `path.py` it names exists and defines each
`Name` named beside it (a class, function or assignment at its top level; an import does not count), so a rename or a move fails here instead of
leaving the map wrong - the way the README's layout once named a module a release after it was split."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "concepts.md"


def rows() -> list[tuple[str, list[str], str]]:
    """(concept, names, module path) for every table row of the page."""
    out = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("concept", "---") or set(cells[0]) <= {"-"}:
            continue
        names = re.findall(r"`([A-Za-z_]\w*)`", cells[1])
        (path,) = re.findall(r"`([\w/]+\.py)`", cells[2])
        out.append((cells[0], names, path))
    return out


def defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_page_has_rows():
    assert len(rows()) >= 30


def problems(table: list[tuple[str, list[str], str]]) -> list[str]:
    """What is wrong with the rows: a module that does not exist, a name it does not define."""
    wrong = []
    for concept, names, path in table:
        file = ROOT / path
        if not file.is_file():
            wrong.append(f"{concept}: {path} does not exist")
            continue
        missing = [n for n in names if n not in defined(file)]
        if missing:
            wrong.append(f"{concept}: {path} defines no {missing}")
    return wrong


def test_every_named_module_and_type_exists():
    wrong = problems(rows())
    assert not wrong, "docs/concepts.md is out of date:\n" + "\n".join(wrong)


def test_the_check_fails_on_a_wrong_row(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class A:\n    pass\nB = 1\n")
    assert {"A", "B"} <= defined(src) and "C" not in defined(src)
    right = ("a decision row", ["DecisionRequest"], "adapter/schema.py")
    assert problems([right]) == []
    assert problems([("a decision row", ["DecisionRequest", "NoSuchType"], "adapter/schema.py")]) == \
        ["a decision row: adapter/schema.py defines no ['NoSuchType']"]
    assert problems([("moved", ["Head"], "adapter/engine/head.py")]) == ["moved: adapter/engine/head.py does not exist"]
    assert problems([right, ("imported only", ["Guard"], "adapter/schema.py")]), "an import is not a definition"
