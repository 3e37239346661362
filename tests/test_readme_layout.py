"""The README's layout is the map a new engineer reads first: every file it names exists, and every module
of every package is named in it - so it cannot go stale again (it once named app/core/evaluation.py a
release after that file was split, and left out four modules)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the rooms of the layout block: a line starting with one of these names the folder later lines are in
ROOMS = {"adapter/": "adapter", "engine/": "adapter/engine", "server/": "adapter/server", "deploy/": "deploy", "app/": "app", "views/": "app/views", "cli/": "app/cli",
         "ui/": "app/ui", "service/": "app/service", "core/": "app/core", "targets/": "app/targets", "bench/": "bench"}
# app/views is one page per file, listed in the README's page table instead; app/cli is named by command
CHECKED = ("adapter", "adapter/engine", "adapter/server", "deploy", "app", "app/cli", "app/ui", "app/service", "app/core", "app/core/robustness",
           "app/core/tables", "app/targets", "bench")
SUBPACKAGES = ("robustness", "tables")  # app/core's subpackages: named as `NAME/ (its modules)` on one line


def layout_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return block.splitlines()


def named_files(loose: bool = False) -> dict[str, set[str]]:
    """folder -> the file names the README names in that folder's part of the layout; with `loose`, the
    commands app/cli names by word too."""
    out: dict[str, set[str]] = {room: set() for room in CHECKED}
    folder = None
    for line in layout_block():
        head = line.strip().split(" ", 1)[0]
        if line[:1].strip() or line.startswith("  ") and not line.startswith("    "):
            folder = ROOMS.get(head)  # a new room (top level or app's sub-rooms); other rooms end the last one
        if folder is None:
            continue
        for sub, inner in re.findall(rf"\b({'|'.join(SUBPACKAGES)})/ \(([^)]*)\)", line):  # a subpackage's own modules
            out[f"app/core/{sub}"] |= set(re.findall(r"([A-Za-z_]\w*\.py)", inner))
            out[folder].add(f"{sub}/")
        line = re.sub(rf"\b({'|'.join(SUBPACKAGES)})/ \([^)]*\)", "", line)
        for name in re.findall(r"([A-Za-z_][\w]*\.(?:py|yml))", line):
            out[folder].add(name)
        if folder == "app/cli" and loose:  # commands by name: "calibrate, bench, robustness, check, import_log; deploy"
            out[folder] |= {f"{w}.py" for w in re.findall(r"\b([a-z_]+)\b", line)}
    return out


def test_every_file_the_readme_names_exists():
    missing = [f"{folder}/{name}" for folder, names in named_files().items() for name in names
               if not (ROOT / folder / name).exists()]
    assert not missing, f"README's layout names files that do not exist: {missing}"


def test_every_module_is_named_in_the_readme():
    named = named_files(loose=True)
    unnamed = []
    for folder in CHECKED:
        for path in sorted((ROOT / folder).iterdir()):
            if path.name == "__init__.py" or path.name.startswith(".") or path.name == "__pycache__":
                continue
            if path.is_dir():
                if (path / "__init__.py").exists() and f"{path.name}/" not in named[folder] and \
                        path.name not in {r.rstrip("/") for r in ROOMS}:
                    unnamed.append(f"{folder}/{path.name}/")
                continue
            if path.suffix == ".py" and path.name not in named[folder]:
                unnamed.append(f"{folder}/{path.name}")
    assert not unnamed, f"modules the README's layout does not name (add each with what it holds): {unnamed}"
