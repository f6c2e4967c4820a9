"""QA over contexts longer than --max-len: the sliding window (doc stride) of the BERT SQuAD recipe."""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_transfer_core import (
    FILL,
    make_body,
    qa_examples,
    toy_tokenizer,
    write_squad,
)

import lmforge.transfer as modes
from lmforge.data.tasks import load_task
from lmforge.errors import DataError
from lmforge.transfer.config import TransferConfig
from lmforge.transfer.encoding import InputFormat


@pytest.fixture(scope="module")
def toy_tok():
    return toy_tokenizer()


def long_qa(n: int, seed: int) -> list[dict]:
    """'who wrote it' over a long context whose answer (the name after 'by') sits 20-40 words in."""
    return qa_examples(n, seed, pre=(20, 40), post=(2, 10))


def test_windows_cover_the_context_with_the_stride(toy_tok):
    ctx = " ".join(random.Random(0).choice(FILL) for _ in range(50))
    n_ctx = len(toy_tok.encode(ctx))
    for stride in (None, 5, 1000):
        fmt = InputFormat("bert", toy_tok, 16, doc_stride=stride)
        wins = fmt.encode_qa("who wrote it", ctx)
        width = 16 - 3 - len(toy_tok.encode("who wrote it"))  # room after [CLS] q [SEP] ... [SEP]
        step = {None: width // 2, 5: 5, 1000: width}[stride]
        assert all(len(w.input_ids) <= 16 for w in wins)
        covered = [sorted(off for off in w.offsets if off is not None) for w in wins]
        assert all(len(c) == width for c in covered[:-1])
        firsts = [c[0][0] for c in covered]
        assert firsts == sorted(firsts) and covered[-1][-1][1] == len(ctx)  # the last window reaches the end
        # window k holds context tokens k*step ... k*step + width - 1
        full = [tuple(o) for o in toy_tok.encode_with_offsets(ctx)[2]]
        for k, c in enumerate(covered):
            assert c == full[k * step : k * step + width]
        assert len(wins) == 1 + -(-(n_ctx - width) // step)
    one = InputFormat("bert", toy_tok, 16, doc_stride=0).encode_qa("who wrote it", ctx)
    assert len(one) == 1  # 0: no window, the context is cut


def test_answer_target_only_in_windows_that_hold_it(toy_tok):
    ex = long_qa(1, 3)[0]
    fmt = InputFormat("bert", toy_tok, 16, doc_stride=3)
    wins = fmt.encode_qa(ex["question"], ex["context"])
    spans = [fmt.qa_target(w, ex["start"], ex["answer"]) for w in wins]
    holding = [k for k, s in enumerate(spans) if s is not None]
    assert holding  # stride 3 < window width: some window holds the whole answer
    for k, w in enumerate(wins):
        chars = [off for off in w.offsets if off is not None]
        inside = chars[0][0] <= ex["start"] and chars[-1][1] >= ex["start"] + len(ex["answer"])
        assert (spans[k] is not None) == inside
        if spans[k] is not None:
            s, e = spans[k]
            assert ex["context"][w.offsets[s][0] : w.offsets[e][1]] == ex["answer"]
    # white space around the answer text does not move the span
    assert fmt.qa_target(wins[holding[0]], ex["start"] - 1, " " + ex["answer"] + " ") == spans[holding[0]]


@pytest.mark.parametrize("family", ["bert", "elmo"])
def test_qa_finds_answers_past_max_len_only_with_windows(toy_tok, tmp_path, caplog, family):
    tr = write_squad(long_qa(96, 1), tmp_path / "train.json")
    te = write_squad(long_qa(48, 2), tmp_path / "test.json")
    kw = dict(mode="finetune", epochs=10, lr=5e-3) if family == "bert" else dict(mode="frozen", epochs=30, lr=1e-2)
    kw.update(max_len=24, seed=0, val_fraction=0.0)
    # every answer sits 20+ words into its context, past the context tokens one input of 24 holds
    with pytest.raises(DataError, match="none of the 96 training answers lies inside"):
        modes.run_transfer(make_body(toy_tok, family), "qa", tr, te, doc_stride=0, **kw)
    with caplog.at_level("INFO", logger="lmforge.transfer"):
        win = modes.run_transfer(make_body(toy_tok, family), "qa", tr, te, out_dir=tmp_path / "run", **kw)
    assert win["exact_match"] >= 0.8 and win["f1"] >= win["exact_match"], win
    assert "96 questions read as" in caplog.text
    preds = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 48  # one answer per question, not per window


def test_features_cache_and_subsets_keep_windows_together(toy_tok, tmp_path):
    tr = write_squad(long_qa(40, 4), tmp_path / "train.json")
    te = write_squad(long_qa(20, 5), tmp_path / "test.json")
    kw = dict(mode="features", epochs=30, max_len=24, seed=0, cache_dir=str(tmp_path / "cache"))
    body = make_body(toy_tok)
    first = modes.run_transfer(body, "qa", tr, te, **kw)
    calls = body.calls
    again = modes.run_transfer(body, "qa", tr, te, **kw)
    assert body.calls == calls + 1  # only the one probe pass that counts the layers
    assert again == {**first, "train_seconds": again["train_seconds"]}
    # a subset of the store holds every window of the chosen examples, renumbered in order
    data = load_task(tr, "qa")
    run = modes.TransferRun(body, TransferConfig(task="qa", mode="features", max_len=24), [])
    run.build()
    encs = run.encode(data)
    store = run.features(data, encs)
    assert len(store.lengths) == len(encs) > len(data)
    idx = [7, 2]
    sub = store.subset(idx)
    sub_encs = run.encode(data.subset(idx))
    assert sub.owners.tolist() == [e.example for e in sub_encs]
    assert torch.equal(sub.lengths, torch.tensor([len(e.rows) for e in sub_encs]))
    blocks, mask = sub.batch(list(range(len(sub_encs))))
    ref, _ = store.batch([w for i in idx for w, e in enumerate(encs) if e.example == i])
    assert torch.equal(blocks, ref)


def test_negative_doc_stride_is_a_clear_error(toy_tok, tmp_path):
    tr = write_squad(long_qa(4, 1), tmp_path / "train.json")
    with pytest.raises(Exception, match="doc_stride must be >= 0"):
        modes.run_transfer(make_body(toy_tok), "qa", tr, tr, doc_stride=-1)
