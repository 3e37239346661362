"""What the store hands out, as typed records (no Streamlit): one TypedDict per table, the JSON columns
decoded. TypedDicts rather than classes because every consumer reads them by key - pandas frames, JSON
downloads, the adapter's own dicts - and mypy checks those keys where a record flows (a misspelt
`run["target_nmae"]` is an error). The columns and their meaning are the store's SCHEMA (app/core/store.py)."""
from __future__ import annotations

from typing import Any, Literal, Mapping, NotRequired, TypedDict, cast

from app.targets.base import TargetSpec as TargetSpec  # a saved target: its record lives with the targets

RunStatus = Literal["running", "done", "done-with-errors", "failed", "interrupted", "stopped"]  # stopped: resumable


class Policy(TypedDict, total=False):
    """A decision policy: the question and its ordered options (+ examples, settings); `version` is
    bumped by every save (an editor saves against the version it loaded)."""
    id: str
    name: str
    question: str
    options: list[dict[str, str]]  # [{id, description}], in the order the model sees them
    examples: list[dict[str, Any]]  # [{state, option_id}]
    notes: str  # for people only: never sent to the model
    readout: str  # "" = the model's default
    debias: str
    guard: str
    version: int
    created_at: str
    updated_at: str


# A run's configuration as stored (the `config` JSON column of runs): the keys depend on the kind that
# wrote it, so this is the union of them, each named once (functional syntax: `import` is a keyword).
RunConfig = TypedDict("RunConfig", {
    # eval / check (app/core/runs.py: EvalRunConfig validates these on read - what resume needs)
    "readout": str | None, "debias": str | None, "permute": bool, "few_shot": bool | None, "examples": str,
    "n_examples": int, "layout": str | None, "companion_of": int | None, "policy_fingerprint": str,
    # a head-layout run's learned head, out of fold, written when its head is fitted (app/service/evaluate.remember_head)
    "head_oof": dict[str, Any],
    "evaluated_policy": Policy, "row_keys": list[str], "dataset_hash": str, "dataset_name": str,
    # playground / compare (runner.run_policy): the request overrides, the head-layout reader, the heads applied
    "overrides": dict[str, Any], "head_layout": bool, "heads": list[Mapping[str, Any]],
    # robustness / order-check (robustness.plan.start_check, service.checks): how the rows were asked
    "variant": str, "guard": str, "deployed_guard": str, "what_if_guard": str | None, "checks": list[str],
    "attempts": int, "states": int, "source": str, "suite": dict[str, Any], "out_of_scope": list[Any],
    "target": str, "calibrated": Mapping[str, Any], "negated_question": str | None,
    # production / replay (decision_import): what the log held, the run replayed
    "import": dict[str, Any], "replay_of": int,
    # pool (app/service/pool.py): the stored pool scored, and the evaluation run whose requests it repeats
    "pool_id": int, "like_run": int | None,
    "pool_request": str,  # with like_run None: request_key of the calibrated file whose own fields were sent
}, total=False)
RunConfig.__doc__ = """What a run was configured with, as stored. A TypedDict with total=False rather than a
frozen dataclass: the stored object is the union of what each run kind writes, and rows written before
a key existed lack it - every reader reads a key with the default it always had, the store writes and
reads the JSON unchanged (no parse step that could reject an old row), and mypy checks each key where a
config flows (a misspelt `cfg["layuot"]` is an error). The eval kind's keys are parsed and validated
where they are needed, by app/core/runs.EvalRunConfig."""


def config_of(run: Mapping[str, Any]) -> RunConfig:
    """A run's configuration, typed; {} for a run stored without one."""
    return cast(RunConfig, run.get("config") or {})


class Run(TypedDict):
    """One run: a policy (its own copy) on one target; kind says which page or command made it."""
    id: int
    group_id: str
    kind: str  # playground, compare, eval, check, order-check, robustness, production, replay
    policy_id: str
    policy: Policy
    target_name: str
    target: TargetSpec
    model: str | None
    status: RunStatus
    n_rows: int
    done_rows: int
    error_rows: int
    labeled_rows: NotRequired[int]  # in list_runs: answered rows with a label, and how many are right
    correct_rows: NotRequired[int]
    created_at: str
    finished_at: str | None
    pinned: int
    note: str | None
    labeled_set_id: int | None
    config: RunConfig
    lease_owner: str | None
    lease_until: float | None


class Result(TypedDict):
    """One row's answer in a run (or its error), with the request sent and the response received."""
    id: int
    run_id: int
    row_key: str
    position: int
    state: Any  # text, or a JSON object / array
    label: str | None
    option_ids: list[str] | None
    probabilities: list[float] | None
    top_option: str | None
    label_mass: float | None
    probability_status: str | None
    readout: str | None
    latency_s: float
    cold: int
    error: str | None
    request: Any
    response: Any
    reuse_key: str | None
    reused_from: int | None


class LabeledSet(TypedDict):
    id: int
    name: str
    policy_id: str | None
    content_hash: str
    n_rows: int
    source: str
    created_at: str
    parent_id: int | None  # the set this one is a new version of (the review queue)


class LabeledRow(TypedDict):
    id: int
    set_id: int
    row_key: str
    position: int
    state: Any
    label: str
    split: str | None  # "train" rows are never scored
    meta: dict[str, Any] | None


class Review(TypedDict):
    """A label (or skip) given in the review queue, who and when; set_id once it went into a version."""
    id: int
    policy_id: str
    item_key: str
    run_id: int
    row_key: str
    state: Any
    label: str | None
    action: str  # "label" | "skip" | "relabel" | "confirm" (a labeled row's label fixed or kept: label_issues)
    note: str
    who: str
    at: str
    set_id: int | None
    undone: int
    picked: str | None  # how the row came to be labeled (app/core/review.PICKED); None: not recorded (older labels)
    draw_key: float | None  # a pool row's random draw key (app/service/pool.draw_keys); None: not a pool row


class Calibrated(TypedDict):
    """A calibrated policy saved for Deploy, with its provenance; `config` is the semif-policy/1 file."""
    id: int
    policy_id: str
    name: str
    run_id: int
    created_at: str
    gate_source: str
    threshold: float
    coverage: float | None
    accuracy: float | None
    model_file: str
    model_sha256: str
    dataset_hash: str
    config: dict[str, Any]


class Deployment(TypedDict):
    id: str
    path: str  # serving path: semif | textgen
    compute: str
    region: str
    endpoint_name: str
    model_name: str
    endpoint_config_name: str
    status: str
    config: dict[str, Any]
    plan: list[dict[str, Any]]
    created_at: str
    updated_at: str


class AuditEntry(TypedDict):
    id: int
    deployment_id: str
    at: str
    who: str
    action: str
    what: str
    result: str
