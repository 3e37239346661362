"""MLflow tracking, opt-in (SEMIF_MLFLOW_TRACKING_URI; no Streamlit): what the workbench did, logged as
MLflow runs where a team already tracks its models - and never at the cost of the workbench.

- A `Tracked` record (params, metrics, tags, a labeled set as an MLflow dataset with its content hash,
  text artifacts) is built by app/service/tracking.py at the end of an action.
- `track()` first keeps the record in the workbench store (table `tracking`, status `pending`), then
  sends it and every older pending record for the same tracker: an unreachable tracker is one warning per
  process and the record waits for the next try (`flush()`, or any later logged action) - never lost.
- mlflow is imported only here and only when a record is sent (tests/test_layout.py LAZY): with the
  setting off nothing imports it. HTTP trackers get no retry storm: MLflow's own retries default to 0 and
  a 10 s timeout here (MLFLOW_HTTP_REQUEST_MAX_RETRIES / _TIMEOUT, when the user set neither).

One experiment per policy (`semif/<policy id>`); on a sqlite tracker the artifacts go beside its file
(`mlflow-artifacts/`), not into the current folder.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, TypedDict
from urllib.parse import unquote

from app.core.store import Store, now
from app.settings import EMBEDDED_TRACKER, WorkbenchSettings

if TYPE_CHECKING:  # typing only: the import itself waits for a record to send
    from mlflow import MlflowClient

log = logging.getLogger("semif.tracking")
EXPERIMENT_PREFIX = "semif/"
ARTIFACTS_DIR = "mlflow-artifacts"
DIGEST_CHARS = 36  # MLflow's dataset digest holds 36 characters: the full hash is in the source and a tag
_warned: set[str] = set()  # trackers already warned about in this process


class DatasetRef(TypedDict):
    """A labeled set as an MLflow dataset: its name, content hash (sha256) and rows."""
    name: str
    content_hash: str
    rows: int
    set_id: int | None


class Tracked(TypedDict):
    """One workbench action as an MLflow run (what the queue keeps, as JSON)."""
    kind: str  # evaluation, calibration, comparison, robustness, check, registry
    workbench_id: str  # "run #12", "calibrated #3": the tag linking back to the workbench
    experiment: str
    run_name: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    dataset: DatasetRef | None
    artifacts: dict[str, str]  # artifact path -> text


@dataclass(frozen=True)
class Sent:
    """Where a record went: the MLflow run (None while it waits) and, when it waits, why."""
    queue_id: int
    mlflow_run_id: str | None
    experiment_id: str | None
    error: str | None = None

    @property
    def waiting(self) -> bool:
        return self.mlflow_run_id is None


class TrackerError(RuntimeError):
    """The tracker could not be reached or refused a call: the message says which and what to do."""


def tracking_uri(settings: WorkbenchSettings) -> str | None:
    """The tracker this process logs to (None: tracking is off). `embedded` is a sqlite file beside the
    workbench DB."""
    uri = settings.mlflow_tracking_uri
    if uri == EMBEDDED_TRACKER:
        return f"sqlite:///{Path(settings.db).resolve().parent / 'mlflow.db'}"
    return uri


def experiment_name(policy_id: str) -> str:
    return EXPERIMENT_PREFIX + policy_id


def _sqlite_folder(uri: str) -> Path | None:
    """The folder of a sqlite tracker's file (artifacts go beside it), None for any other tracker."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(unquote(uri[len("sqlite:///"):])).expanduser().resolve().parent


def client(uri: str) -> MlflowClient:
    """An MLflow client on `uri` (the import happens here). A SageMaker ARN needs the sagemaker-mlflow plugin;
    a sqlite tracker's folder must exist (MLflow would say less). TrackerError names the fix."""
    if uri.startswith("arn:aws:sagemaker:"):
        if importlib.util.find_spec("sagemaker_mlflow") is None:
            raise TrackerError(f"{uri} is a SageMaker MLflow ARN: install its plugin first "
                               "(pip install sagemaker-mlflow==0.5.0), with AWS credentials for that account")
    folder = _sqlite_folder(uri)
    if folder is not None and not folder.is_dir():
        raise TrackerError(f"SEMIF_MLFLOW_TRACKING_URI {uri}: the folder {folder} does not exist - create it, or use "
                           "`embedded` (a file beside the workbench DB)")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # an unreachable tracker fails fast; we queue
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bar on a command's stderr
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_id(c: MlflowClient, uri: str, name: str) -> str:
    """The experiment's id, created on first use (on sqlite with its artifacts beside the tracker's file)."""
    found = c.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    folder = _sqlite_folder(uri)
    where = (folder / ARTIFACTS_DIR / name.replace("/", "_")).as_uri() if folder is not None else None
    return str(c.create_experiment(name, artifact_location=where, tags={"semif.workbench": "1"}))


def send(c: MlflowClient, uri: str, record: Tracked, *, queue_key: str) -> tuple[str, str]:
    """Log one record as a finished MLflow run; (experiment id, run id). A run left half-written by an
    earlier try of the same record (`semif.queue_key`) is deleted first, so a retry never doubles a run."""
    from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag

    exp = experiment_id(c, uri, record["experiment"])
    for old in c.search_runs([exp], filter_string=f"tags.`semif.queue_key` = '{queue_key}'"):
        c.delete_run(old.info.run_id)
    tags = {**record["tags"], "semif.kind": record["kind"], "semif.workbench_id": record["workbench_id"],
            "semif.queue_key": queue_key}
    run = c.create_run(exp, run_name=record["run_name"], tags=tags)
    rid = run.info.run_id
    try:
        stamp = int(time.time() * 1000)
        c.log_batch(rid, metrics=[Metric(k, float(v), stamp, 0) for k, v in record["metrics"].items()],
                    params=[Param(k, str(v)[:6000]) for k, v in record["params"].items()], tags=[])
        ds = record["dataset"]
        if ds is not None:
            source = json.dumps({"workbench_labeled_set": ds["set_id"], "sha256": ds["content_hash"]})
            entity = Dataset(name=ds["name"], digest=ds["content_hash"][:DIGEST_CHARS], source_type="semif-workbench",
                             source=source, profile=json.dumps({"num_rows": ds["rows"]}))
            c.log_inputs(rid, datasets=[DatasetInput(entity, tags=[InputTag("mlflow.data.context", record["kind"])])])
            c.log_batch(rid, tags=[RunTag("semif.dataset_sha256", ds["content_hash"])])
        for path, text in record["artifacts"].items():
            c.log_text(rid, text, path)
        c.set_terminated(rid)
    except BaseException:
        try:  # best effort: the retry deletes it by its queue key otherwise
            c.delete_run(rid)
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        raise
    return exp, rid


def _rows(store: Store, where: str, args: list[Any]) -> Iterator[dict[str, Any]]:
    with store.db() as db:
        yield from db.table("tracking").rows_where(where, args, order_by="id")


def queue_key(store: Store, queue_id: int) -> str:
    """A record's key in MLflow: this workbench file and its queue row (a retry finds its half-written run)."""
    return f"{hashlib.sha256(str(store.path.resolve()).encode()).hexdigest()[:12]}-{queue_id}"


def track(store: Store, uri: str, record: Tracked) -> Sent:
    """Keep the record, then send it with every older record still waiting for this tracker. Never raises
    for the tracker's sake: what could not be sent waits (one warning per tracker and process)."""
    with store.db() as db:
        qid = int(db.table("tracking").insert({"at": now(), "kind": record["kind"], "workbench_id": record["workbench_id"],
                                               "tracking_uri": uri, "record": json.dumps(record, ensure_ascii=False),
                                               "status": "pending", "tries": 0}).last_pk or 0)
    sent = {s.queue_id: s for s in flush(store, uri)}
    return sent.get(qid) or Sent(qid, None, None, "not sent yet")


def flush(store: Store, uri: str) -> list[Sent]:
    """Send every pending record for this tracker, oldest first; stop at the first failure (the tracker is
    down: the rest wait too). Returns what was tried."""
    out: list[Sent] = []
    pending = list(_rows(store, "status = ? AND tracking_uri = ?", ["pending", uri]))
    if not pending:
        return out
    try:
        c = client(uri)
    except Exception as exc:  # noqa: BLE001 - a bad plugin, folder or URI: the records wait
        return [_failed(store, uri, pending[0], exc)]
    for row in pending:
        record: Tracked = json.loads(row["record"])
        try:
            exp, rid = send(c, uri, record, queue_key=queue_key(store, row["id"]))
        except Exception as exc:  # noqa: BLE001 - whatever the tracker says, the workbench goes on
            out.append(_failed(store, uri, row, exc))
            break
        with store.db() as db:
            db.table("tracking").update(row["id"], {"status": "sent", "experiment_id": exp, "mlflow_run_id": rid,
                                                    "sent_at": now(), "tries": (row["tries"] or 0) + 1, "error": None})
        out.append(Sent(row["id"], rid, exp))
    return out


def _failed(store: Store, uri: str, row: Mapping[str, Any], exc: BaseException) -> Sent:
    text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
    with store.db() as db:
        db.table("tracking").update(row["id"], {"tries": (row["tries"] or 0) + 1, "error": text})
        waiting = db.execute("SELECT count(*) FROM tracking WHERE status = 'pending' AND tracking_uri = ?",
                             [uri]).fetchone()[0]
    if uri not in _warned:
        _warned.add(uri)
        log.warning("MLflow tracker %s cannot take runs now (%s): %d run(s) kept in the workbench and sent with the "
                    "next logged action (or `python -m app registry flush`)", uri, text, waiting)
    return Sent(int(row["id"]), None, None, text)


class Where(TypedDict):
    """Where one workbench action went in MLflow."""
    kind: str
    tracking_uri: str
    status: str  # sent / pending
    experiment_id: str | None
    mlflow_run_id: str | None
    error: str | None


def where(store: Store, workbench_id: str) -> list[Where]:
    """The MLflow runs logged for a workbench id ("run #12"), oldest first (none when tracking was off)."""
    return [Where(kind=r["kind"], tracking_uri=r["tracking_uri"], status=r["status"], experiment_id=r["experiment_id"],
                  mlflow_run_id=r["mlflow_run_id"], error=r["error"])
            for r in _rows(store, "workbench_id = ?", [workbench_id])]


def pending(store: Store) -> int:
    with store.db() as db:
        return int(db.execute("SELECT count(*) FROM tracking WHERE status = 'pending'").fetchone()[0])


def run_link(uri: str, experiment: str | None, run_id: str | None) -> str:
    """How to open the run: a URL for an http(s) tracker, else '<uri> · experiment E · run R'."""
    if run_id is None:
        return f"waiting to be sent to {uri}"
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}"
    return f"{uri} · experiment {experiment} · run {run_id}"
