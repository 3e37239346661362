"""One exit-code convention for every `python -m app` command (written out in docs/ci-check.md#exit-codes).
Its own module, so that `python -m app` reads it without the commands' imports."""
from __future__ import annotations

EXIT_OK = 0  # done; for `check`, every threshold holds
EXIT_FAILED = 1  # the command ran and what it checks failed (`check`: a threshold does not hold)
EXIT_USAGE = 2  # a bad argument, input file, policy or target name: one line names it, nothing was scored
EXIT_UNREACHABLE = 3  # `--strict`: the target could not be reached or the gate is unreachable
EXIT_BUSY = 4  # another process holds the run
EXIT_STORE = 5  # the workbench database cannot be used (read-only, full disk, not a database)


class UsageProblem(ValueError):
    """A bad argument or input, found before any work: `python -m app` prints it as one line and exits 2."""
