"""Choose a benchmark's prompt template and label words on held-out training-side examples.

For every template, the masked LM scores each candidate word at the template's ``[MASK]`` for each
example (log-probabilities, no training). Every assignment of distinct candidate words to the labels is
scored by accuracy after removing each label word's mean score over the examples (the untrained head
otherwise prefers one frequent word whatever the text). The test partition is never read: the examples
are the first ``--n`` of the ``--dev-size`` held-out reviews / tweets that ``benchmark curve --score-on dev``
scores on.

    python scripts/prompt_search.py bert-zhmix33kpack-tapt zh-sentiment \\
        --templates "{text}总之很[MASK]。" "{text}感觉很[MASK]" "{text}[MASK]评！" --words 好 差 坏 --n 800
    python scripts/prompt_search.py bert-tw60 en-tweets --max-len 64 --n 600 \\
        --templates "{text} it was [MASK] ." "{text} i feel [MASK] ." "[MASK] : {text}" "{text} so [MASK] !" \\
        --words good great bad terrible awful love hate ok okay fine news interesting sad happy cool amazing \\
        worst best
"""

from __future__ import annotations

import argparse
import itertools

import torch

import lmforge
from lmforge.transfer.batching import collate
from lmforge.transfer.benchmarks import hold_out_dev, load_benchmark
from lmforge.transfer.encoding import InputFormat


def mask_scores(body, fmt: InputFormat, texts: list[str], word_ids: list[int], batch: int = 64) -> torch.Tensor:
    """(N, W) log-probabilities of each candidate word at the [MASK] of each text in the template."""
    out = []
    with torch.no_grad():
        for k in range(0, len(texts), batch):
            encs = [fmt.encode_text(t) for t in texts[k : k + batch]]
            b = collate(encs, fmt.pad_id)
            logits = body(b["input_ids"], b["attention_mask"], b["token_type_ids"]).logits  # (B, T, V)
            at = torch.tensor([e.rows[0] for e in encs])
            out.append(torch.log_softmax(logits[torch.arange(len(encs)), at].float(), -1)[:, word_ids])
    return torch.cat(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("bench", choices=["zh-sentiment", "en-tweets"])
    ap.add_argument("--templates", nargs="+", required=True)
    ap.add_argument("--words", nargs="+", required=True, help="candidate label words (one token each)")
    ap.add_argument("--n", type=int, default=800, help="held-out examples scored")
    ap.add_argument("--pool", type=int, default=10000)
    ap.add_argument("--dev-size", type=int, default=2000)
    ap.add_argument("--max-len", type=int, default=128)
    args = ap.parse_args()

    body = lmforge.load(args.model).eval()
    tok = body.tokenizer
    train, _ = load_benchmark(args.bench, args.pool, 1000, seed=0)
    _, dev = hold_out_dev(train, args.dev_size)
    examples = dev.examples[: args.n]
    gold = torch.tensor([dev.labels.index(ex.label) for ex in examples])
    words = [w for w in args.words if len(tok.encode_with_offsets(w)[0]) == 1]
    skipped = sorted(set(args.words) - set(words))
    if skipped:
        print(f"not one token with this tokenizer, skipped: {' '.join(skipped)}")
    word_ids = [tok.encode_with_offsets(w)[0][0] for w in words]
    print(f"{len(examples)} held-out {args.bench} examples, labels {dev.labels}")
    best = None
    for template in args.templates:
        fmt = InputFormat("bert", tok, args.max_len, pool="mask", prompt=template)
        scores = mask_scores(body, fmt, [ex.text for ex in examples], word_ids)
        top = None
        for pick in itertools.permutations(range(len(words)), len(dev.labels)):
            s = scores[:, list(pick)]
            acc = float(((s - s.mean(0)).argmax(1) == gold).float().mean())
            raw = float((s.argmax(1) == gold).float().mean())
            if top is None or acc > top[0]:
                top = (acc, raw, [words[i] for i in pick])
        print(f"{template!r}: {' / '.join(top[2])} ({' / '.join(dev.labels)}): accuracy {top[0]:.3f} with the "
              f"mean scores removed, {top[1]:.3f} by plain argmax")
        if best is None or top[0] > best[0]:
            best = (top[0], template, top[2])
    verbalizer = " ".join(f"{lab}={w}" for lab, w in zip(dev.labels, best[2]))
    print(f"best: --prompt {best[1]!r} --verbalizer {verbalizer}  ({best[0]:.3f})")


if __name__ == "__main__":
    main()
