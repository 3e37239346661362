"""The request a target ran, as code a developer can paste: cURL, and boto3 for SageMaker.
No secrets: a key stays the name of an environment variable (no Streamlit here)."""
from __future__ import annotations

import json
import shlex


def _curl(url: str, body: dict, key_env: str | None = None) -> str:
    parts = ["curl", "-sS", "-X", "POST", url, "-H", "Content-Type: application/json"]
    auth = f' \\\n  -H "Authorization: Bearer ${key_env}"' if key_env else ""
    data = json.dumps(body, ensure_ascii=False, indent=2)
    return " ".join(shlex.quote(p) for p in parts) + auth + " \\\n  --data-binary @- <<'JSON'\n" + data + "\nJSON"


def _boto3(endpoint: str, region: str, body: dict) -> str:
    return ("import json\n\nimport boto3\n\n"
            f"runtime = boto3.client(\"sagemaker-runtime\", region_name={region!r})\n"
            f"row = {json.dumps(body, ensure_ascii=False, indent=4)}\n"
            f"response = runtime.invoke_endpoint(EndpointName={endpoint!r}, ContentType=\"application/json\",\n"
            "                                   Accept=\"application/json\", Body=json.dumps(row))\n"
            "result = json.loads(response[\"Body\"].read())\n"
            "print(result[\"top_option\"], dict(zip(result[\"option_ids\"], result[\"probabilities\"])))")


PINNED = ("readout", "debias")  # what a model's defaults decide: pinned so another model runs the same


def pinned(request: dict | None, response: dict | None) -> dict:
    """The request as it ran: the readout and correction the target resolved (from its response)
    written in, so the snippet on another model or server runs what the workbench ran."""
    body = dict(request or {})
    if isinstance(response, dict) and response.get("readout") in ("letters", "option-words"):
        for key in PINNED:
            if response.get(key) is not None:
                body[key] = response[key]
    return body


def for_target(target: dict, request: dict | None, response: dict | None = None) -> list[tuple[str, str, str]]:
    """[(title, language, code)] that send `request` to the target the way the workbench did; the
    server to start, for a local target, comes as its own block (it blocks the terminal)."""
    body = pinned(request, response)
    kind, cfg = target.get("kind"), target.get("config") or {}
    if kind == "local":
        from app.core.engines import model_key

        serve = f"python -m adapter serve --model {shlex.quote(model_key(cfg.get('model') or None))}"
        return [("Start the same engine as an HTTP server (port 8080; it keeps running)", "bash", serve),
                ("Then, in another terminal", "bash", _curl("http://127.0.0.1:8080/invocations", body))]
    if kind == "semif":
        return [("cURL", "bash", _curl(cfg["url"].rstrip("/") + "/invocations", body, cfg.get("api_key_env") or None))]
    if kind == "sagemaker":
        region = cfg.get("region") or "us-east-1"
        cli = (f"aws sagemaker-runtime invoke-endpoint --region {region} --endpoint-name {cfg['endpoint_name']} "
               "--content-type application/json --cli-binary-format raw-in-base64-out \\\n  --body "
               + shlex.quote(json.dumps(body, ensure_ascii=False)) + " /dev/stdout")
        return [("boto3", "python", _boto3(cfg["endpoint_name"], region, body)), ("AWS CLI", "bash", cli)]
    if kind in ("systemone", "chat"):
        from app.targets.kinds import chat_url

        url = cfg["url"].rstrip("/") + "/v1/systemone" if kind == "systemone" else chat_url(cfg["url"])
        return [("cURL", "bash", _curl(url, body, cfg.get("api_key_env") or None))]
    return [("Request", "json", json.dumps(body, indent=2))]
