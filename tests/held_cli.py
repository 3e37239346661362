"""`python -m app` with a test-only hold: a controlled pause in the scoring instead of a guess at its speed.

Run as `python -m tests.held_cli calibrate ...` (the same arguments as `python -m app`) with
SEMIF_TEST_HOLD_AFTER=N: once the N-th result of this process is saved, the store's add_result holds, printing
`HOLDING N` to stderr, until the file SEMIF_TEST_RELEASE names exists (without one: until the process is
killed). Everything else is the real command - the model, the store, the run's lease and its heartbeat.

Why: a test that kills a run mid-way, or starts a second worker while the first is still scoring, waited for a
few results and assumed the rest would take longer than its next step; on a fast machine they did not.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from app.__main__ import main
from app.core.store import Store

_add_result = Store.add_result
AFTER = int(os.environ.get("SEMIF_TEST_HOLD_AFTER", "0"))
RELEASE = os.environ.get("SEMIF_TEST_RELEASE")
saved = 0


def add_result(self: Store, run_id: int, row: dict[str, Any], lease: str | None = None) -> None:
    global saved
    _add_result(self, run_id, row, lease)
    saved += 1
    if AFTER and saved == AFTER:
        print(f"HOLDING {saved}", file=sys.stderr, flush=True)
        while RELEASE is None or not Path(RELEASE).exists():
            time.sleep(0.02)


Store.add_result = add_result  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
