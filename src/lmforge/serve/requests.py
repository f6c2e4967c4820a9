"""What a request to ``lmforge serve``'s own routes may say: the JSON bodies, their ranges, and the server's limits.

Every number a client sends is range-checked here, before it reaches torch or numpy: an integer beyond
its bound (``"seed": 2**80``) or a float that is not finite (``NaN``, ``Infinity``, which Python's JSON
reader accepts) is a 422 naming the field, never a crash in the model.  The OpenAI-compatible bodies live
in :mod:`lmforge.serve.openai`.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, Field

from ..errors import LmforgeError
from ..utils import SEED_MAX  # the one seed range of every lmforge command and route

#: a bound for counts (tokens, top-k) far above any cap a server applies, so only the cap's message is seen
COUNT_MAX = 2**31 - 1
#: layer indices (negative counts from the top)
LAYER_MAX = 4096


@dataclasses.dataclass
class ServeLimits:
    """What one request may ask for, and how requests are batched (``lmforge serve`` flags).

    Attributes:
        max_body_bytes: largest request body (413 above).
        max_text_chars: longest text in any field (400 above).
        max_texts: most texts in one embed / projection / embeddings request, most choices of a completion.
        max_new_tokens: the cap on a generation's ``max_new_tokens`` (``max_tokens``).
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
            least = 0 if f.name == "batch_wait_ms" else 1
            if not v >= least:  # NaN fails too
                raise LmforgeError(f"--{f.name.replace('_', '-')} must be >= {least}, got {v}")


def Temperature(default: float, **kwargs):  # noqa: N802 - a Field factory, named like the type it checks
    return Field(default, ge=0.0, allow_inf_nan=False, description="0 = greedy; > 0 samples", **kwargs)


def TopP(default: float | None):  # noqa: N802
    return Field(default, gt=0.0, le=1.0, allow_inf_nan=False, description="sample only from this nucleus")


def Seed():  # noqa: N802
    return Field(None, ge=0, le=SEED_MAX, description=f"seed for sampling, 0..{SEED_MAX} (same seed, same text)")


class FillMaskRequest(BaseModel):
    model: str = Field(description="name of a loaded BERT model (see /v1/models)")
    text: str = Field(description='text with one or more [MASK], e.g. "the python is a large [MASK] ."')
    top_k: int = Field(5, ge=1, le=COUNT_MAX, description="candidates per [MASK]")


class GenerateRequest(BaseModel):
    model: str = Field(description="name of a loaded GPT model")
    prompt: str = Field(description="text to continue")
    max_new_tokens: int = Field(100, ge=0, le=COUNT_MAX, description="tokens to add at most (capped by the server)")
    temperature: float = Temperature(0.0)
    top_k: int | None = Field(None, ge=0, le=COUNT_MAX, description="sample only from the k most likely tokens")
    top_p: float | None = TopP(None)
    stop: list[str] | None = Field(None, description="stop when the text contains one of these (not returned)")
    seed: int | None = Seed()
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
    layer: int | None = Field(None, ge=-LAYER_MAX, le=LAYER_MAX, description="layer index (default: the top layer)")


class PredictRequest(BaseModel):
    model: str = Field(description="name of a loaded run (from `lmforge finetune`)")
    text: str = Field(description="classify/pair/tokens: the text; qa: the question; choice: the context")
    text_pair: str | None = Field(None, description="pair: the second text; qa: the context")
    choices: list[str] | None = Field(None, description="choice: two or more choices")
