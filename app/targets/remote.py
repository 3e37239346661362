"""Targets that answer with SemIf decisions over the network: a SemIf adapter URL, a SageMaker
endpoint (the SemIf image, or the llama.cpp DLC's chat completions), any /v1/systemone server."""
from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from adapter.schema import DecisionResult
from deploy.errors import friendly

from app.settings import WorkbenchSettings
from adapter.schema import DecisionRequest

from app.targets.base import Config, KeyedTarget, Numerics, Secrets, Target, TargetError, decision_from, http_json, numerics
from app.targets.chat import chat_body, chat_result

class SemIfTarget(KeyedTarget):
    def __init__(self, name: str, config: Config, secrets: Secrets | None = None):
        super().__init__(name, "semif", config, secrets)  # the key: an adapter started with SM_SEMIF_API_KEY
        self.url = config["url"].rstrip("/")
        self.timeout = float(config.get("timeout", 60))
        self._info: tuple[Numerics | None] | None = None  # (what /info said) once asked
        self._features: list[str] = []

    def numerics(self) -> Numerics | None:
        """From the adapter's /info (asked once per target object); None when it cannot be reached -
        the call that follows then reports why."""
        if self._info is None:
            try:
                data = http_json("GET", self.url + "/info", headers=self.auth(), timeout=5)
                self._info = (numerics(data.get("model") if isinstance(data, dict) else None),)
                self._features = list(data.get("features") or []) if isinstance(data, dict) else []
            except TargetError:
                return None
        return self._info[0]

    def returns_hidden(self) -> bool:
        """An adapter that lists `hidden_state` among its /info features (an older one would refuse the field)."""
        self.numerics()
        return "hidden_state" in self._features

    def _one(self, req: DecisionRequest) -> tuple[dict[str, Any], Any, DecisionResult]:
        body = req.model_dump(exclude_none=True)
        data = http_json("POST", self.url + "/invocations", body=body, headers=self.auth(), timeout=self.timeout)
        return body, data, decision_from(data, self.url)

    def test_connection(self) -> str:
        """/info needs the key when the adapter has one (/ping never does), so this checks both."""
        data = http_json("GET", self.url + "/info", headers=self.auth(), timeout=5)
        model = (data.get("model") or {}).get("file", "") if isinstance(data, dict) else ""
        return f"{self.url} is up: {model}"


def aws_error(exc: Exception) -> TargetError:
    """boto3 failures in words (no credentials, access denied, ...), the same ones the Deploy page uses."""
    return TargetError(f"SageMaker: {friendly(exc)}")


class SageMakerTarget(Target):
    """A SageMaker endpoint; credentials from the normal AWS chain. `protocol` is `semif` (the SemIf
    adapter image) or `chat` (the llama.cpp DLC, whose /invocations is chat completions)."""

    def __init__(self, name: str, config: Config):
        super().__init__(name, "sagemaker", config)
        self.endpoint = config["endpoint_name"]
        self.region = config.get("region") or WorkbenchSettings.from_env().region
        self._client: Any = None

    def client(self, service: str = "sagemaker-runtime") -> Any:
        import boto3

        # where AWS calls go is the operator's setting (SEMIF_AWS_RUNTIME_URL / SEMIF_AWS_ENDPOINT_URL; tests: a
        # local shim, moto), never a target's config: boto3 signs every call with this machine's credentials
        settings = WorkbenchSettings.from_env()
        url = settings.aws_runtime_url if service == "sagemaker-runtime" else settings.aws_endpoint_url
        return boto3.client(service, region_name=self.region, endpoint_url=url or None)

    def _one(self, req: DecisionRequest) -> tuple[dict[str, Any], Any, DecisionResult]:
        chat = self.config.get("protocol") == "chat"
        body = chat_body(req, "default") if chat else req.model_dump(exclude_none=True)
        try:
            if self._client is None:
                self._client = self.client()
            resp = self._client.invoke_endpoint(EndpointName=self.endpoint, ContentType="application/json",
                                                 Accept="application/json", Body=json.dumps(body))
            data = json.loads(resp["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc) from None
        except ValueError:
            raise TargetError("the endpoint did not answer JSON") from None
        return body, data, (chat_result(req, data) if chat else decision_from(data, self.endpoint))

    def test_connection(self) -> str:
        try:
            ep = self.client("sagemaker").describe_endpoint(EndpointName=self.endpoint)
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc) from None
        return f"{self.endpoint} in {self.region}: {ep['EndpointStatus']}"


class SystemOneTarget(KeyedTarget):
    """Any /v1/systemone server: the policy becomes one `choice` question (criteria = option ids
    with their descriptions); the answer's probabilities come back in the policy's option order."""

    def __init__(self, name: str, config: Config, secrets: Secrets | None = None):
        super().__init__(name, "systemone", config, secrets)
        self.url = config["url"].rstrip("/")
        self.model = config.get("model") or "jev-latest"

    def _one(self, req: DecisionRequest) -> tuple[dict[str, Any], Any, DecisionResult]:
        body = {"model": self.model, "state": req.state,
                "questions": {"decision": {"type": "choice", "instructions": req.question,
                                           "criteria": {o.id: (o.description or None) for o in req.options}}}}
        data = http_json("POST", self.url + "/v1/systemone", body=body, headers=self.auth(),
                         timeout=float(self.config.get("timeout", 120)))
        try:
            answer = data["answers"]["decision"]
            probs = [float(answer["probabilities"][o.id]) for o in req.options]
        except (KeyError, TypeError, ValueError):
            raise TargetError(f"not a /v1/systemone choice answer: {str(data)[:200]}", data) from None
        result = DecisionResult(id=req.id, option_ids=[o.id for o in req.options], probabilities=probs,
                                top_option=answer.get("choice") or req.options[max(range(len(probs)), key=probs.__getitem__)].id,
                                confidence=answer.get("confidence"), label_mass=answer.get("x_label_mass"),
                                readout=answer.get("x_readout") or "systemone", usage=data.get("usage"),
                                model={"file": data.get("model")})
        return body, data, result

    def test_connection(self) -> str:
        data = http_json("GET", self.url + "/v1/models", headers=self.auth(), timeout=5)
        names = [m.get("name") for m in data.get("models", [])]
        if self.model not in names:
            raise TargetError(f"{self.url} is up but does not serve {self.model!r}; it serves {', '.join(map(str, names))}")
        return f"{self.url} is up; serves {self.model}"


