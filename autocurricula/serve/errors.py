"""OpenAI-style errors of the server: every failure answers ``{"error": {"message", "type",
"param", "code"}}`` with its HTTP status, whichever layer (route, FastAPI, engine) raised it."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from autocurricula.engine import EngineDeadError, UnknownPlayerError
from autocurricula.engine.adapters import AdapterError, AdapterPathError
from autocurricula.engine.scheduler import QueueTimeoutError, RequestError

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 408: "timeout_error", 409: "conflict_error", 413: "invalid_request_error",
         415: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable",
         507: "insufficient_storage"}
PARSE_ERROR = "There was an error parsing the body"  # FastAPI's detail when json.loads fails oddly
RETRY_LATER = {"Retry-After": "5"}  # seconds a request refused for a busy server is told to wait
CLOSE = {"Connection": "close"}  # after a refused body: the rest of it is not worth reading


class APIError(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The JSON of an error: also sent in-band, inside a stream or a batch that has begun."""
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def queue_timeout_message(exc: QueueTimeoutError) -> str:
    return f"{exc} (--max-queue-s): the server is busy; retry later"


def failure_status(exc: BaseException) -> int:
    """The HTTP status of a request that failed inside the engine."""
    return {EngineDeadError: 503, UnknownPlayerError: 404, QueueTimeoutError: 503}.get(type(exc), 500)


def failure_body(exc: BaseException) -> dict:
    """The error of one request of a batch that failed in the engine (the others still answer)."""
    if isinstance(exc, QueueTimeoutError):
        return error_body(503, queue_timeout_message(exc))
    return error_body(failure_status(exc), str(exc))


def validation_message(errors: list[dict]) -> str:
    """One message naming every bad field of a request (pydantic's ``errors()``), at most six."""
    parts = []
    for e in errors:
        if e.get("type") == "json_invalid":
            return "request body is not valid JSON; send a JSON object with Content-Type: application/json"
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        msg = ("not supported by this server; omit it" if e.get("type") == "extra_forbidden"
               else e.get("msg"))
        if (part := f"{where}: {msg}") not in parts:
            parts.append(part)
    return "invalid request: " + "; ".join(parts[:6]) + " (fix these fields; see the OpenAI API reference)"


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    cause = exc.__cause__
    if exc.detail == PARSE_ERROR and cause is not None:  # FastAPI's json.loads failed in a non-JSON way
        if isinstance(cause, UnicodeDecodeError):
            return error_response(400, f"request body is not valid UTF-8 (byte {cause.start}); send JSON encoded "
                                       "as UTF-8")
        if isinstance(cause, RecursionError):
            return error_response(400, "request body JSON is nested too deeply; send a flat JSON object as the "
                                       "OpenAI API reference describes")
        return error_response(400, f"request body cannot be parsed as JSON ({type(cause).__name__}); send a JSON "
                                   "object with Content-Type: application/json")
    return error_response(exc.status_code, str(exc.detail))


def add_error_handlers(app: FastAPI) -> None:
    """Map every exception a request can raise to its OpenAI-style answer."""
    handlers = {
        APIError: lambda r, e: error_response(e.status, e.message, e.param, e.headers),
        QueueTimeoutError: lambda r, e: error_response(503, queue_timeout_message(e), headers=RETRY_LATER),
        UnknownPlayerError: lambda r, e: error_response(404, str(e), "model"),
        AdapterError: lambda r, e: error_response(400, str(e)),
        AdapterPathError: lambda r, e: error_response(403, str(e), "lora_path"),
        EngineDeadError: lambda r, e: error_response(503, f"{e}; the server must be restarted"),
        RequestError: lambda r, e: error_response(500, f"{e}; the server goes on serving other requests"),
        RequestValidationError: lambda r, e: error_response(400, validation_message(e.errors())),
        StarletteHTTPException: lambda r, e: http_error_response(e),
        UnicodeEncodeError: lambda r, e: error_response(400, "request text contains a lone surrogate; send valid "
                                                             "Unicode"),
        Exception: lambda r, e: error_response(500, f"internal server error: {e!r}"),
    }
    for cls, fn in handlers.items():
        app.add_exception_handler(cls, fn)
