"""OpenAI-compatible routes of ``lmforge serve``: what the ``openai`` client, LangChain, LlamaIndex and anything
written against vLLM or llama.cpp's server call.

- ``POST /v1/completions`` (GPT): ``prompt`` (a string or a list), ``max_tokens`` (default 16),
  ``temperature`` (default 1, OpenAI's), ``top_p``, ``stop`` (a string or up to 4), ``seed``, ``n``, ``echo``,
  lmforge's ``top_k``; ``stream`` answers with server-sent events of ``text_completion`` chunks ending in
  ``data: [DONE]`` (``stream_options.include_usage`` adds a usage chunk).  Each text is
  :func:`lmforge.generation.generate_text`'s, so a greedy completion is what ``lmforge generate`` prints;
  with ``seed`` and ``n`` > 1, choice ``j`` uses ``seed + j``.
- ``POST /v1/embeddings`` (any family): ``input`` (a string or a list of strings), ``encoding_format``
  ``float`` or ``base64`` (little-endian float32, as OpenAI sends it).  Each vector is
  :func:`lmforge.models.vectors.encode`'s: the mean of the top layer's token vectors (a model imported from
  sentence-transformers: its own pipeline, so the vectors are that library's), scaled to unit length
  as OpenAI's embeddings are (clients written for them compare by dot product or by Euclidean distance,
  which rank as cosine only for unit vectors).  lmforge's ``normalize``, ``pool`` and ``layer`` change
  that (``extra_body`` in the ``openai`` client), so ``lmforge encode``'s own defaults are one request away;
  ``backend`` (``torch``, ``onnx``, ``auto``) and ``quantize`` (``none``, ``int8``) are ``lmforge encode``'s
  (left out: the server's ``--backend`` where a sentence pipeline reads the texts).  The texts of requests that
  arrive together with the same options are encoded in one call (:func:`encode_items`), so they share padded
  forward passes.
- ``GET /v1/models`` and ``/v1/models/NAME``: OpenAI's list shape; lmforge's details (kind, family,
  parameters, supports, path, reloads ...) are extra keys of each model.

Token ids as ``prompt`` or ``input``, ``logprobs``, ``suffix``, ``best_of``, penalties and ``logit_bias`` are
refused with a 400 naming the field.  Errors have OpenAI's shape (:mod:`lmforge.serve.errors`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from ..models.vectors import encode, sentence_pipeline
from .errors import HTTPError
from .generating import Generated, Generations, generate_one
from .requests import COUNT_MAX, LAYER_MAX, SEED_MAX, Seed, ServeLimits, TopP

if TYPE_CHECKING:
    from .batching import MicroBatcher
    from .registry import Entry


class Server(Protocol):
    """What these routes use of :class:`lmforge.serve.app.Server` (the app imports this module, so this one names
    the members instead of importing the class)."""

    entries: dict[str, Entry]
    limits: ServeLimits
    generations: Generations
    batchers: dict[tuple[str, str], MicroBatcher]
    backend: str
    quantize: str

    async def fresh(self, name: str) -> Entry: ...

    async def entry(self, name: str, op: str) -> Entry: ...

    def text(self, value: str | None, field: str, allow_empty: bool = False) -> str: ...

    def texts(self, values: list[str], field: str, least: int = 1) -> list[str]: ...

#: OpenAI's defaults for a completion
DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0
MAX_STOPS = 4


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model: str = Field(description="name of a loaded GPT model (see /v1/models)")
    prompt: Any = Field(description="a string or a list of strings (token ids are not supported)")
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0, le=COUNT_MAX, description="tokens to add at most")
    temperature: float | None = Field(DEFAULT_TEMPERATURE, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = TopP(1.0)
    top_k: int | None = Field(None, ge=0, le=COUNT_MAX, description="lmforge: sample only from the k best tokens")
    n: int | None = Field(1, ge=1, le=COUNT_MAX, description="completions per prompt")
    stop: str | list[str] | None = Field(None, description="up to 4 strings that end the text (not returned)")
    seed: int | None = Seed()
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = Field(False, description="put the prompt before the completion")
    logprobs: int | None = Field(None, ge=0, le=COUNT_MAX)
    best_of: int | None = Field(None, ge=0, le=COUNT_MAX)
    suffix: str | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class EmbeddingRequest(BaseModel):
    model: str = Field(description="name of a loaded model (any family)")
    input: Any = Field(description="a string or a list of strings (token ids are not supported)")
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(None, ge=1, le=COUNT_MAX, description="must be the model's width if given")
    user: str | None = None
    normalize: bool = Field(True, description="lmforge: unit-length vectors (false: as `lmforge encode` writes)")
    pool: Literal["mean", "max", "cls", "mean+specials"] | None = Field(
        None, description="lmforge: how token vectors become one (default: the model's sentence pipeline, else mean)")
    layer: int | None = Field(None, ge=-LAYER_MAX, le=LAYER_MAX, description="lmforge: which layer (default top)")
    backend: Literal["torch", "onnx", "auto"] | None = Field(
        None, description="lmforge: what runs a sentence pipeline's model (onnx: ONNX Runtime; auto: the faster); "
        "default: the server's --backend where a sentence pipeline reads the texts, else torch")
    quantize: Literal["none", "int8"] | None = Field(
        None, description="lmforge: int8 = ONNX Runtime's dynamic int8; default: as for backend")


def texts_of(server: Server, value: Any, field: str) -> list[str]:
    """``value`` as a list of texts: a string or a list of strings; token ids get their own refusal."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return server.texts(value, field)
    if isinstance(value, list) and value and all(_is_ids(v) for v in value):
        raise HTTPError(
            400, f"{field} as token ids is not supported by lmforge serve; send text (a string or a list of strings)",
            field,
        )
    raise HTTPError(400, f"{field} must be a string or a list of strings", field)


def _is_ids(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    )


def _refuse_unsupported(req: CompletionRequest) -> None:
    refused = {
        "logprobs": req.logprobs is not None,
        "suffix": bool(req.suffix),
        "best_of": req.best_of not in (None, 1, req.n),
        "presence_penalty": req.presence_penalty not in (None, 0.0),
        "frequency_penalty": req.frequency_penalty not in (None, 0.0),
        "logit_bias": bool(req.logit_bias),
    }
    for field, bad in refused.items():
        if bad:
            raise HTTPError(400, f"{field} is not supported by lmforge serve; leave it out", field)


def _completion_jobs(server: Server, e: Entry, req: CompletionRequest) -> tuple[list[tuple], int, int]:
    """Check a completion request; ([(choice index, prompt, generate options)], prompt tokens, max_tokens)."""
    prompts = texts_of(server, req.prompt, "prompt")
    _refuse_unsupported(req)
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    cap = server.limits.max_new_tokens
    if max_tokens > cap:
        raise HTTPError(400, f"max_tokens {max_tokens} is over this server's cap of {cap} (--max-new-tokens)",
                        "max_tokens")
    n = req.n or 1
    if n * len(prompts) > server.limits.max_texts:
        raise HTTPError(400, f"{len(prompts)} prompt(s) x n={n} is over this server's {server.limits.max_texts} "
                        f"completions per request (--max-texts)", "n")
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOPS:
        raise HTTPError(400, f"stop takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    for s in stops:
        server.text(s, "stop", allow_empty=True)
    if req.seed is not None and req.seed + n - 1 > SEED_MAX:
        raise HTTPError(400, f"seed + n - 1 must be <= {SEED_MAX} (choice j uses seed + j)", "seed")
    n_positions = e.obj.config.n_positions
    prompt_tokens = 0
    for i, p in enumerate(prompts):
        k = len(e.obj.tokenizer.encode(p))
        if not 0 < k <= n_positions:
            what = "has no tokens" if k == 0 else f"has {k} tokens; the model reads at most {n_positions}"
            raise HTTPError(400, f"prompt {i} {what}", "prompt")
        prompt_tokens += k
    temperature = DEFAULT_TEMPERATURE if req.temperature is None else req.temperature
    base = dict(max_new_tokens=max_tokens, temperature=temperature, top_k=req.top_k,
                top_p=None if req.top_p in (None, 1.0) else req.top_p, stop=stops or None)
    jobs = [
        (i * n + j, p, {**base, "seed": None if req.seed is None else req.seed + j})
        for i, p in enumerate(prompts)
        for j in range(n)
    ]
    return jobs, prompt_tokens, max_tokens


def _finish(g: Generated) -> str:
    return "stop" if g.stopped else "length"


def _usage(prompt_tokens: int, done: list[Generated]) -> dict:
    completion = sum(g.tokens for g in done)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def completions(server: Server, req: CompletionRequest, request: Request):
    e = await server.entry(req.model, "generate")
    jobs, prompt_tokens, _ = _completion_jobs(server, e, req)
    echo = bool(req.echo)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": req.model}
    if not req.stream:
        done = await server.generations.run(
            request, lambda slot: [e.compute(generate_one, e.obj, p, o, slot) for _, p, o in jobs]
        )
        choices = [
            {"text": (p if echo else "") + g.text, "index": k, "logprobs": None, "finish_reason": _finish(g)}
            for (k, p, _), g in zip(jobs, done)
        ]
        return {**head, "choices": choices, "usage": _usage(prompt_tokens, done)}

    def work(slot, emit) -> list[Generated]:
        done = []
        for k, p, options in jobs:
            if echo:
                emit((k, p, None))
            g = e.compute(generate_one, e.obj, p, options, slot, lambda piece, k=k: emit((k, piece, None)))
            emit((k, "", _finish(g)))
            done.append(g)
        return done

    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def events(messages):
        async for kind, value in messages:
            if kind == "piece":
                k, text, finish = value
                yield _sse({**head, "choices": [{"text": text, "index": k, "logprobs": None, "finish_reason": finish}]})
            elif kind == "done":
                if include_usage:
                    yield _sse({**head, "choices": [], "usage": _usage(prompt_tokens, value)})
                yield _sse("[DONE]")
            else:  # the stream has started: the error travels as an event, which the openai client raises
                yield _sse({"error": {"message": value, "type": "server_error", "param": None, "code": kind}})

    return server.generations.stream(work, events)


def _encoded(vector: np.ndarray, encoding_format: str | None) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def encode_items(e: Entry, items: list[tuple[str, tuple]]) -> list[tuple[np.ndarray, int]]:
    """``(vector, token count)`` of each ``(text, options)`` item of concurrent ``/v1/embeddings`` requests (the
    micro-batcher's function: it runs in a worker thread).  The texts that share options are encoded in one
    :func:`~lmforge.models.vectors.encode` call, which sorts them by length into padded forward passes; a
    request that arrives alone is encoded exactly as ``lmforge encode`` encodes its texts."""
    groups: dict[tuple, list[int]] = {}
    for i, (_, options) in enumerate(items):
        groups.setdefault(options, []).append(i)
    out: list = [None] * len(items)
    for options, rows in groups.items():
        texts = [items[i][0] for i in rows]
        vectors = e.compute(encode, e.obj, texts, **dict(options))
        for i, text, v in zip(rows, texts, vectors):
            out[i] = (v, len(e.obj.tokenizer.encode(text)))
    return out


def _encode_options(server: Server, e: Entry, req: EmbeddingRequest) -> tuple:
    """The options ``encode`` runs a request with, hashable (requests with the same options share a batch).  A
    backend or quantization the request leaves out is the server's where a sentence pipeline reads the texts
    (the ONNX graph covers that pipeline only), else torch in fp32."""
    pipeline = sentence_pipeline(e.obj, req.layer, req.pool) is not None
    backend = req.backend or (server.backend if pipeline else "torch")
    quantize = req.quantize or (server.quantize if pipeline and req.backend in (None, server.backend) else "none")
    options = dict(layer=req.layer, pool=req.pool, normalize=req.normalize, backend=backend, quantize=quantize)
    return tuple(sorted(options.items()))


async def embeddings(server: Server, req: EmbeddingRequest) -> Response:
    e = await server.entry(req.model, "embed")
    texts = texts_of(server, req.input, "input")
    width = e.obj.hidden_size
    if req.dimensions is not None and req.dimensions != width:
        raise HTTPError(400, f"'{req.model}' gives {width}-dimensional vectors; leave dimensions out or give {width}",
                        "dimensions")
    options = _encode_options(server, e, req)
    done = await server.batchers[(req.model, "encode")].submit([(t, options) for t in texts])
    n_tokens = sum(n for _, n in done)
    # written here rather than by FastAPI's encoder, which walks every float of every vector on the event loop
    return JSONResponse({
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encoded(v, req.encoding_format)}
            for i, (v, _) in enumerate(done)
        ],
        "model": req.model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    })


def model_card(e: Entry) -> dict:
    """One model as OpenAI lists it, with lmforge's details as extra keys."""
    card = {"id": e.name, "object": "model", "created": int(e.loaded_at), "owned_by": "lmforge", **e.describe()}
    if e.kind == "run":  # what /v1/predict runs on (serve --backend, torch where the run has no ONNX graph)
        card.update(backend=e.obj.backend, quantize=e.obj.quantize)
    return card


def add_routes(app: FastAPI, server: Server) -> None:
    @app.get("/v1/models")
    async def list_models() -> dict:
        """The loaded folders in OpenAI's list shape; each has lmforge's name, path, kind, family, parameters,
        supports (and a run's task, mode, labels); `limits` are the server's request limits."""
        cards = [model_card(await server.fresh(name)) for name in list(server.entries)]
        return {"object": "list", "data": cards, "limits": dataclasses.asdict(server.limits)}

    @app.get("/v1/models/{name}")
    async def get_model(name: str) -> dict:
        """One loaded folder, as /v1/models lists it."""
        return model_card(await server.fresh(name))

    @app.post("/v1/completions")
    async def create_completion(req: CompletionRequest, request: Request):
        """OpenAI's completions (GPT models): text, finish_reason and usage per choice; `stream: true` answers
        with server-sent `text_completion` chunks ending in `data: [DONE]`."""
        return await completions(server, req, request)

    @app.post("/v1/embeddings")
    async def create_embeddings(req: EmbeddingRequest) -> Response:
        """OpenAI's embeddings (any family): one vector per input text, as floats or base64 float32."""
        return await embeddings(server, req)
