"""The HTTP API and the playground page of ``lmforge serve`` (FastAPI; run by uvicorn).

Every answer comes from the library functions the CLI calls: ``model.fill_mask`` (``lmforge
fill-mask``), :func:`lmforge.generation.generate_text` (``lmforge generate``),
:func:`lmforge.evaluate.polysemy.word_similarities` over ``model.embed`` (``lmforge embed``),
:func:`lmforge.models.vectors.encode` (``lmforge encode``) and ``TransferRun.predict`` with
:func:`lmforge.data.tasks.example_from_fields` (``lmforge predict``), so the server and the CLI give the same
numbers for the same inputs.  The OpenAI-compatible routes are in :mod:`lmforge.serve.openai`, the guards
every request passes (Host, Origin, API key, body size, content type, unexpected errors) in
:mod:`lmforge.serve.guard`, generations and their slots in :mod:`lmforge.serve.generating`.

Requests to one model's ``embed`` and to one run's ``predict`` go through a
:class:`~lmforge.serve.batching.MicroBatcher`: those that arrive together share one forward pass.
Bad requests get a 4xx status and one line of JSON (:mod:`lmforge.serve.errors`); the server keeps serving.
A served folder that changes on disk (``finetune --overwrite``, a new checkpoint) is reopened by the next
request that names it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from importlib import resources
from pathlib import Path

import anyio.to_thread
import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response

from .. import __version__
from ..data.tasks import TaskData, example_from_fields
from ..errors import DataError, LmforgeError, MissingExtraError
from ..evaluate import find_word, layer_names, span_vectors
from ..evaluate.polysemy import word_similarities
from ..families import FAMILIES
from ..generation import check_generation_args
from ..models.onnx_backend import BACKENDS, QUANTIZE
from ..transfer.onnx_run import run_graph
from ..utils import check_unicode
from . import openai as openai_routes
from .batching import MicroBatcher
from .errors import OPENAI_ROUTES, HTTPError, error_response, one_line, unserved_openai_route, validation_error
from .generating import Generations, generate_one
from .guard import ServeAccess, install
from .registry import Entry, folder_stamp, open_entries, open_entry, read_curves
from .requests import EmbedRequest, FillMaskRequest, GenerateRequest, PredictRequest, ProjectionRequest, ServeLimits

logger = logging.getLogger(__name__)

_NEEDS = {
    "embed": "embed needs a model folder with a tokenizer",
    "predict": "predict needs a run from `lmforge finetune`",
    "curves": "it has no metrics.jsonl",
}


def _needs(op: str) -> str:
    """What a request of ``op`` needs of a model (the families that fill masks or generate, by the registry)."""
    if op in ("fill-mask", "generate"):
        able = [f.label for f in FAMILIES.values() if (f.fills_mask if op == "fill-mask" else f.generates)]
        return f"{op} needs a {' or '.join(able)} model"
    return _NEEDS[op]


class Server:
    """The loaded folders, their batchers, the generation slots and the request logic (one per app)."""

    def __init__(self, entries: dict[str, Entry], limits: ServeLimits, backend: str = "torch", quantize: str = "none"):
        if backend not in BACKENDS or quantize not in QUANTIZE:
            raise LmforgeError(f"a server computes on torch, onnx or auto, in fp32 (none) or int8; not "
                               f"{backend}/{quantize}")
        if backend == "torch" and quantize != "none":
            raise LmforgeError("int8 runs on ONNX Runtime: use --backend onnx (or auto) with --quantize int8")
        self.entries = entries
        self.limits = limits
        self.backend, self.quantize = backend, quantize  # what sentence pipelines and runs run on (--backend)
        self.generations = Generations(limits.max_generations)
        self.batchers: dict[tuple[str, str], MicroBatcher] = {}
        self._reload_locks: dict[str, asyncio.Lock] = {}
        for name, e in entries.items():
            self._add_batchers(name, e)

    def _add_batchers(self, name: str, e: Entry) -> None:
        for key in [k for k in self.batchers if k[0] == name]:
            del self.batchers[key]
        wait = self.limits.batch_wait_ms / 1000.0
        if "embed" in e.supports:
            self.batchers[(name, "embed")] = MicroBatcher(
                lambda items, e=e: e.compute(e.obj.embed, items), self.limits.max_batch, wait, f"embed {name}"
            )
            # /v1/embeddings: the texts of concurrent requests in one encode call (openai.encode_items)
            self.batchers[(name, "encode")] = MicroBatcher(
                lambda items, e=e: openai_routes.encode_items(e, items), self.limits.max_batch, wait, f"encode {name}"
            )
        if "predict" in e.supports:
            self._set_run_backend(e)
            self.batchers[(name, "predict")] = MicroBatcher(
                self._predict_fn(e), self.limits.max_batch, wait, f"predict {name}"
            )
        if "fill-mask" in e.supports:  # one text per forward pass: queued so they do not fight for the cores
            self.batchers[(name, "fill-mask")] = MicroBatcher(
                lambda items, e=e: [e.compute(e.obj.fill_mask, t, top_k=k) for t, k in items], 1, 0.0,
                f"fill-mask {name}",
            )

    def _set_run_backend(self, e: Entry) -> None:
        """Let run ``e`` predict on the server's backend where the run has an ONNX graph (exported now, not on the
        first request); a run without one (features mode, a pair read in both orders) stays on torch."""
        if self.backend == "torch" and self.quantize == "none":
            return
        try:
            e.obj.set_backend(self.backend, self.quantize)
            if self.backend == "onnx" or self.quantize != "none":
                run_graph(e.obj, self.quantize)
        except MissingExtraError:  # asked for ONNX Runtime without it: say so before serving anything
            raise
        except LmforgeError as ex:
            e.obj.set_backend("torch")
            logger.warning("'%s' predicts on torch: %s", e.name, ex)

    @staticmethod
    def _predict_fn(entry: Entry):
        run = entry.obj

        def predict(examples: list) -> list[dict]:
            data = TaskData(run.cfg.task, list(examples), list(run.labels), "<http request>")
            return run.predict(data, use_cache=False)

        return predict

    # -- the folders -----------------------------------------------------------------------------------------
    async def fresh(self, name: str) -> Entry:
        """The entry ``name`` (404 if none), reopened first if its folder changed on disk."""
        e = self.entries.get(name)
        if e is None:
            raise HTTPError(
                404, f"no model named '{name}' is loaded; loaded: {', '.join(self.entries)}", "model", "model_not_found"
            )
        return await self._reload(e) if e.changed_on_disk() else e

    async def entry(self, name: str, op: str) -> Entry:
        """The entry ``name`` as :meth:`fresh` gives it; 400 if it cannot do ``op``."""
        e = await self.fresh(name)
        if op not in e.supports:
            kind = f"a {e.family} {e.kind}" if e.family else f"a {e.kind} folder"
            raise HTTPError(400, f"'{name}' is {kind}: {_needs(op)}", "model")
        return e

    async def _reload(self, old: Entry) -> Entry:
        """Reopen a folder that changed on disk; if it cannot be opened (half replaced, broken), keep serving
        the copy in memory and say so in the log and in ``/v1/models`` (``stale``)."""
        async with self._reload_locks.setdefault(old.name, asyncio.Lock()):
            current = self.entries[old.name]
            if not current.changed_on_disk():  # another request reloaded it while this one waited
                return current
            stamp = folder_stamp(current.path)
            try:
                new = await anyio.to_thread.run_sync(open_entry, current.path, current.name, current.device,
                                                    current.precision)
            except Exception as ex:
                when = time.strftime("%H:%M:%S", time.localtime(current.loaded_at))
                current.stale = (
                    f"{current.path} changed on disk but cannot be reopened ({one_line(ex)}); "
                    f"serving the copy loaded at {when}"
                )
                current.stamp = stamp  # tried once per change
                logger.warning("'%s': %s", current.name, current.stale)
                return current
            new.reloads = current.reloads + 1
            self.entries[current.name] = new
            self._add_batchers(current.name, new)
            logger.warning("reloaded '%s' from %s: the folder changed on disk", current.name, current.path)
            return new

    def text(self, value: str | None, field: str, allow_empty: bool = False) -> str:
        if value is None or (not allow_empty and not value.strip()):
            raise HTTPError(400, f"{field} is empty; give some text", field.split("[")[0])
        if len(value) > self.limits.max_text_chars:
            raise HTTPError(
                400,
                f"{field} is {len(value)} characters long; this server takes at most "
                f"{self.limits.max_text_chars} (--max-text-chars)",
                field.split("[")[0],
            )
        try:
            return check_unicode(value)
        except DataError as e:
            raise HTTPError(400, f"{field}: {e}", field.split("[")[0]) from None

    def texts(self, values: list[str], field: str, least: int = 1) -> list[str]:
        if len(values) < least:
            raise HTTPError(
                400, f"{field} needs at least {least} text{'s' if least > 1 else ''}, got {len(values)}", field
            )
        if len(values) > self.limits.max_texts:
            raise HTTPError(
                400, f"{field} has {len(values)} texts; this server takes at most {self.limits.max_texts}", field
            )
        return [self.text(v, f"{field}[{i}]") for i, v in enumerate(values)]

    # -- lmforge's own operations -----------------------------------------------------------------------------
    async def fill_mask(self, req: FillMaskRequest) -> dict:
        await self.entry(req.model, "fill-mask")
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

    async def _check_generate(self, req: GenerateRequest) -> Entry:
        e = await self.entry(req.model, "generate")
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

    async def generate(self, req: GenerateRequest, request: Request):
        e = await self._check_generate(req)
        options = dict(
            max_new_tokens=req.max_new_tokens, temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
            stop=req.stop, seed=req.seed, use_cache=req.use_cache,
        )
        if req.stream:
            return self.generations.stream(
                lambda slot, emit: e.compute(generate_one, e.obj, req.prompt, options, slot, emit), _generate_events
            )
        done = await self.generations.run(
            request, lambda slot: e.compute(generate_one, e.obj, req.prompt, options, slot)
        )
        return {"model": req.model, "prompt": req.prompt, "text": done.text}

    async def embed(self, req: EmbedRequest) -> dict:
        await self.entry(req.model, "embed")
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
        await self.entry(req.model, "embed")
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
        e = await self.entry(req.model, "predict")
        text = self.text(req.text, "text")
        pair = self.text(req.text_pair, "text_pair") if req.text_pair is not None else None
        choices = [self.text(c, f"choices[{i}]") for i, c in enumerate(req.choices)] if req.choices else None
        ex = example_from_fields(e.obj.cfg.task, text, pair, choices)
        (pred,) = await self.batchers[(req.model, "predict")].submit([ex])
        return {"model": req.model, "task": e.obj.cfg.task, "prediction": pred}


async def _generate_events(messages):
    """``/v1/generate``'s server-sent events: ``data: {"text"}`` per piece, then ``event: done`` or ``event: error``."""
    async for kind, value in messages:
        if kind == "piece":
            yield f"data: {json.dumps({'text': value}, ensure_ascii=False)}\n\n"
        elif kind == "done":
            yield f"event: done\ndata: {json.dumps({'text': value.text}, ensure_ascii=False)}\n\n"
        else:
            yield f"event: error\ndata: {json.dumps({'error': value}, ensure_ascii=False)}\n\n"


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


def create_app(
    paths: list[str | Path] | dict[str, Entry],
    limits: ServeLimits | None = None,
    access: ServeAccess | None = None,
    device: str | None = None,
    precision: str | None = None,
    backend: str = "torch",
    quantize: str = "none",
) -> FastAPI:
    """The FastAPI app serving ``paths`` (model folders, runs, folders being pretrained).

    Args:
        paths: the folders to load (or entries already opened, keyed by name).
        limits: request limits and batching (default :class:`ServeLimits`).
        access: API key, allowed ``Host`` names and web origins (default :class:`ServeAccess`: no key, any
            Host, no other origin).  ``lmforge serve`` and :func:`lmforge.serve.run_server` derive the Host
            names from the address they bind.
        device: where the folders compute (``cpu``, ``cuda``, ``cuda:N``, ``auto``); None: models on the CPU,
            runs where their own config says.
        precision: what the folders compute in (``fp32``, ``bf16``, ``fp16`` on CUDA, ``auto``); None: models in
            fp32, runs in the precision they were fine-tuned in.
        backend: ``torch``, ``onnx`` (ONNX Runtime) or ``auto`` (the faster, measured once per model): what runs
            the runs' ``/v1/predict`` where a run has an ONNX graph, and ``/v1/embeddings`` where a sentence
            pipeline reads the texts and the request names no backend; elsewhere torch.
        quantize: ``none`` or ``int8`` (ONNX Runtime's dynamic int8, approximate) for the same.
    Returns:
        The app; run it with uvicorn (``lmforge serve``) or test it with ``fastapi.testclient.TestClient``.
    """
    limits = limits or ServeLimits()
    access = access or ServeAccess()
    entries = paths if isinstance(paths, dict) else open_entries(list(paths), device, precision)
    server = Server(entries, limits, backend, quantize)
    app = FastAPI(
        title="lmforge serve",
        version=__version__,
        description="Fill-mask, generation, embeddings and fine-tuned predictions of lmforge models, and the "
        'OpenAI-compatible /v1/completions, /v1/embeddings and /v1/models. Errors are {"error": "one line"} '
        '(OpenAI routes: {"error": {"message", "type", "param", "code"}}) with a 4xx/5xx status.',
    )
    app.state.server = server
    app.state.access = access
    install(app, access, limits.max_body_bytes)
    _add_error_handlers(app)
    _add_routes(app, server)
    openai_routes.add_routes(app, server)
    _add_playground(app)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        return error_response(request.url.path, exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(LmforgeError)
    async def _lmforge_error(request: Request, exc: LmforgeError):
        return error_response(request.url.path, 400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return validation_error(request.url.path, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404 and unserved_openai_route(request.url.path):
            detail = (f"lmforge serve does not offer {request.url.path}; its OpenAI-compatible routes are "
                      f"{', '.join(OPENAI_ROUTES)} (see /docs)")
            return error_response(request.url.path, 404, detail, code="unknown_url")
        if exc.status_code == 404:
            detail = f"no such endpoint: {request.url.path} (see /docs)"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return error_response(request.url.path, exc.status_code, detail, headers=exc.headers)


def _add_routes(app: FastAPI, server: Server) -> None:
    @app.get("/health")
    async def health() -> dict:
        """Liveness: ok, the number of loaded folders and of generations running (no API key needed)."""
        return {"status": "ok", "models": len(server.entries), "generations_running": server.generations.running}

    @app.post("/v1/fill-mask")
    async def fill_mask(req: FillMaskRequest) -> dict:
        """The top-k fillers of each [MASK] (BERT), as `lmforge fill-mask` prints them."""
        return await server.fill_mask(req)

    @app.post("/v1/generate")
    async def generate(req: GenerateRequest, request: Request):
        """Continue a prompt (GPT) with `lmforge generate`'s options; `stream: true` answers with server-sent
        events: `data: {"text": piece}` per piece, then `event: done` with the whole text."""
        return await server.generate(req, request)

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
    async def curves(name: str, after: int = Query(0, ge=0, le=2**53)) -> dict:
        """The training events of a folder's metrics.jsonl (poll with `after` = the `lines` already read)."""
        e = await server.entry(name, "curves")
        return {"model": name, **read_curves(e.path, after)}


def _add_playground(app: FastAPI) -> None:
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
