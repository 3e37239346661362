"""Production traffic in the workbench: the adapter's decision log (a file, or CloudWatch Logs through
boto3) imported as a run of kind production, and its logged states replayed on another target - the
two then compare like any runs, and the gated rows go to the review queue."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from app.core import decision_import as di
from app.core.inputs import InputError
from app.core.runner import ProgressFn
from app.settings import WorkbenchSettings
from app.core.store import Store
from app.targets.base import Target


@dataclass
class Imported:
    run_id: int
    summary: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def ms(text: str | None, what: str) -> int | None:
    """An ISO date/time as CloudWatch's milliseconds; InputError naming the field."""
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise InputError([f"{what} {text!r}: give an ISO date/time, e.g. 2026-12-01T09:00:00+00:00"]) from None


def read_cloudwatch(group: str, *, stream_prefix: str | None = None, start: str | None = None, end: str | None = None,
                    endpoint_url: str | None = None) -> di.ParsedLog:
    """The decision lines of a CloudWatch Logs group (filter_log_events); InputError when it cannot be read."""
    settings = WorkbenchSettings.from_env()
    lines = di.fetch_cloudwatch(group, stream_prefix=stream_prefix, start_ms=ms(start, "--start"),
                                end_ms=ms(end, "--end"), region=settings.region,
                                endpoint_url=endpoint_url or settings.aws_endpoint_url)
    return di.parse_lines(lines)


def import_log(store: Store, parsed: di.ParsedLog, policy: Mapping[str, Any], *, source: str) -> Imported:
    """The decisions that fit `policy` as a production run; InputError when there are none (naming
    what the log holds, or asking whether the adapter logged at all)."""
    if not parsed.records and parsed.problems:
        raise InputError([f"no valid decision line in {source}: {len(parsed.problems)} left out", *parsed.problems])
    if not parsed.records:
        raise InputError([f"no decision lines in {source} ({parsed.skipped} other lines): was the adapter started "
                          "with SM_SEMIF_DECISION_LOG?"])
    run_id, summary = di.import_records(store, parsed.records, policy, source=source)
    return Imported(run_id, summary, list(parsed.problems))


def replay(store: Store, run_id: int, target: Target, progress: ProgressFn | None = None) -> int:
    """The logged states scored on `target` as production read them; the replay run's id."""
    return di.replay(store, run_id, target, progress)
