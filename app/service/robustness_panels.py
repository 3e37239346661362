"""The Robustness page's verdict as a display object: which run it is (policy, target, readout, guard),
how many states it rests on, each check's verdict in words and level, and a what-if guard's numbers
beside them - built here from the run and its report, laid out by the page."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from app.core.robustness import CHECK_LABELS, Report
from app.service.checks import what_if
from app.service.display import Escape, Kind, Note, plain

LEVEL: dict[str, Kind] = {"ok": "success", "warn": "warning", "bad": "error"}
FIRST_LOOK = 20  # fewer states: a first look, not a measurement


@dataclass(frozen=True)
class RobustnessVerdict:
    """The heading of a check, its caption, a first-look note, a note per check, and the what-if."""
    title: str
    caption: str
    first_look: str | None
    verdicts: tuple[Note, ...]
    what_if: str | None  # beside the verdicts, never coloured as one


def guard_words(config: Mapping[str, Any], esc: Escape = plain) -> str:
    """'guard precheck as deployed, what-if guard erase-and-check' (a calibrated policy), or 'guard none'."""
    if "deployed_guard" not in config:
        return f"guard {esc(config.get('guard', 'none'))}"
    return f"guard {esc(config['deployed_guard'])} as deployed" + (
        f", what-if guard {esc(config['what_if_guard'])}" if config.get("what_if_guard") else "")


def verdict(run: Mapping[str, Any], report: Report, esc: Escape = plain) -> RobustnessVerdict:
    cfg = run["config"]
    title = (f"{esc(run['policy']['name'])} on {esc(run['target_name'])} ({esc(cfg.get('variant', 'default'))}, "
             f"{guard_words(cfg, esc)})")
    caption = f"{report.n_states} states ({esc(cfg.get('source', ''))}); {report.summary.errors} failed calls"
    first = (f"Only {report.n_states} states: a first look, with wide intervals - check more states for a measurement."
             if report.n_states < FIRST_LOOK else None)
    notes = tuple(Note(LEVEL[level], f"**{CHECK_LABELS[check]}**: {esc(text)}")
                  for check, (level, text) in report.verdicts.items())
    said = what_if(report)
    return RobustnessVerdict(title, caption, first, notes, esc(said) if said is not None else None)


def run_label(run: Mapping[str, Any]) -> str:
    """A saved check in the picker: policy and its version (the calibrated policy it tested as deployed), target,
    readout, guard (and what-if), states."""
    cfg = run["config"]
    version = (run.get("policy") or {}).get("version")
    cal = cfg.get("calibrated") or {}
    as_deployed = (f" · calibrated #{cal['id']}" if cal.get("id") is not None else " · a calibrated policy") if cal else ""
    return (f"{run['policy']['name']}{f' v{version}' if version is not None else ''}{as_deployed} · "
            f"{run['target_name']} · {cfg.get('variant')} · guard "
            f"{cfg.get('deployed_guard', cfg.get('guard'))}"
            + (f" (what-if {cfg['what_if_guard']})" if cfg.get("what_if_guard") else "")
            + f" · {cfg.get('states')} states")
