"""``lmforge serve``: an HTTP API (FastAPI, run by uvicorn) and a web playground for model folders and runs.

Python API::

    from lmforge.serve import create_app, ServeLimits, run_server
    app = create_app(["models/bert", "runs/ft"], ServeLimits(max_new_tokens=64))
    # fastapi.testclient.TestClient(app).post("/v1/fill-mask", json={...})
    run_server(["models/bert"], host="127.0.0.1", port=8000, api_key=None)  # what `lmforge serve` runs

See ``docs/serve.md`` for the endpoints.  Needs the ``serve`` extra (``pip install 'lmforge[serve]'``).
"""

from __future__ import annotations

from ..errors import LmforgeError

try:
    from .app import create_app, pca_2d
    from .guard import ServeAccess, loopback_hosts
    from .requests import ServeLimits
    from .runner import access_for, run_server, serve
except ImportError as e:  # pragma: no cover - depends on the installation
    if e.name not in ("fastapi", "uvicorn", "starlette", "pydantic", "anyio"):
        raise
    raise LmforgeError(f"lmforge serve needs {e.name}: pip install 'lmforge[serve]'") from None

__all__ = ["ServeAccess", "ServeLimits", "access_for", "create_app", "loopback_hosts", "pca_2d", "run_server", "serve"]
