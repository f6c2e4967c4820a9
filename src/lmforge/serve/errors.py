"""How ``lmforge serve`` refuses a request: one line of JSON in the shape the route's clients expect.

lmforge's own routes answer ``{"error": "one line"}``; the OpenAI-compatible routes (``/v1/completions``,
``/v1/embeddings``, ``/v1/models``) answer OpenAI's ``{"error": {"message", "type", "param", "code"}}``, which
the ``openai`` client turns into its ``APIStatusError`` subclasses (400 ``BadRequestError``, 401
``AuthenticationError``, 404 ``NotFoundError`` ...).  Every refusal, from a middleware, a handler or an
unexpected exception, goes through :func:`error_response`.
"""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

#: the routes whose clients expect OpenAI's error shape
OPENAI_ROUTES = ("/v1/completions", "/v1/embeddings", "/v1/models")
#: the rest of OpenAI's API, which lmforge does not serve: an OpenAI client sent there gets its own error shape
OPENAI_UNSERVED = ("/v1/chat", "/v1/responses", "/v1/audio", "/v1/images", "/v1/files", "/v1/uploads",
                   "/v1/fine_tuning", "/v1/fine-tunes", "/v1/moderations", "/v1/batches", "/v1/assistants",
                   "/v1/threads", "/v1/vector_stores", "/v1/realtime", "/v1/evals", "/v1/containers", "/v1/edits",
                   "/v1/engines", "/v1/conversations")

#: OpenAI's error ``type`` per status (anything else 4xx: ``invalid_request_error``)
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


class HTTPError(Exception):
    """A refused request: status code, one line, and for OpenAI's shape the offending field and a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def is_openai_route(path: str) -> bool:
    """A route of OpenAI's API, served here (:data:`OPENAI_ROUTES`) or not (:data:`OPENAI_UNSERVED`)."""
    return any(path == r or path.startswith(r + "/") for r in (*OPENAI_ROUTES, *OPENAI_UNSERVED))


def unserved_openai_route(path: str) -> bool:
    return any(path == r or path.startswith(r + "/") for r in OPENAI_UNSERVED)


def error_body(path: str, status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """The JSON of a refusal on ``path`` (see the module docstring)."""
    message = one_line(message)
    if not is_openai_route(path):
        return {"error": message}
    kind = "server_error" if status >= 500 else _OPENAI_TYPES.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A refusal as a response; 429 says when to try again, 401 which scheme to use."""
    headers = dict(headers or {})
    if status == 429:
        headers.setdefault("Retry-After", "1")
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(error_body(path, status, message, param, code), status_code=status, headers=headers or None)


def validation_error(path: str, exc: RequestValidationError) -> JSONResponse:
    """A body that is not JSON (400) or a field of the wrong type or range (422; 400 on OpenAI routes, as
    OpenAI answers), naming the field."""
    errors = exc.errors()
    openai = is_openai_route(path)
    if not errors:
        return error_response(path, 400, "invalid request")
    e = errors[0]
    if e.get("type") == "json_invalid":
        detail = e.get("ctx", {}).get("error", e.get("msg", ""))
        return error_response(path, 400, f"malformed JSON: {one_line(detail)}")
    loc = [str(x) for x in e.get("loc", ()) if x != "body" and not _is_type_tag(x)]
    param = loc[0] if loc else None
    where = f"field '{'.'.join(loc)}'" if loc else "the body"
    status = 400 if openai else 422
    if e.get("type") == "missing":
        return error_response(path, status, f"{where} is missing", param)
    return error_response(path, status, f"{where}: {one_line(e.get('msg', 'invalid'))}", param)


def _is_type_tag(part: object) -> bool:
    """pydantic names the member of a union it tried (``str``, ``list[int]``) in an error's location."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "none"))
