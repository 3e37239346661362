"""A database that cannot be written - read-only, or a disk that fills up during a calibration - ends
in one line naming the file and what to do (CLI and pages), never a traceback, and loses nothing.

The database lives on a small filesystem of its own, so that read-only and full are real: a tmpfs
(as root, where mounting is allowed; chmod does not stop root), else chmod for read-only (and the
full-disk case is skipped)."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT, subset_file, finish_tasks


def _try_mount(where: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


class Disk:
    """A folder for the database whose file system can be made read-only (and, on tmpfs, full)."""

    def __init__(self, path: Path, size: str = "8m"):
        path.mkdir()
        self.path, self.tmpfs = path, _try_mount(path, size)
        if not self.tmpfs and os.geteuid() == 0:
            pytest.skip("running as root without permission to mount a tmpfs: chmod cannot make a file read-only for root")

    @contextlib.contextmanager
    def read_only(self) -> Iterator[None]:
        if self.tmpfs:
            subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)
        else:
            modes = {p: p.stat().st_mode for p in [self.path, *self.path.iterdir()]}
            for p in modes:
                p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            if self.tmpfs:
                subprocess.run(["mount", "-o", "remount,rw", str(self.path)], check=True)
            else:
                for p, mode in modes.items():
                    p.chmod(mode)

    def fill(self) -> Path:
        """Write zeros until the file system is full (tmpfs only)."""
        filler = self.path / "filler"
        # unbuffered: a buffered file would keep the last failed block and raise ENOSPC again on close
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        return filler

    def close(self) -> None:
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def disk(tmp_path):
    d = Disk(tmp_path / "disk")
    yield d
    d.close()


def calibrate(db: Path, labeled: Path, *extra: str, wait: bool = True, hold: tuple[int, Path] | None = None):
    """`python -m app calibrate`; with `hold` (n, release): held after its n-th result until `release` exists
    (tests/held_cli.py), so a test acts mid-run on any machine."""
    args = [sys.executable, "-m", "tests.held_cli" if hold else "app", "calibrate", "--policy", "refund-check",
            "--labeled-set", str(labeled), "--db", str(db), "--quiet", *extra]
    if not wait:
        env = {**os.environ, **({"SEMIF_TEST_HOLD_AFTER": str(hold[0]), "SEMIF_TEST_RELEASE": str(hold[1])} if hold else {})}
        return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def results(db: Path) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT run_id, row_key, error FROM results ORDER BY run_id, row_key").fetchall()
    finally:
        con.close()


def one_line_error(stderr: str, db: Path, fix: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr and "During handling" not in stderr, stderr
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert str(db) in errors[0] and fix in errors[0], errors[0]
    return errors[0]


def test_calibrate_on_a_read_only_database_says_so_in_one_line(disk, tmp_path, capsys):
    db = disk.path / "wb.db"
    labeled = subset_file(tmp_path, "refund-check", 6)
    first = calibrate(db, labeled)
    assert first.returncode == 0, first.stderr
    before = results(db)
    assert len(before) == 6
    with disk.read_only():
        proc = calibrate(db, labeled, "--new-run")
        line = one_line_error(proc.stderr, db, "read-only")
        assert proc.returncode == 5
        assert results(db) == before  # nothing lost (and nothing half-written)
    with capsys.disabled():
        print(f"\nread-only ({'tmpfs remounted ro' if disk.tmpfs else 'chmod'}): {line}")
    again = calibrate(db, labeled)  # writable again: the stored run is reused, nothing re-scored
    assert again.returncode == 0 and "reused 6" in again.stderr, again.stderr


def test_a_disk_that_fills_up_during_a_calibration_stops_cleanly_and_resumes(disk, tmp_path, capsys):
    if not disk.tmpfs:
        pytest.skip("a full disk needs a small file system of its own (tmpfs, as root)")
    db = disk.path / "wb.db"
    labeled = subset_file(tmp_path, "refund-check", 40)
    release = tmp_path / "release"  # off the disk that fills up
    proc = calibrate(db, labeled, wait=False, hold=(3, release))  # held after its 3rd result: mid-run on any machine
    deadline = time.time() + 300  # the bound only catches a hang
    while True:
        assert time.time() < deadline and proc.poll() is None, proc.poll()
        try:
            if len(results(db)) >= 3:
                break
        except sqlite3.Error:
            pass
        time.sleep(0.1)
    filler = disk.fill()  # the disk fills up while the run is writing its results
    release.touch()
    _, stderr = proc.communicate(timeout=300)
    line = one_line_error(stderr, db, "disk is full")
    assert proc.returncode == 5
    filler.unlink()
    kept = results(db)
    assert 3 <= len(kept) < 40 and len({k for _, k, _ in kept}) == len(kept)
    with capsys.disabled():
        print(f"\ndisk full after {len(kept)} of 40 rows: {line}")
    resumed = calibrate(db, labeled)  # space again: the same command resumes where it stopped
    assert resumed.returncode == 0, resumed.stderr
    assert f"reused {len(kept)}" in resumed.stderr
    done = results(db)
    assert len(done) == 40 and len({k for _, k, _ in done}) == 40 and set(kept) <= set(done)


def test_the_calibrate_page_on_a_read_only_database_shows_one_line(disk, tmp_path, monkeypatch):
    db = disk.path / "wb.db"
    monkeypatch.setenv("SEMIF_DB", str(db))
    labeled = subset_file(tmp_path, "refund-check", 4)
    assert calibrate(db, labeled).returncode == 0  # a policy, its set and a finished run
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/calibrate.py").run()
    assert not at.exception
    before = results(db)
    with disk.read_only():
        at.selectbox(key="cal_policy").select("refund-check").run()
        finish_tasks(at.button(key="cal_run").click().run())
        assert not at.exception, at.exception and "\n".join(at.exception[0].stack_trace)
        shown = [e.value for e in at.error if "cannot write the workbench database" in e.value]
        assert len(shown) == 1 and "read\\-only" in shown[0] and "wb\\.db" in shown[0], [e.value for e in at.error]
        assert results(db) == before
