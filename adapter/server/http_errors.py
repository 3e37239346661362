"""Every error the adapter answers is JSON: 422 `{"detail": [{"loc", "msg", "type"}]}` for field
errors (FastAPI's shape, which TypeSafe's client parses), `{"detail": {"error_type", "message"}}`
for the rest. Bad input never gets a 5xx; a 5xx means the server could not do the work."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from adapter.schema import FieldError


class HTTPProblem(Exception):
    """A non-validation error: {"detail": {"error_type", "message"}}, with optional headers."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


class Invalid(Exception):
    """Field errors, already shaped: [{"loc", "msg", "type"}]."""

    def __init__(self, errors: list[FieldError]):
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:3]))
        self.errors = errors


def problem(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": {"error_type": error_type, "message": message}}, status_code=status,
                        headers=headers)


def invalid(errors: list[FieldError]) -> JSONResponse:
    return JSONResponse({"detail": errors}, status_code=422)
