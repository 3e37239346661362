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


def for_target(target: dict, request: dict | None) -> dict[str, str]:
    """{language: code} that sends `request` to the target the way the workbench did."""
    body = request or {}
    kind, cfg = target.get("kind"), target.get("config") or {}
    if kind == "local":
        from .engines import model_key

        serve = f"python -m adapter serve --model {shlex.quote(model_key(cfg.get('model') or None))}"
        return {"bash": f"# the same engine as an HTTP server (port 8080):\n{serve}\n\n"
                        + _curl("http://127.0.0.1:8080/invocations", body)}
    if kind == "semif":
        return {"bash": _curl(cfg["url"].rstrip("/") + "/invocations", body, cfg.get("api_key_env") or None)}
    if kind == "sagemaker":
        region = cfg.get("region") or "us-east-1"
        cli = (f"aws sagemaker-runtime invoke-endpoint --region {region} --endpoint-name {cfg['endpoint_name']} "
               "--content-type application/json --cli-binary-format raw-in-base64-out \\\n  --body "
               + shlex.quote(json.dumps(body, ensure_ascii=False)) + " /dev/stdout")
        return {"python": _boto3(cfg["endpoint_name"], region, body), "bash": cli}
    if kind in ("systemone", "chat"):
        from .targets import chat_url

        url = cfg["url"].rstrip("/") + "/v1/systemone" if kind == "systemone" else chat_url(cfg["url"])
        return {"bash": _curl(url, body, cfg.get("api_key_env") or None)}
    return {"json": json.dumps(body, indent=2)}
