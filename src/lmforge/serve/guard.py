"""The guards every request to ``lmforge serve`` passes, as ASGI middleware, outermost first:

1. :class:`CatchAll`: an exception nobody handled becomes a one-line JSON 500 (logged with its traceback),
   and the connection stays usable (uvicorn would close it under the next request).
2. :class:`HostCheck`: the ``Host`` header must name an address the server was bound to (421 otherwise), so
   a web page whose DNS name is rebound to 127.0.0.1 cannot talk to a server on this machine.
3. :class:`OriginCheck`: a browser request from a page of another origin is refused (403) unless
   ``--allow-origin`` names that origin; then Starlette's CORS middleware answers it with CORS headers. No
   CORS header is ever sent otherwise.
4. :class:`ApiKey`: with ``--api-key``, every route but ``/health`` needs ``Authorization: Bearer KEY``
   (compared in constant time; 401 otherwise).
5. :class:`BodyLimit`: a body over ``--max-body-bytes`` gets 413.
6. :class:`JsonBody`: a POST body without a JSON ``Content-Type`` (curl's ``-d`` sends
   ``application/x-www-form-urlencoded``) is read as JSON; a multipart upload gets 415.

Reading a urlencoded or text/plain body as JSON is what a cross-site HTML form could send without a CORS
preflight; (2) and (3) refuse such requests from browsers, and no route changes anything on disk.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from .errors import error_response, one_line

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: content types read as JSON: none (curl without -H), a form (curl -d), plain text
_AS_JSON = (b"", b"application/x-www-form-urlencoded", b"text/plain")


@dataclasses.dataclass(frozen=True)
class ServeAccess:
    """Who may talk to the server (``lmforge serve --api-key / --allowed-host / --allow-origin``).

    Attributes:
        api_key: the key every route but ``/health`` needs as ``Authorization: Bearer KEY`` (None: no key).
        allowed_hosts: host names the ``Host`` header may carry (case-insensitive, port ignored; ``*`` = any);
            None = no check (an app not bound by lmforge, e.g. under a test client).
        allow_ip_literals: also accept any IP address as ``Host`` (a server bound to every interface: an IP
            literal cannot be rebound, a DNS name can).
        allow_origins: web origins (``https://app.example``) whose pages may call the server (CORS).
    """

    api_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    allow_ip_literals: bool = False
    allow_origins: tuple[str, ...] = ()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in ("0.0.0.0", "::", "")


def loopback_hosts(bind: str = "127.0.0.1", extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The names the ``Host`` header may carry for a server bound to ``bind``, plus ``extra``.

    Loopback: the address and localhost, 127.0.0.1, ::1.  Every interface (0.0.0.0, ::): the loopback
    names, this machine's host name and full name (and any IP, see :attr:`ServeAccess.allow_ip_literals`).
    Any other address: that address.
    """
    names = [bind.strip("[]")]
    if is_loopback(bind) or is_wildcard(bind):
        names += LOOPBACK_NAMES
    if is_wildcard(bind):
        names += [socket.gethostname(), socket.getfqdn()]
    return tuple(dict.fromkeys(n.lower() for n in [*names, *extra] if n))


def host_name(value: str) -> str:
    """The name of a ``Host`` header (or an origin's netloc) without its port: ``[::1]:8000`` -> ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _header(scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return v
    return None


def _refuse(scope, receive, send, status: int, message: str, **kwargs):
    return error_response(scope.get("path", ""), status, message, **kwargs)(scope, receive, send)


class CatchAll:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = {"started": False, "done": False}

        async def tracked(message):
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            logger.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if not state["started"]:
                message = f"internal error: {type(e).__name__}: {one_line(e)} (the server log has the details)"
                await _refuse(scope, receive, send, 500, message)
            elif not state["done"]:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


class HostCheck:
    def __init__(self, app, access: ServeAccess):
        self.app = app
        self.hosts = None if access.allowed_hosts is None or "*" in access.allowed_hosts else access.allowed_hosts
        self.ip_literals = access.allow_ip_literals

    def allowed(self, value: str) -> bool:
        name = host_name(value)
        if self.hosts is None or name in self.hosts:
            return True
        if self.ip_literals:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.hosts is None:
            return await self.app(scope, receive, send)
        raw = _header(scope, b"host")
        value = raw.decode("latin-1") if raw is not None else ""
        if raw is not None and not self.allowed(value):
            message = (
                f"this server does not answer for Host '{one_line(value)}' (a guard against DNS rebinding); "
                f"it answers for {', '.join(self.hosts)}; start it with --allowed-host NAME to add a name"
            )
            return await _refuse(scope, receive, send, 421, message)
        await self.app(scope, receive, send)


class OriginCheck:
    def __init__(self, app, access: ServeAccess):
        self.app = app
        self.origins = {o.rstrip("/").lower() for o in access.allow_origins}

    async def __call__(self, scope, receive, send):
        raw = _header(scope, b"origin") if scope["type"] == "http" else None
        if raw is None:
            return await self.app(scope, receive, send)
        origin = raw.decode("latin-1").rstrip("/").lower()
        host = (_header(scope, b"host") or b"").decode("latin-1").lower()
        if "*" in self.origins or origin in self.origins or urlsplit(origin).netloc == host:
            return await self.app(scope, receive, send)  # an allowed origin, or the server's own pages
        message = (
            f"requests from web pages of another origin ({one_line(origin)}) are refused; start the server with "
            f"--allow-origin {one_line(origin)} to let that site's pages call it"
        )
        await _refuse(scope, receive, send, 403, message)


class ApiKey:
    OPEN = ("/health",)

    def __init__(self, app, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.OPEN:
            return await self.app(scope, receive, send)
        raw = _header(scope, b"authorization") or b""
        scheme, _, given = raw.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.key):
            return await self.app(scope, receive, send)
        what = "the API key is wrong" if raw else "this server needs an API key"
        message = f"{what}: send the header 'Authorization: Bearer KEY' (the key given to --api-key or LMFORGE_API_KEY)"
        await _refuse(scope, receive, send, 401, message, code="invalid_api_key")


class BodyLimit:
    """413 for a body over ``max_bytes``, whether it says its length or comes in chunks.

    The body is read here in full (it is small: the limit), so that a chunked body over the limit is refused
    before a route reads it (FastAPI would turn an error raised while it reads into a 400 "error parsing the
    body"); the route then receives the same bytes in one message."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        msg = f"the request body is over {self.max_bytes} bytes (--max-body-bytes)"
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _refuse(scope, receive, send, 413, msg)
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_bytes:
                return await _refuse(scope, receive, send, 413, msg)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)


def _replay(messages: list[dict], receive):
    """A ``receive`` that gives ``messages`` first, then the client's own."""
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()

    return replayed


class JsonBody:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        raw = _header(scope, b"content-type")
        kind = (raw or b"").split(b";")[0].strip().lower()
        if b"json" in kind:
            return await self.app(scope, receive, send)
        if kind not in _AS_JSON:
            message = f"the body is {kind.decode('latin-1')}; send it as JSON (Content-Type: application/json)"
            return await _refuse(scope, receive, send, 415, message)
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        headers.append((b"content-type", b"application/json"))
        await self.app({**scope, "headers": headers}, receive, send)


def _json_cors():
    """Starlette's CORS middleware, with its preflight refusals (text/plain) answered as one line of JSON."""
    from starlette.middleware.cors import CORSMiddleware

    class JsonCors(CORSMiddleware):
        def preflight_response(self, request_headers):
            response = super().preflight_response(request_headers)
            if response.status_code < 400:
                return response
            reason = response.body.decode("utf-8", "replace")
            message = (f"the CORS preflight is refused ({one_line(reason)}); the server allows the methods GET and "
                       f"POST and the headers Authorization and Content-Type")
            return error_response("", response.status_code, message)

    return JsonCors


def install(app, access: ServeAccess, max_body_bytes: int) -> None:
    """Add the guards to ``app`` in the order of the module docstring (Starlette runs the last added first)."""
    app.add_middleware(JsonBody)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if access.api_key:
        app.add_middleware(ApiKey, key=access.api_key)
    if access.allow_origins:
        app.add_middleware(
            _json_cors(),
            allow_origins=list(access.allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(OriginCheck, access=access)
    app.add_middleware(HostCheck, access=access)
    app.add_middleware(CatchAll)
