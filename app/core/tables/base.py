"""The store's connection and what every table module shares: one SQLite file, a connection per call
(Streamlit's per-rerun threads never share one), `write()` for one locked transaction, JSON and state
columns encoded and decoded the same way, and StoreUnavailable for a file that cannot take the call."""
from __future__ import annotations

import json
import os
import sqlite3
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import sqlite_utils

JSON_COLUMNS = {"options", "examples", "config", "policy", "target", "option_ids", "probabilities",
                "request", "response", "meta", "plan"}


STATE_COLUMNS = {"state"}  # a state is text or JSON: stored tagged so each comes back as it went in


def encode_state(state: Any) -> str:
    """'t:' + text, or 'j:' + JSON for an object/array state: the text "42" stays text, and an
    object state is scored as the same object (rendered like the adapter renders it)."""
    return "t:" + state if isinstance(state, str) else "j:" + json.dumps(state, ensure_ascii=False)


def decode_state(stored: Any) -> Any:
    if isinstance(stored, str) and stored[:2] in ("t:", "j:"):
        return stored[2:] if stored[0] == "t" else json.loads(stored[2:])
    return stored  # written before the tagged encoding: text


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


BUSY_TIMEOUT_MS = 5000  # how long a write waits for another writer's transaction before giving up


class StoreUnavailable(RuntimeError):
    """The database file cannot be used: the message is one line naming the file and the fix."""


# SQLite's primary result codes for "this file cannot take writes" (sqlite3.Error.sqlite_errorcode & 0xff)
_READONLY, _FULL, _CANTOPEN, _IOERR, _BUSY, _PERM, _CORRUPT, _NOTADB = 8, 13, 14, 10, 5, 3, 11, 26


def unavailable(path: Path, exc: BaseException) -> StoreUnavailable | None:
    """The one-line explanation of a database error that is the file's fault, or None for other
    errors (a bug: those keep their traceback)."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    what = str(exc)
    if code in (_CORRUPT, _NOTADB) or "not a database" in what or "malformed" in what:
        return StoreUnavailable(f"cannot use the workbench database {path} ({what}): the file is not a SQLite database "
                                "or is damaged - restore it from a copy, or point SEMIF_DB (--db) at another file (a "
                                "new one is created); nothing was changed in it")
    read_only = not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK))
    if (isinstance(exc, PermissionError) or code in (_READONLY, _PERM) or "readonly" in what
            or (code == _CANTOPEN and read_only)):  # a WAL file cannot even be read without its -shm beside it
        fix = ("the file or its folder is read-only: make both writable (the folder holds SQLite's -wal and -shm "
               "files), or point SEMIF_DB (--db) at a writable copy")
    elif code == _FULL or "disk is full" in what or getattr(exc, "errno", None) == 28:
        fix = "the disk is full: free some space there, then run it again (it resumes where it stopped)"
    elif code == _CANTOPEN or isinstance(exc, OSError):
        fix = ("the file cannot be opened: check that its folder exists and is writable, or point SEMIF_DB (--db) "
               "at another file")
    elif code == _IOERR:
        fix = "the disk reported an I/O error: check the disk (or free space), then run it again"
    elif code == _BUSY:
        fix = (f"another process kept it locked for more than {BUSY_TIMEOUT_MS / 1000:g} s: wait for it to finish, "
               "then try again")
    else:
        return None
    return StoreUnavailable(f"cannot write the workbench database {path} ({what}): {fix}; nothing already saved "
                            "was lost")


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.loads(v) if k in JSON_COLUMNS and isinstance(v, str) and v
                else decode_state(v) if k in STATE_COLUMNS else v) for k, v in row.items()}


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.dumps(v, ensure_ascii=False) if k in JSON_COLUMNS and v is not None and not isinstance(v, str)
                else encode_state(v) if k in STATE_COLUMNS and v is not None else v) for k, v in row.items()}


class Connection:
    """The file every table class reads and writes (app/core/store.Store composes them over one path)."""

    path: Path

    @contextmanager
    def db(self) -> Iterator[sqlite_utils.Database]:
        """A connection for one call; a file that cannot take the call raises StoreUnavailable."""
        db = None
        try:
            db = sqlite_utils.Database(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000))
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            yield db
        except (sqlite3.OperationalError, sqlite3.DatabaseError, OSError) as exc:
            problem = unavailable(self.path, exc)
            if problem is None:
                raise
            raise problem from None
        finally:
            if db is not None:
                db.close()

    @contextmanager
    def write(self) -> Iterator[sqlite_utils.Database]:
        """One write transaction, locked from its first statement (BEGIN IMMEDIATE): what it reads is
        what it writes against - no other writer can come in between - and it commits or rolls back
        as a whole (sqlite-utils' own statements inside join it instead of committing)."""
        with self.db() as db:
            db.conn.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.conn.rollback()
                raise
            db.conn.commit()
