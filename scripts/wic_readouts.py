"""Word-in-context with other read-outs of the same vectors: does the cosine's read-out hold a model back?

    python scripts/wic_readouts.py elmo-60 bert-60 --reference minilm [--max-pairs 0]

For every model and layer it scores the WiC pairs of ``lmforge evaluate wic`` (the same pairs, the same
dev / test split by target word, the threshold chosen on dev) with four read-outs of the target's vector:

* ``raw``: the cosine ``lmforge evaluate wic`` uses;
* ``centered``: the layer's mean vector over every token of every WiC sentence subtracted first (the
  common direction that makes all contextual vectors alike; Ethayarajh 2019, Mu & Viswanath 2018);
* ``standardised``: centred and divided per channel by the standard deviation over those tokens;
* ``concat``: the centred, unit-length vectors of every contextual layer (all but the first) side by side.

The statistics use no labels. Prints one line per (model, layer, read-out): dev and test accuracy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.round((a * b).sum(-1) / np.maximum(den, 1e-300), 6)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dirs", nargs="*")
    p.add_argument("--reference", choices=["minilm"], default=None)
    p.add_argument("--max-pairs", type=int, default=2000, help="0 = every pair")
    args = p.parse_args()

    from lmforge.errors import LmforgeError
    from lmforge.evaluate import layer_names, load_models, span_vectors
    from lmforge.evaluate.wic import best_threshold, build_pairs

    try:
        pairs = build_pairs(max_pairs=args.max_pairs or None)
        models = load_models(args.model_dirs, reference=args.reference)
    except LmforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    labels = np.array([q.same_sense for q in pairs])
    dev = np.array([q.split == "dev" for q in pairs])
    print(f"{len(pairs)} pairs: {dev.sum()} dev / {(~dev).sum()} test")
    sentences = sorted({q.sentence1 for q in pairs} | {q.sentence2 for q in pairs})
    index = {s: i for i, s in enumerate(sentences)}

    def score(label: str, name: str, a: np.ndarray, b: np.ndarray) -> None:
        sims = _cos(a, b)
        t, dev_acc = best_threshold(sims[dev], labels[dev])
        test_acc = float(np.mean((sims[~dev] >= t) == labels[~dev]))
        print(f"{label:40s} {name:24s} dev {100 * dev_acc:5.1f} %  test {100 * test_acc:5.1f} %", flush=True)

    for label, model in models:
        with torch.no_grad():
            emb = [tl for k in range(0, len(sentences), 64) for tl in model.embed(sentences[k : k + 64])]
        names = layer_names(emb[0])
        A = np.stack([span_vectors(emb[index[q.sentence1]], q.span1).double().numpy() for q in pairs])  # (n, L, C)
        B = np.stack([span_vectors(emb[index[q.sentence2]], q.span2).double().numpy() for q in pairs])
        tokens = torch.cat([tl.layers.double() for tl in emb], dim=1).numpy()  # (L, all tokens, C)
        mu, sd = tokens.mean(1), tokens.std(1) + 1e-6
        for li, name in enumerate(names):
            score(label, f"{name} raw", A[:, li], B[:, li])
            score(label, f"{name} centered", A[:, li] - mu[li], B[:, li] - mu[li])
            score(label, f"{name} standardised", (A[:, li] - mu[li]) / sd[li], (B[:, li] - mu[li]) / sd[li])

        def unit(v: np.ndarray) -> np.ndarray:
            return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-300)

        ctx = range(1, len(names))
        score(label, "concat centered", np.concatenate([unit(A[:, i] - mu[i]) for i in ctx], -1),
              np.concatenate([unit(B[:, i] - mu[i]) for i in ctx], -1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
