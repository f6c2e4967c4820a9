"""The HTTP API and the playground page of ``lmforge serve`` (FastAPI; run by uvicorn).

Every answer comes from the library functions the CLI calls: ``model.fill_mask`` (``lmforge
fill-mask``), :func:`lmforge.generation.generate_text` (``lmforge generate``),
:func:`lmforge.evaluate.polysemy.word_similarities` over ``model.embed`` (``lmforge embed``) and
``TransferRun.predict`` with :func:`lmforge.data.tasks.example_from_fields` (``lmforge predict``),
so the server and the CLI give the same numbers for the same inputs.

Requests to one model's ``embed`` and to one run's ``predict`` go through a
:class:`~lmforge.serve.batching.MicroBatcher`: those that arrive together share one forward pass.
Bad requests get a 4xx status and ``{"error": "one line"}``; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from importlib import resources
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from .. import __version__
from ..errors import LmforgeError
from .batching import MicroBatcher
from .registry import Entry, open_entries, read_curves

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServeLimits:
    """What one request may ask for, and how requests are batched (``lmforge serve`` flags).

    Attributes:
        max_body_bytes: largest request body (413 above).
        max_text_chars: longest text in any field (400 above).
        max_texts: most texts in one embed / projection request.
        max_new_tokens: the cap on a generation's ``max_new_tokens``.
        max_generations: generations running at once; one more gets 429 (try again).
        max_top_k: the largest ``top_k`` of fill-mask.
        max_batch: most texts / examples in one batched forward pass (1 = no batching).
        batch_wait_ms: how long the first request of a batch waits for others.
    """

    max_body_bytes: int = 64 * 1024
    max_text_chars: int = 2000
    max_texts: int = 32
    max_new_tokens: int = 256
    max_generations: int = 2
    max_top_k: int = 50
    max_batch: int = 16
    batch_wait_ms: float = 2.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v < (0 if f.name == "batch_wait_ms" else 1):
                raise LmforgeError(f"--{f.name.replace('_', '-')} must be >= {0 if f.name == 'batch_wait_ms' else 1}")


class HTTPError(Exception):
    """A refused request: status code and one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# -- request bodies ------------------------------------------------------------------------------------
class FillMaskRequest(BaseModel):
    model: str = Field(description="name of a loaded BERT model (see /v1/models)")
    text: str = Field(description='text with one or more [MASK], e.g. "the python is a large [MASK] ."')
    top_k: int = Field(5, ge=1, description="candidates per [MASK]")


class GenerateRequest(BaseModel):
    model: str = Field(description="name of a loaded GPT model")
    prompt: str = Field(description="text to continue")
    max_new_tokens: int = Field(100, ge=0, description="tokens to add at most (capped by the server)")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy; > 0 samples")
    top_k: int | None = Field(None, ge=0, description="sample only from the k most likely tokens")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="sample only from this nucleus")
    stop: list[str] | None = Field(None, description="stop when the text contains one of these (not returned)")
    seed: int | None = Field(None, description="seed for sampling (same seed, same text)")
    use_cache: bool = Field(True, description="use the KV cache")
    stream: bool = Field(False, description="answer with server-sent events, one per piece of text")


class EmbedRequest(BaseModel):
    model: str = Field(description="name of a loaded model (any family)")
    texts: list[str] = Field(description="the texts (two or more with `word`: the word's cosine across them)")
    word: str | None = Field(None, description="a whole word, case-insensitive, in every text")


class ProjectionRequest(BaseModel):
    model: str = Field(description="name of a loaded model")
    texts: list[str] = Field(description="two or more texts, each containing `word`")
    word: str = Field(description="the word to follow across the texts")
    layer: int | None = Field(None, description="layer index (default: the top layer)")


class PredictRequest(BaseModel):
    model: str = Field(description="name of a loaded run (from `lmforge finetune`)")
    text: str = Field(description="classify/pair/tokens: the text; qa: the question; choice: the context")
    text_pair: str | None = Field(None, description="pair: the second text; qa: the context")
    choices: list[str] | None = Field(None, description="choice: two or more choices")


# -- helpers -------------------------------------------------------------------------------------------
def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _validation_message(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    if not errors:
        return 400, "invalid request"
    e = errors[0]
    if e.get("type") == "json_invalid":
        return 400, f"malformed JSON: {_one_line(e.get('ctx', {}).get('error', e.get('msg', '')))}"
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    where = f"field '{'.'.join(loc)}'" if loc else "the body"
    if e.get("type") == "missing":
        return 422, f"{where} is missing"
    return 422, f"{where}: {_one_line(e.get('msg', 'invalid'))}"


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: refuse a request body over ``max_bytes`` with 413 (by its header or as it streams)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        msg = f"the request body is over {self.max_bytes} bytes (--max-body-bytes)"
        for k, v in scope.get("headers", []):
            if k == b"content-length" and v.isdigit() and int(v) > self.max_bytes:
                return await JSONResponse({"error": msg}, status_code=413)(scope, receive, send)
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge()
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _BodyTooLarge:
            if not started:
                await JSONResponse({"error": msg}, status_code=413)(scope, receive, send)


class _Cancelled(Exception):
    pass


class Server:
    """The loaded folders, their batchers and the request logic (one per app)."""

    def __init__(self, entries: dict[str, Entry], limits: ServeLimits):
        self.entries = entries
        self.limits = limits
        self.generations = 0  # running now
        self._gen_lock = threading.Lock()
        self.batchers: dict[tuple[str, str], MicroBatcher] = {}
        wait = limits.batch_wait_ms / 1000.0
        for name, e in entries.items():
            if "embed" in e.supports:
                self.batchers[(name, "embed")] = MicroBatcher(e.obj.embed, limits.max_batch, wait, f"embed {name}")
            if "predict" in e.supports:
                self.batchers[(name, "predict")] = MicroBatcher(
                    self._predict_fn(e), limits.max_batch, wait, f"predict {name}"
                )
            if "fill-mask" in e.supports:  # one text per forward pass: queued so they do not fight for the cores
                self.batchers[(name, "fill-mask")] = MicroBatcher(
                    lambda items, m=e.obj: [m.fill_mask(t, top_k=k) for t, k in items], 1, 0.0, f"fill-mask {name}"
                )

    @staticmethod
    def _predict_fn(entry: Entry):
        from ..data.tasks import TaskData

        run = entry.obj

        def predict(examples: list) -> list[dict]:
            data = TaskData(run.cfg.task, list(examples), list(run.labels), "<http request>")
            return run.predict(data, use_cache=False)

        return predict

    # -- checks --------------------------------------------------------------------------------------------
    def entry(self, name: str, op: str) -> Entry:
        e = self.entries.get(name)
        if e is None:
            raise HTTPError(404, f"no model named '{name}' is loaded; loaded: {', '.join(self.entries)}")
        if op not in e.supports:
            what = {
                "fill-mask": "fill-mask needs a BERT model",
                "generate": "generate needs a GPT model",
                "embed": "embed needs a model folder with a tokenizer",
                "predict": "predict needs a run from `lmforge finetune`",
                "curves": "it has no metrics.jsonl",
            }[op]
            kind = f"a {e.family} {e.kind}" if e.family else f"a {e.kind} folder"
            raise HTTPError(400, f"'{name}' is {kind}: {what}")
        return e

    def text(self, value: str | None, field: str, allow_empty: bool = False) -> str:
        if value is None or (not allow_empty and not value.strip()):
            raise HTTPError(400, f"{field} is empty; give some text")
        if len(value) > self.limits.max_text_chars:
            raise HTTPError(
                400,
                f"{field} is {len(value)} characters long; this server takes at most "
                f"{self.limits.max_text_chars} (--max-text-chars)",
            )
        return value

    def texts(self, values: list[str], field: str, least: int = 1) -> list[str]:
        if len(values) < least:
            raise HTTPError(400, f"{field} needs at least {least} text{'s' if least > 1 else ''}, got {len(values)}")
        if len(values) > self.limits.max_texts:
            raise HTTPError(400, f"{field} has {len(values)} texts; this server takes at most {self.limits.max_texts}")
        return [self.text(v, f"{field}[{i}]") for i, v in enumerate(values)]

    # -- operations -----------------------------------------------------------------------------------------
    async def fill_mask(self, req: FillMaskRequest) -> dict:
        self.entry(req.model, "fill-mask")
        text = self.text(req.text, "text")
        if "[MASK]" not in text:
            raise HTTPError(400, 'text has no [MASK]; write e.g. "the python is a large [MASK] ."')
        if req.top_k > self.limits.max_top_k:
            raise HTTPError(400, f"top_k {req.top_k} is over this server's cap of {self.limits.max_top_k}")
        (result,) = await self.batchers[(req.model, "fill-mask")].submit([(text, req.top_k)])
        return {
            "model": req.model,
            "masks": [[{"token": t, "prob": float(p)} for t, p in cands] for cands in result],
        }

    def _check_generate(self, req: GenerateRequest) -> Entry:
        from ..generation import check_generation_args

        e = self.entry(req.model, "generate")
        self.text(req.prompt, "prompt")
        check_generation_args(req.max_new_tokens, req.temperature, req.top_k, req.top_p)
        if req.max_new_tokens > self.limits.max_new_tokens:
            raise HTTPError(
                400,
                f"max_new_tokens {req.max_new_tokens} is over this server's cap of {self.limits.max_new_tokens} "
                f"(--max-new-tokens)",
            )
        for s in req.stop or []:
            self.text(s, "stop", allow_empty=True)
        if not e.obj.tokenizer.encode(req.prompt):
            raise HTTPError(400, "the prompt is empty; give some text to continue")
        return e

    def _take_slot(self) -> None:
        with self._gen_lock:
            if self.generations >= self.limits.max_generations:
                raise HTTPError(
                    429,
                    f"{self.generations} generations are running (the limit, --max-generations); try again shortly",
                )
            self.generations += 1

    def _free_slot(self) -> None:
        with self._gen_lock:
            self.generations -= 1

    def _gen_kwargs(self, req: GenerateRequest) -> dict:
        return dict(
            max_new_tokens=req.max_new_tokens,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            stop=req.stop,
            seed=req.seed,
            use_cache=req.use_cache,
        )

    async def generate(self, req: GenerateRequest) -> dict:
        import anyio.to_thread

        from ..generation import generate_text

        e = self._check_generate(req)
        self._take_slot()
        try:
            text = await anyio.to_thread.run_sync(lambda: generate_text(e.obj, req.prompt, **self._gen_kwargs(req)))
        finally:
            self._free_slot()
        return {"model": req.model, "prompt": req.prompt, "text": text}

    def generate_stream(self, req: GenerateRequest) -> StreamingResponse:
        from ..generation import generate_text

        e = self._check_generate(req)
        self._take_slot()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()

        def on_text(piece: str) -> None:
            if cancelled.is_set():
                raise _Cancelled()
            loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))

        def work() -> None:
            try:
                text = generate_text(e.obj, req.prompt, on_text=on_text, **self._gen_kwargs(req))
                loop.call_soon_threadsafe(queue.put_nowait, ("done", text))
            except _Cancelled:
                pass
            except Exception as ex:  # the stream has started: the error travels as an event
                logger.warning("generation failed: %s", ex)
                loop.call_soon_threadsafe(queue.put_nowait, ("error", _one_line(str(ex))))
            finally:
                self._free_slot()

        threading.Thread(target=work, name="lmforge-generate", daemon=True).start()

        async def events():
            try:
                while True:
                    kind, value = await queue.get()
                    if kind == "text":
                        yield f"data: {json.dumps({'text': value}, ensure_ascii=False)}\n\n"
                    elif kind == "done":
                        yield f"event: done\ndata: {json.dumps({'text': value}, ensure_ascii=False)}\n\n"
                        return
                    else:
                        yield f"event: error\ndata: {json.dumps({'error': value}, ensure_ascii=False)}\n\n"
                        return
            finally:
                cancelled.set()  # a client that goes away stops its generation

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def embed(self, req: EmbedRequest) -> dict:
        from ..evaluate import find_word, layer_names, span_vectors
        from ..evaluate.polysemy import word_similarities

        self.entry(req.model, "embed")
        texts = self.texts(req.texts, "texts", 2 if req.word is not None and len(req.texts) != 1 else 1)
        layers = await self.batchers[(req.model, "embed")].submit(texts)
        names = layer_names(layers[0])
        if req.word is None:
            return {
                "model": req.model,
                "layer_names": names,
                "results": [
                    {
                        "text": t,
                        "tokens": tl.tokens,
                        "offsets": [list(o) for o in tl.offsets],
                        "vectors": tl.layers.float().tolist(),
                    }
                    for t, tl in zip(texts, layers)
                ],
            }
        word = self.text(req.word, "word")
        if len(texts) == 1:
            span = find_word(texts[0], word)
            if span is None:
                raise HTTPError(400, f"the word '{word}' does not occur in the text")
            return {
                "model": req.model,
                "word": word,
                "layer_names": names,
                "vectors": span_vectors(layers[0], span).tolist(),
            }
        rows = word_similarities(_Embedded(texts, layers), texts, word, req.model)
        return {
            "model": req.model,
            "word": word,
            "layer_names": [r.layer for r in rows],
            "rows": [
                {
                    "layer": r.layer,
                    "pairs": [{"a": i, "b": j, "cosine": c} for (i, j), c in r.pairs.items()],
                    "mean": r.mean,
                }
                for r in rows
            ],
        }

    async def projection(self, req: ProjectionRequest) -> dict:
        from ..evaluate import find_word, layer_names, span_vectors

        self.entry(req.model, "embed")
        texts = self.texts(req.texts, "texts", 2)
        word = self.text(req.word, "word")
        spans = []
        for k, t in enumerate(texts):
            span = find_word(t, word)
            if span is None:
                raise HTTPError(400, f"the word '{word}' does not occur in text {k + 1}: {t!r}")
            spans.append(span)
        layers = await self.batchers[(req.model, "embed")].submit(texts)
        names = layer_names(layers[0])
        li = len(names) - 1 if req.layer is None else req.layer
        if not -len(names) <= li < len(names):
            raise HTTPError(400, f"layer {req.layer} does not exist; this model has layers 0..{len(names) - 1}")
        li %= len(names)
        vecs = np.stack([span_vectors(tl, sp)[li].double().numpy() for tl, sp in zip(layers, spans)])
        points, explained = pca_2d(vecs)
        return {
            "model": req.model,
            "word": word,
            "layer": li,
            "layer_name": names[li],
            "layer_names": names,
            "points": [{"text": t, "x": float(x), "y": float(y)} for t, (x, y) in zip(texts, points)],
            "explained_variance_ratio": [float(v) for v in explained],
        }

    async def predict(self, req: PredictRequest) -> dict:
        from ..data.tasks import example_from_fields

        e = self.entry(req.model, "predict")
        text = self.text(req.text, "text")
        pair = self.text(req.text_pair, "text_pair") if req.text_pair is not None else None
        choices = [self.text(c, f"choices[{i}]") for i, c in enumerate(req.choices)] if req.choices else None
        ex = example_from_fields(e.obj.cfg.task, text, pair, choices)
        (pred,) = await self.batchers[(req.model, "predict")].submit([ex])
        return {"model": req.model, "task": e.obj.cfg.task, "prediction": pred}


class _Embedded:
    """Stands in for a model whose ``embed`` already ran (in a batch) for these texts."""

    def __init__(self, texts: list[str], layers: list):
        self._texts = list(texts)
        self._layers = list(layers)

    def embed(self, texts: list[str]) -> list:
        if list(texts) != self._texts:
            raise RuntimeError("internal error: embed asked for other texts than were run")
        return self._layers


def pca_2d(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Project rows onto their first two principal components (numpy SVD of the centred rows).

    Args:
        vectors: (N, C) one row per point.
    Returns:
        ((N, 2) coordinates, (2,) share of the variance each component explains); components with
        no variance (e.g. word2vec's identical vectors) give zeros.  Signs are fixed so that the
        largest loading of each component is positive (the same input gives the same picture).
    """
    x = np.asarray(vectors, dtype=np.float64)
    x = x - x.mean(axis=0, keepdims=True)
    n = x.shape[0]
    out = np.zeros((n, 2))
    ratio = np.zeros(2)
    total = float((x**2).sum())
    if n < 2 or total <= 1e-20:
        return out, ratio
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    k = min(2, len(s))
    for c in range(k):
        sign = 1.0 if vt[c, np.argmax(np.abs(vt[c]))] >= 0 else -1.0
        out[:, c] = u[:, c] * s[c] * sign
        ratio[c] = s[c] ** 2 / total
    return out, ratio


def create_app(paths: list[str | Path] | dict[str, Entry], limits: ServeLimits | None = None) -> FastAPI:
    """The FastAPI app serving ``paths`` (model folders, runs, folders being pretrained).

    Args:
        paths: the folders to load (or entries already opened, keyed by name).
        limits: request limits and batching (default :class:`ServeLimits`).
    Returns:
        The app; run it with uvicorn (``lmforge serve``) or test it with ``fastapi.testclient.TestClient``.
    """
    limits = limits or ServeLimits()
    entries = paths if isinstance(paths, dict) else open_entries(list(paths))
    server = Server(entries, limits)
    app = FastAPI(
        title="lmforge serve",
        version=__version__,
        description="Fill-mask, generation, embeddings and fine-tuned predictions of lmforge models. "
        'Errors are {"error": "one line"} with a 4xx status.',
    )
    app.state.server = server
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(LmforgeError)
    async def _lmforge_error(request: Request, exc: LmforgeError):
        return JSONResponse({"error": _one_line(str(exc))}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        status, msg = _validation_message(exc)
        return JSONResponse({"error": msg}, status_code=status)

    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            detail = f"no such endpoint: {request.url.path} (see /docs)"
        return JSONResponse({"error": _one_line(detail)}, status_code=exc.status_code)

    @app.get("/health")
    async def health() -> dict:
        """Liveness: ok, the number of loaded folders and of generations running."""
        return {"status": "ok", "models": len(server.entries), "generations_running": server.generations}

    @app.get("/v1/models")
    async def models() -> dict:
        """The loaded folders: name, kind, family, parameters and what each supports."""
        return {"models": [e.describe() for e in server.entries.values()], "limits": dataclasses.asdict(limits)}

    @app.post("/v1/fill-mask")
    async def fill_mask(req: FillMaskRequest) -> dict:
        """The top-k fillers of each [MASK] (BERT), as `lmforge fill-mask` prints them."""
        return await server.fill_mask(req)

    @app.post("/v1/generate")
    async def generate(req: GenerateRequest):
        """Continue a prompt (GPT) with `lmforge generate`'s options; `stream: true` answers with server-sent
        events: `data: {"text": piece}` per piece, then `event: done` with the whole text."""
        if req.stream:
            return server.generate_stream(req)
        return await server.generate(req)

    @app.post("/v1/embed")
    async def embed(req: EmbedRequest) -> dict:
        """Per-layer vectors of every token; with `word`: that word's per-layer vector (one text) or its
        per-layer cosine across the texts, as `lmforge embed --word` prints it."""
        return await server.embed(req)

    @app.post("/v1/projection")
    async def projection(req: ProjectionRequest) -> dict:
        """A word's vectors across several texts at one layer, projected to 2-D by PCA."""
        return await server.projection(req)

    @app.post("/v1/predict")
    async def predict(req: PredictRequest) -> dict:
        """A fine-tuned run's prediction, as `lmforge predict` prints it."""
        return await server.predict(req)

    @app.get("/v1/curves/{name}")
    async def curves(name: str, after: int = 0) -> dict:
        """The training events of a folder's metrics.jsonl (poll with `after` = the `lines` already read)."""
        e = server.entry(name, "curves")
        return {"model": name, **read_curves(e.path, max(0, after))}

    static = resources.files("lmforge.serve") / "static"

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse((static / "index.html").read_text(encoding="utf-8"))

    @app.get("/static/{name}", include_in_schema=False)
    async def static_file(name: str) -> Response:
        types = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
        suffix = Path(name).suffix
        f = static / name
        if "/" in name or suffix not in types or not f.is_file():
            raise HTTPError(404, f"no such file: /static/{name}")
        return Response(f.read_text(encoding="utf-8"), media_type=f"{types[suffix]}; charset=utf-8")

    return app


def run_server(
    paths: list[str | Path], host: str = "127.0.0.1", port: int = 8000, limits: ServeLimits | None = None
) -> None:
    """Load ``paths`` and serve them with uvicorn until interrupted."""
    import uvicorn

    app = create_app(paths, limits)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
