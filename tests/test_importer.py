"""An import that shows what it read (issue 43, item 2): the state column guessed by content, a warning when
the chosen state column looks like ids, the first rows previewed as they will be stored, one mapping for
Calibrate's sets and Compare's states."""
from __future__ import annotations

import pytest

from app.core import importer
from app.core.inputs import InputError, rows_from_upload
from app.core.labeled import ColumnMap, parse_labeled

OPTIONS = ["bug", "feature_request", "question"]
TRIAGE = ("issue_id,issue_text,team\n"
          "GH-1042,The export button crashes the app when the file name has a space in it,bug\n"
          "GH-1043,Could you add a dark mode to the settings page please,Feature Request\n"
          "GH-1044,How do I change the language of the interface to German?,question\n"
          "GH-1045,Saving a draft loses the attachments every single time,bug\n"
          "GH-1046,Please support exporting reports as PDF as well as CSV,Feature Request\n"
          "GH-1047,Is there a limit on how many projects one account can hold?,question\n").encode()


def test_the_state_is_the_longest_free_text_column_not_the_first():
    g = importer.guess("issues.csv", TRIAGE)
    assert (g.state, g.label, g.id) == ("issue_text", "team", "issue_id")
    assert g.needs_a_look


def test_a_state_column_of_ids_is_warned_about_and_the_text_column_named():
    warning = importer.state_warning("issues.csv", TRIAGE, "issue_id")
    assert warning and "issue_id" in warning and "id column" in warning and "'issue_text'" in warning
    assert importer.state_warning("issues.csv", TRIAGE, "issue_text") is None
    numbers = b"n,text\n" + b"".join(f"{i},word number {i} here\n".encode() for i in range(1, 20))
    assert importer.state_warning("n.csv", numbers, "n") is not None


def test_the_preview_shows_the_rows_as_stored_with_labels_mapped():
    proposed = importer.label_suggestions("issues.csv", TRIAGE, "team", OPTIONS)
    assert proposed == {"bug": "bug", "Feature Request": "feature_request", "question": "question"}
    cols = ColumnMap("issue_text", "team", {"Feature Request": "feature_request"}, "issue_id")
    rows = importer.preview("issues.csv", TRIAGE, cols, OPTIONS, n=3)
    assert rows == [{"id": "GH-1042", "state": "The export button crashes the app when the file name has a space in it",
                     "label": "bug"},
                    {"id": "GH-1043", "state": "Could you add a dark mode to the settings page please",
                     "label": "feature_request"},
                    {"id": "GH-1044", "state": "How do I change the language of the interface to German?",
                     "label": "question"}]
    unmapped = importer.preview("issues.csv", TRIAGE, ColumnMap("issue_text", "team", {}, "issue_id"), OPTIONS, n=2)
    assert unmapped[1]["label"] == "Feature Request (not an option: refused)"
    # and what is stored is what the preview showed
    stored = parse_labeled("issues.csv", TRIAGE, OPTIONS, cols)
    assert [(r["row_key"], r["state"][:20], r["label"]) for r in stored[:3]] == \
        [(p["id"], p["state"][:20], p["label"]) for p in rows]


def test_compare_reads_an_upload_through_the_same_mapping():
    cols = ColumnMap("issue_text", "team", {"Feature Request": "feature_request"}, "issue_id")
    cases = rows_from_upload("issues.csv", TRIAGE, OPTIONS, columns=cols)
    assert [(c.key, c.label) for c in cases[:2]] == [("GH-1042", "bug"), ("GH-1043", "feature_request")]
    with pytest.raises(InputError, match="no 'state' column"):
        rows_from_upload("issues.csv", TRIAGE, OPTIONS)  # without the mapping, the file's own columns only
    unlabeled = rows_from_upload("issues.csv", TRIAGE, OPTIONS, columns=ColumnMap("issue_text", "\0none", {}, "\0none"))
    assert unlabeled[0].key == "row-2" and unlabeled[0].label is None


def test_jsonl_keys_are_guessed_the_same_way():
    data = b'{"ref": "A-1", "body": "the invoice total is wrong this month", "answer": "billing"}\n' \
           b'{"ref": "A-2", "body": "I cannot log in since yesterday evening", "answer": "account"}\n'
    g = importer.guess("t.jsonl", data)
    assert (g.state, g.label) == ("body", "answer")


def test_the_command_line_reads_a_file_through_the_same_importer(tmp_path):
    import json
    import subprocess
    import sys

    from app.service.sets import cli_mapping
    from tests.conftest import ROOT

    policy = {"id": "triage", "name": "GitHub issue triage", "question": "What kind of GitHub issue is this?",
              "options": [{"id": o, "description": o.replace("_", " ")} for o in OPTIONS]}
    cols, lines = cli_mapping("issues.csv", TRIAGE, policy, state="issue_text", label=None, ident=None)
    assert cols == ColumnMap("issue_text", "team", {"Feature Request": "feature_request"}, "issue_id")
    assert lines[0].startswith("columns: state=issue_text label=team id=issue_id; 'Feature Request' -> feature_request")
    assert lines[1].startswith("  GH-1042 | bug | The export button")
    _, warned = cli_mapping("issues.csv", TRIAGE, policy, state="issue_id", label="team", ident=None)
    assert any(line.startswith("warning: The state column 'issue_id'") for line in warned)
    (tmp_path / "p.json").write_text(json.dumps(policy))
    (tmp_path / "issues.csv").write_bytes(TRIAGE)
    proc = subprocess.run([sys.executable, "-m", "app", "calibrate", "--db", str(tmp_path / "wb.db"), "--policy",
                           str(tmp_path / "p.json"), "--labeled-set", str(tmp_path / "issues.csv")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # nothing scored, nothing imported
    assert "--state-column issue_text --label-column team --id-column issue_id" in proc.stderr, proc.stderr


def test_a_column_of_ticket_numbers_is_the_id_even_when_not_named_like_one():
    """The 300-state walk's pool had 'ticket,message' (T-001, T-002, ...): the ticket numbers were dropped and its rows
    shown as pool-159; now a column whose values read as ids is the id when none is named like one."""
    from app.core import pool as pool_rows

    data = b"ticket,message\n" + b"".join(f"T-{i:03d},my order number {i} arrived broken, please refund\n".encode()
                                          for i in range(1, 13))
    assert importer.guess("pool.csv", data, labels=False).id == "ticket"
    assert pool_rows.columns_of("pool.csv", data) == ("message", "ticket")
    assert importer.guess("issues.csv", TRIAGE).id == "issue_id"  # a named one still comes first


def test_a_column_of_ids_repeated_past_the_sample_is_not_guessed_as_the_id():
    """The id guessed from a column's values reads the first rows (the sample); a value repeated later would then
    refuse the whole import as a duplicate id - so the guess checks the whole file and falls back to row numbers."""
    rows = [f"T-{i:04d},my order number {i} arrived broken, please refund\n" for i in range(1, importer.SAMPLE + 20)]
    rows.append("T-0001,the same ticket again, a second message\n")
    data = b"ticket,message\n" + "".join(rows).encode()
    assert importer.guess("pool.csv", data, labels=False).id is None
    assert importer.guess("pool.csv", data[: data.index(b"T-0001,the same")], labels=False).id == "ticket"


def test_unique_amounts_or_timestamps_are_not_guessed_as_the_id():
    """Unique decimal amounts or timestamps read as one pattern, but they are data, not ids: no id is guessed from
    them (row numbers serve); codes with letters still are."""
    amounts = b"amount,message\n" + b"".join(f"{10 + i}.{i:02d},my order {i} arrived broken, please refund\n".encode()
                                              for i in range(1, 13))
    stamps = b"at,message\n" + b"".join(f"2026-12-{i:02d}T10:00:00,my order {i} arrived broken, please refund\n".encode()
                                        for i in range(1, 13))
    assert importer.guess("a.csv", amounts, labels=False).id is None
    assert importer.guess("s.csv", stamps, labels=False).id is None
