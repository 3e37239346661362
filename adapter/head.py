"""A learned head: a policy's own linear read-out, fitted on labeled rows, applied to every row.

Zero-shot, a small model is near chance on some policies whose answer its hidden state still
encodes; a multinomial logistic regression on the features of each row turns labeled rows into
accuracy. Three kinds, all `softmax(W · standardise(x) + b)` over the policy's options:

- `linc`    x = log p (the option log-probabilities as scored): a full affine map on them (LinC);
- `hidden`  x = the model's hidden state at the prompt's last token (`hidden_state: true`);
- `stacked` x = both, concatenated.

The head is fitted in the workbench (app/core/heads.py, out of fold) and travels inside the
calibrated policy file; `Head.probabilities` is the one implementation of applying it, called by
the adapter and by the workbench's numbers alike, one row at a time, so both give the same bits.
Weights are float16 (per-option scaled, so small weights keep their precision), the standardisation
float32, all base64: a 4-option head on a 1,536-wide hidden state is ~30 KB of JSON.
"""
from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

HeadKind = Literal["linc", "hidden", "stacked"]
HEAD_KINDS: tuple[HeadKind, ...] = ("linc", "hidden", "stacked")


@dataclass(frozen=True)
class KindWords:
    """How everything that names a head kind says it (the one table: policy files' correction name,
    Calibrate's picker and comparison, the reports): `name` in a sentence, `reads` what the head reads
    (a picker's label and the comparison's "reads" column)."""
    name: str
    reads: str


KIND_WORDS: dict[HeadKind, KindWords] = {
    "linc": KindWords("LinC (affine map on the log-probs)", "log-probs"),
    "hidden": KindWords("hidden-state head", "hidden state"),
    "stacked": KindWords("hidden state + log-probs head", "hidden state + log-probs"),
}


def head_name(kind: str, unknown: str = "a head") -> str:
    """A head kind named in a sentence (`unknown` for a kind this version does not know)."""
    return next((w.name for k, w in KIND_WORDS.items() if k == kind), unknown)  # any string: a stored file's


LOGP_FLOOR = 1e-6  # log p of an option is read as at least log(1e-6): one option at 0 must not dominate a head


def encode(values: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def decode(data: str, dtype: str, field: str) -> np.ndarray:
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError:
        raise ValueError(f"{field}: not base64 - export the policy again from Calibrate") from None
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise ValueError(f"{field}: {len(raw)} bytes is not a whole number of {np.dtype(dtype).name} values")
    return np.frombuffer(raw, dtype=dtype).astype(np.float64)


def uses_hidden(kind: str) -> bool:
    return kind in ("hidden", "stacked")


def uses_logprobs(kind: str) -> bool:
    return kind in ("linc", "stacked")


def feature_vector(kind: str, hidden: np.ndarray | None, probs: list[float] | np.ndarray) -> np.ndarray:
    """The row's features in the head's order: [hidden state][log p], as the kind uses them."""
    parts = []
    if uses_hidden(kind):
        if hidden is None:
            raise ValueError("the row has no hidden state")
        parts.append(np.asarray(hidden, np.float64))
    if uses_logprobs(kind):
        parts.append(np.log(np.maximum(np.asarray(probs, np.float64), LOGP_FLOOR)))
    return np.concatenate(parts)


# What a head fitted by app/core/heads.py stays within (refused on load, not normalised: a head outside them
# was not fitted here, and rescaling it would change its answers silently). (field, min |value|, max |value|):
# features are standardised (scale floored at 1e-6 when fitted), each weight row is stored over its largest
# weight (so |weights| <= 1), an L2-regularised fit keeps weights and biases far below 1e4.
HEAD_BOUNDS: tuple[tuple[str, float, float], ...] = (
    ("center", 0.0, 1e6), ("scale", 1e-7, 1e6), ("weights", 0.0, 1.0), ("weight_scale", 0.0, 1e4), ("bias", 0.0, 1e4))


class Head(BaseModel):
    """A fitted head, as exported. `model_sha256` and `prompt_version` say what it was fitted on:
    the hidden state of another model or prompt means nothing to it (the adapter then sends the
    row to the fallback, like any policy calibrated on another model)."""

    model_config = ConfigDict(extra="forbid")
    kind: HeadKind
    option_ids: list[str] = Field(min_length=2, description="the options in the order of the weights' rows")
    hidden_dim: int = Field(ge=0, le=65536, description="length of the hidden state it reads (0 for linc)")
    center: str = Field(description="float32 base64: each feature's mean on the fitted rows")
    scale: str = Field(description="float32 base64: each feature's standard deviation on the fitted rows (> 0)")
    weights: str = Field(description="float16 base64, one row per option over the standardised features")
    weight_scale: list[float] = Field(description="per option: the float16 row times this is the weight row")
    bias: list[float]
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    prompt_version: str = Field(min_length=1)
    regularisation: float = Field(gt=0, description="the inverse L2 strength C chosen by inner cross-validation")
    rows: int = Field(ge=0, description="labeled rows it was fitted on")
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = PrivateAttr(default=None)

    @property
    def n_features(self) -> int:
        return (self.hidden_dim if uses_hidden(self.kind) else 0) + (len(self.option_ids) if uses_logprobs(self.kind) else 0)

    @model_validator(mode="before")
    @classmethod
    def _sizes(cls, data: Any) -> Any:
        """The arrays' lengths against the shape the head declares, before any is decoded: a head of
        100 MB would otherwise be decoded (and held twice) before its shape refused it."""
        if not isinstance(data, dict):
            return data
        ids, dim, kind = data.get("option_ids"), data.get("hidden_dim"), data.get("kind")
        if not (isinstance(ids, list) and isinstance(dim, int) and 0 <= dim <= 65536 and kind in HEAD_KINDS
                and uses_hidden(kind) == (dim > 0)):
            return data  # the field validators (and _shapes) say what is wrong
        m = (dim if uses_hidden(kind) else 0) + (len(ids) if uses_logprobs(kind) else 0)
        for name, itemsize, count in (("center", 4, m), ("scale", 4, m), ("weights", 2, len(ids) * m)):
            given = data.get(name)
            if isinstance(given, str) and len(given) > 4 * -(-itemsize * count // 3):
                raise ValueError(f"{name}: {len(given):,} characters of base64; a {len(ids)}-option {kind} head over {m} "
                                 f"features holds {count} values ({4 * -(-itemsize * count // 3):,} characters) - the "
                                 "head does not fit this shape")
        return data

    @model_validator(mode="after")
    def _shapes(self) -> "Head":
        k, m = len(self.option_ids), self.n_features
        if uses_hidden(self.kind) and self.hidden_dim == 0:
            raise ValueError(f"hidden_dim: a {self.kind} head reads the hidden state, so hidden_dim must be > 0")
        if not uses_hidden(self.kind) and self.hidden_dim:
            raise ValueError("hidden_dim: a linc head reads no hidden state, so hidden_dim must be 0")
        for name, dtype, want in (("center", "<f4", m), ("scale", "<f4", m), ("weights", "<f2", k * m)):
            values = decode(getattr(self, name), dtype, name)
            if values.size != want:
                raise ValueError(f"{name}: holds {values.size} values; a {k}-option {self.kind} head over {m} features "
                                 f"needs {want} - the head does not fit this shape")
            if not np.isfinite(values).all():
                raise ValueError(f"{name}: holds NaN or infinite values")
        if (decode(self.scale, "<f4", "scale") <= 0).any():
            raise ValueError("scale: every feature's scale must be > 0")
        if not math.isfinite(self.regularisation):
            raise ValueError(f"regularisation: {self.regularisation} is not a finite strength - export the policy again")
        for name, given in (("weight_scale", self.weight_scale), ("bias", self.bias)):
            if len(given) != k:
                raise ValueError(f"{name}: {len(given)} values for {k} options")
            if not all(math.isfinite(v) for v in given):
                raise ValueError(f"{name}: holds NaN or infinite values")
        for name, low, high in HEAD_BOUNDS:  # finite is not enough: bias 1e308 answers confidence 1.0 on every row
            if name in ("weight_scale", "bias"):
                values = np.abs(np.asarray(getattr(self, name), np.float64))
            else:
                values = np.abs(decode(getattr(self, name), "<f2" if name == "weights" else "<f4", name).astype(np.float64))
            if values.size and not ((values >= low) & (values <= high)).all():
                worst = float(values[(values < low) | (values > high)][0])
                raise ValueError(f"{name}: holds {worst:g}, outside the bounds a fitted head stays within "
                                 f"(|{name}| in [{low:g}, {high:g}]) - this head was not fitted by the workbench: "
                                 "calibrate again")
        return self

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(center, scale, W, b) as float64, W of shape (options, features)."""
        k, m = len(self.option_ids), self.n_features
        W = decode(self.weights, "<f2", "weights").reshape(k, m) * np.asarray(self.weight_scale)[:, None]
        return decode(self.center, "<f4", "center"), decode(self.scale, "<f4", "scale"), W, np.asarray(self.bias, np.float64)

    def probabilities(self, hidden: np.ndarray | None, probs: list[float] | np.ndarray) -> list[float]:
        """The head's probabilities for one row (in `option_ids` order). ValueError when the row lacks
        what the head reads (no hidden state, or one of another width)."""
        if uses_hidden(self.kind):
            if hidden is None:
                raise ValueError("the row was scored without its hidden state (hidden_state: true)")
            if len(hidden) != self.hidden_dim:
                raise ValueError(f"the row's hidden state has {len(hidden)} values; the head reads {self.hidden_dim}")
        if len(probs) != len(self.option_ids):
            raise ValueError(f"{len(probs)} probabilities for a {len(self.option_ids)}-option head")
        if self._arrays is None:
            self._arrays = self.arrays()
        center, scale, W, b = self._arrays
        x = (feature_vector(self.kind, hidden, probs) - center) / scale
        z = np.array([math.fsum(w * x) for w in W]) + b  # fsum: the same bits whatever BLAS is installed
        z -= z.max()
        e = np.exp(z)
        return [float(v) for v in e / e.sum()]


def build_head(kind: HeadKind, option_ids: list[str], *, hidden_dim: int, center: np.ndarray, scale: np.ndarray,
               W: np.ndarray, b: np.ndarray, model_sha256: str, prompt_version: str, regularisation: float,
               rows: int) -> Head:
    """A Head from fitted float64 arrays: weights rounded to float16 per option row (scaled to the
    row's largest weight, so rows of small weights keep three significant digits)."""
    W = np.asarray(W, np.float64)
    row_scale = np.abs(W).max(axis=1)
    row_scale[row_scale == 0] = 1.0
    return Head(kind=kind, option_ids=list(option_ids), hidden_dim=hidden_dim if uses_hidden(kind) else 0,
                center=encode(center, "<f4"), scale=encode(scale, "<f4"), weights=encode(W / row_scale[:, None], "<f2"),
                weight_scale=[float(s) for s in row_scale], bias=[float(v) for v in b], model_sha256=model_sha256,
                prompt_version=prompt_version, regularisation=float(regularisation), rows=rows)
