"""Where a benchmark's table lives: written by the bench script itself, never by hand.

Each table sits in `docs/benchmarks.md` between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`;
`publish` replaces what is between the markers (or appends the block), with the date and the
conditions it was measured under, so a re-run refreshes the page and the README links to it.
"""
from __future__ import annotations

import os
import platform
import re
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
HEADER = ("# Benchmarks\n\nEvery table below is written by the script named in its heading "
          "(`python -m bench.NAME`), with the date and the machine it ran on. Timing claims are "
          "ratios measured in one run: these machines are noisy.\n")


def conditions() -> str:
    """One line: date, CPUs this process may use, machine, Python."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return f"measured {date.today().isoformat()} on {cpus} CPU(s), {platform.machine()}, Python {platform.python_version()}"


def publish(name: str, body: str, *, path: Path = BENCHMARKS, note: str = "") -> Path:
    """Put `body` (markdown) into `path` as the block `name`, replacing an earlier one."""
    block = (f"<!-- bench:{name} -->\n## `python -m bench.{name}`\n\n_{conditions()}{'; ' + note if note else ''}_\n\n"
             f"{body.rstrip()}\n<!-- /bench:{name} -->")
    text = path.read_text() if path.exists() else HEADER
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
