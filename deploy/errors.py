"""What a failed deployment step says to a person (no boto3 client here): DeployError, and boto3's
failures in words - no credentials, access denied, a quota, no capacity. The executor raises them; the
transform reader, the CLI, the Deploy page and the SageMaker targets catch and show them."""
from __future__ import annotations

from botocore.exceptions import ClientError, NoCredentialsError


class DeployError(RuntimeError):
    """A failure explained for a person: what failed and what to do."""


def friendly(exc: BaseException, what: str = "") -> str:
    prefix = f"{what}: " if what else ""
    if isinstance(exc, NoCredentialsError):
        return (prefix + "no AWS credentials found. Set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
                "or run 'aws configure' (or 'aws sso login').")
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code, msg = err.get("Code", ""), err.get("Message", "")
        if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnrecognizedClientException",
                    "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException"):
            return prefix + f"AWS refused ({code}): {msg}. Check the identity's IAM permissions and that its session is valid."
        if code in ("ResourceLimitExceeded", "ServiceQuotaExceededException", "LimitExceededException"):
            return prefix + f"quota exceeded ({code}): {msg}. Request an increase in Service Quotas for this instance type, or pick another."
        if "capacity" in (code + msg).lower():
            return prefix + f"not enough capacity ({code}): {msg}. A GPU pool with several instance types, or another region, helps."
        return prefix + f"{code}: {msg}"
    return prefix + f"{type(exc).__name__}: {exc}"
