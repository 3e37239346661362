"""Export a candidate of the "cheapest decision that is not worse" table in one step (the Calibrate page's
*Export this*, `python -m app calibrate --export`): the candidate's own run calibrated with its head (or
its correction), fitted on all labeled rows, and the calibrated policy file that names its model (sha256),
layout and head - so Deploy's handoff picks the matching model file.

Which candidate: `recommended` (the table's recommendation), `best` (the most accurate), `target` (the
evaluated target's run as Calibrate exports it today), or `<model>:<layout>:<method>` - a model file name
(with or without .gguf), `state-first` or `policy-first`, and a method (`zero-shot`, a correction's name,
or a head: `hidden`, `linc`, `stacked` or its name). A zero-shot candidate exports with its run's chosen
correction (temperature, offsets when they won out of fold): a policy file always carries one."""
from __future__ import annotations

from dataclasses import dataclass

from adapter.head import HEAD_KINDS, KIND_WORDS
from adapter.schema import HEAD_LAYOUT

from app.core import head_sources
from app.core.run_calibration import Calibration
from app.core.store import Store
from app.service import evaluate

CHOICES = ("recommended", "best", "target")
Table = head_sources.Table  # what the page hands back (the sources table it shows)


@dataclass(frozen=True)
class Picked:
    """The candidate to export and how to calibrate its run."""
    row: head_sources.Row
    head: str  # "none" or a head kind

    @property
    def run_id(self) -> int:
        return self.row.candidate.run_id

    @property
    def label(self) -> str:
        return self.row.candidate.name


def head_of(c: head_sources.Candidate) -> str:
    """The head kind a candidate's export carries ("none" for zero-shot and a correction)."""
    if c.kind != "head":
        return "none"
    return next((k for k in HEAD_KINDS if KIND_WORDS[k].name == c.method or k == c.method), "hidden")


def spec_of(c: head_sources.Candidate) -> str:
    """The `--export` value naming this candidate."""
    layout = HEAD_LAYOUT if c.layout == HEAD_LAYOUT else "state-first"
    return f"{c.model.removesuffix('.gguf')}:{layout}:{head_of(c) if c.kind == 'head' else c.method}"


def pick(table: head_sources.Table | None, which: str) -> Picked:
    """The candidate `which` names; ValueError naming the choices when none matches (or it was refused)."""
    if table is None:
        raise ValueError(f"--export {which}: this run has no head-layout sources to choose from (evaluate with "
                         "--head-sources), so only 'target' applies")
    live = [r for r in table.rows if r.accuracy is not None]
    if which in ("recommended", "best"):
        row = table.recommended if which == "recommended" else table.best
        if row is None:
            raise ValueError(f"--export {which}: no candidate has numbers yet")
        return Picked(row, head_of(row.candidate))
    parts = which.split(":")
    if len(parts) != 3:
        raise ValueError(f"--export {which!r}: use recommended, best, target or MODEL:LAYOUT:METHOD; the candidates: "
                         + ", ".join(spec_of(r.candidate) for r in live))
    model, layout, method = (p.strip().lower() for p in parts)
    for r in live:
        c = r.candidate
        names = {c.method.lower(), head_of(c) if c.kind == "head" else c.method.lower()}
        if (c.model.lower().removesuffix(".gguf") == model.removesuffix(".gguf") and
                (HEAD_LAYOUT if c.layout == HEAD_LAYOUT else "state-first") == layout and method in names):
            return Picked(r, head_of(c))
    raise ValueError(f"--export {which!r}: no such candidate with numbers; the candidates: "
                     + ", ".join(spec_of(r.candidate) for r in live))


def calibrate(store: Store, picked: Picked, *, target_accuracy: float = 0.9, per_option: bool = False) -> Calibration:
    """The candidate's run calibrated with its head (fitted on all labeled rows) or its correction."""
    return evaluate.calibrate(store, picked.run_id, target_accuracy=target_accuracy, per_option=per_option,
                              head=picked.head)
