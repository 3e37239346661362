"""The safe-path rule for every file named after user input (a policy id, a deployment tag, an upload's
name): the name is checked against one pattern, and the path is resolved and must stay inside its folder.

Two checks, because either alone has failed elsewhere: a pattern alone misses a folder that is itself a
symlink pointing out, and resolving alone lets `../../x` through when the folder is created on the way
(`mkdir(parents=True)` made the parents of an escaped path before anything compared it).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
NAME_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..')"


class UnsafePath(ValueError):
    """A name that would leave its folder, or is not a plain file name."""


def name_problem(name: str) -> str | None:
    """Why `name` cannot be (part of) a file name, or None."""
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name) or ".." in name:
        return f"{str(name)[:80]!r} is not a safe name: use {NAME_RULE}"
    return None


MAX_NAME = 128
HASH_CHARS = 12


def file_name(stem: str, suffix: str) -> str:
    """The file name for `stem` + `suffix` that fits the 128-character rule whatever valid id the stem
    holds: as is when it fits; else the stem cut to leave room for '-', the first 12 hex digits of the
    stem's sha256, and the suffix (two long ids that share a prefix still get two files)."""
    name = stem + suffix
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(stem.encode("utf-8")).hexdigest()[:HASH_CHARS]
    return f"{stem[: MAX_NAME - len(suffix) - HASH_CHARS - 1]}-{digest}{suffix}"


def inside(folder: Path, *parts: str) -> Path:
    """folder / part1 / part2 ..., each part a safe name and the resolved path inside the resolved
    folder; UnsafePath otherwise. Creates nothing."""
    for part in parts:
        problem = name_problem(part)
        if problem:
            raise UnsafePath(problem)
    base = Path(folder).resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and base not in path.parents:
        raise UnsafePath(f"{'/'.join(parts)!r} resolves outside {base}: use {NAME_RULE}")
    return path
