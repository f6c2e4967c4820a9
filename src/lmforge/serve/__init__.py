"""``lmforge serve``: an HTTP API (FastAPI, run by uvicorn) and a web playground for model folders and runs.

Python API::

    from lmforge.serve import create_app, ServeLimits
    app = create_app(["models/bert", "runs/ft"], ServeLimits(max_new_tokens=64))
    # fastapi.testclient.TestClient(app).post("/v1/fill-mask", json={...}), or uvicorn.run(app)

See ``docs/serve.md`` for the endpoints.  Needs the ``serve`` extra (``pip install 'lmforge[serve]'``).
"""

from __future__ import annotations

from ..errors import LmforgeError

try:
    from .app import ServeLimits, create_app, pca_2d, run_server
except ImportError as e:  # pragma: no cover - depends on the installation
    if e.name not in ("fastapi", "uvicorn", "starlette", "pydantic", "anyio"):
        raise
    raise LmforgeError(f"lmforge serve needs {e.name}: pip install 'lmforge[serve]'") from None

__all__ = ["ServeLimits", "create_app", "pca_2d", "run_server"]
