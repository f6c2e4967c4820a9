"""Vectors out: embed's one rule for long texts (overlapping windows), model.encode, and `lmforge encode`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.families import FAMILIES, load
from lmforge.models.vectors import encode
from lmforge.models.windows import plan_windows
from lmforge.storage.vector_files import load_vectors
from lmforge.train.precision import native_bf16

WINDOW = 16  # text tokens per window of the small BERT and GPT below

SMALL = {
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=WINDOW + 2),
    "gpt": dict(n_positions=WINDOW, n_embd=32, n_layer=2, n_head=2),
    "elmo": {},
    "word2vec": dict(vector_size=16),
}
TEXTS = ["the python is a large snake .", "python is a programming language", "and god said"]


def small_model(name, request):
    family = FAMILIES[name]
    tok = request.getfixturevalue("bpe_tokenizer" if family.tokenizer_kind == "bpe" else "wordpiece_tokenizer")
    presets = family.presets
    base = dict(presets.get("tiny", presets[family.default_preset]))
    torch.manual_seed(0)
    config = family.config_class(**{**base, **SMALL.get(name, {}), "vocab_size": tok.vocab_size})
    model = family.model_class(config).eval()
    if name == "word2vec":  # zero-initialised; give it vectors to compare
        torch.nn.init.normal_(model.embeddings.weight)
    if hasattr(model, "set_tokenizer"):
        model.set_tokenizer(tok)
    else:
        model.tokenizer = tok
    return model


def one_token_words(tok, n):
    """``n`` words that the tokenizer keeps whole, so that a text of them has exactly one token per word."""
    words = []
    for w in ["the", "python", "is", "a", "large", "snake", "and", "god", "said", "of", "to", "in"]:
        ids, _, _ = tok.encode_with_offsets(w)
        ids2, _, _ = tok.encode_with_offsets("x " + w)
        if len(ids) == 1 and len(ids2) == 2:
            words.append(w)
    assert len(words) >= 5
    return [words[(i * 7) % len(words)] for i in range(n)]


# -- embed: one rule for texts longer than the model's positions -------------------------------------
def test_plan_windows_covers_every_token_once():
    for n in range(0, 70):
        for size in (1, 2, 5, 16):
            for causal in (False, True):
                windows = plan_windows(n, size, causal)
                assert windows[0].start == 0
                pos = 0
                for w in windows:
                    assert w.own_start == pos and w.start <= w.own_start <= w.own_end <= w.end <= n
                    assert w.end - w.start <= size
                    pos = w.own_end
                assert pos == n


@pytest.mark.parametrize("name", ["bert", "gpt", "elmo"])
def test_long_text_is_read_in_windows_without_losing_a_token(name, request):
    model = small_model(name, request)
    tok = model.tokenizer
    words = one_token_words(tok, 3 * WINDOW)
    text = " ".join(words)
    ids, _, _ = tok.encode_with_offsets(text)
    assert len(ids) == 3 * WINDOW

    (res,) = model.embed([text])
    # no token lost, offsets point at the words
    assert len(res.tokens) == len(res.offsets) == res.layers.shape[1] == 3 * WINDOW
    assert [text[s:e] for s, e in res.offsets] == words
    assert torch.isfinite(res.layers).all() and (res.layers[-1].abs().sum(dim=1) > 0).all()

    before, after = model.embed_specials()
    if name == "elmo":  # the LSTMs read any length: one run over the whole text
        lo, hi, start = 0, 3 * WINDOW, 0
        run_ids = ids
    elif name == "bert":  # the middle window [16, 32) is centred on the text; it owns its middle half
        lo, hi, start = WINDOW + WINDOW // 4, 2 * WINDOW - WINDOW // 4, WINDOW
        run_ids = ids[WINDOW : 2 * WINDOW]
    else:  # causal: a token takes the window where it has the most tokens before it: its last half
        lo, hi, start = WINDOW + WINDOW // 2, 2 * WINDOW, WINDOW
        run_ids = ids[WINDOW : 2 * WINDOW]
    with torch.no_grad():
        direct = model.hidden_states(torch.tensor([before + run_ids + after]))
    direct = torch.stack([h[0] for h in direct])  # (L, T, C)
    k = len(before)
    torch.testing.assert_close(res.layers[:, lo:hi], direct[:, k + lo - start : k + hi - start], atol=1e-5, rtol=1e-5)
    if name != "elmo":  # and the window's context matters: the tokens differ from a run that starts at them
        with torch.no_grad():
            cut = torch.stack([h[0] for h in model.hidden_states(torch.tensor([before + ids[lo:hi] + after]))])
        assert not torch.allclose(res.layers[-1, lo:hi], cut[-1, k : k + hi - lo], atol=1e-4)


def test_short_texts_are_unchanged_by_batching(request):
    model = small_model("bert", request)
    together = model.embed(TEXTS)
    alone = [model.embed([t])[0] for t in TEXTS]
    for a, b in zip(together, alone):
        assert a.tokens == b.tokens
        torch.testing.assert_close(a.layers, b.layers, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.cls, b.cls, atol=1e-5, rtol=1e-5)


def test_embed_batches_windows_of_similar_length_and_keeps_the_text_order(request, monkeypatch):
    model = small_model("bert", request)
    words = one_token_words(model.tokenizer, 40)
    texts = [" ".join(words[:n]) for n in (3, 40, 5, 14, 2, 9)]  # the 40-word text is read in windows
    alone = [model.embed([t])[0] for t in texts]
    widths = []
    real = model.hidden_states
    monkeypatch.setattr(model, "hidden_states", lambda ids, mask: widths.append(ids.shape[1]) or real(ids, mask))
    together = model.embed(texts, batch_size=2)
    assert widths == sorted(widths) and len(widths) >= 4  # shortest windows first: each batch pads little
    for a, b in zip(together, alone):
        assert a.tokens == b.tokens
        torch.testing.assert_close(a.layers, b.layers, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.cls, b.cls, atol=1e-5, rtol=1e-5)


def test_encode_batches_texts_by_length_and_returns_rows_in_input_order(request):
    model = small_model("gpt", request)
    texts = ["a b c d e f g h", "a", "a b c d", "a b", "a b c d e f", "a b c"]
    seen = []

    class Recording:  # a stand-in body: encode needs only embed
        hidden_size = model.hidden_size

        def embed(self, chunk):
            seen.append(chunk)
            return model.embed(chunk)

    vecs = encode(Recording(), texts, batch_size=2)
    assert [len(t) for chunk in seen for t in chunk] == sorted(len(t) for t in texts)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(vecs[i], model.encode([text])[0], atol=1e-5)


# -- model.encode -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FAMILIES))
def test_encode_pools_embed(name, request):
    model = small_model(name, request)
    vecs = model.encode(TEXTS)
    assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), model.hidden_size)
    embedded = model.embed(TEXTS)
    for i, tl in enumerate(embedded):
        np.testing.assert_allclose(vecs[i], tl.layers[-1].mean(dim=0).numpy(), atol=1e-6)
    first = model.encode(TEXTS, layer=0, pool="max", batch_size=1)
    np.testing.assert_allclose(first[1], embedded[1].layers[0].max(dim=0).values.numpy(), atol=1e-6)
    unit = model.encode(TEXTS, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(unit, vecs / np.linalg.norm(vecs, axis=1, keepdims=True), atol=1e-6)
    if name in ("bert", "electra"):  # the encoders that read a text as [CLS] text [SEP]
        cls = model.encode(TEXTS, pool="cls")
        np.testing.assert_allclose(cls[0], embedded[0].cls[-1].numpy(), atol=1e-6)
    else:
        with pytest.raises(LmforgeError, match="needs a \\[CLS\\] token"):
            model.encode(TEXTS, pool="cls")


def test_encode_refuses_bad_input(request):
    model = small_model("gpt", request)
    with pytest.raises(LmforgeError, match="text 1 is empty"):
        model.encode(["a snake", "  "])
    with pytest.raises(LmforgeError, match="layer 7 does not exist"):
        model.encode(["a snake"], layer=7)
    with pytest.raises(LmforgeError, match="unknown pool"):
        model.encode(["a snake"], pool="sum")
    with pytest.raises(LmforgeError, match="list of strings"):
        encode(model, "a snake")
    assert model.encode([]).shape == (0, model.hidden_size)
    np.testing.assert_array_equal(model.encode(["a snake"], layer=-1), model.encode(["a snake"]))


# -- lmforge encode -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, wordpiece_tokenizer):
    family = FAMILIES["bert"]
    torch.manual_seed(0)
    vocab = wordpiece_tokenizer.vocab_size
    config = family.config_class(**{**family.presets["tiny"], **SMALL["bert"], "vocab_size": vocab})
    out = tmp_path_factory.mktemp("bert")
    family.model_class(config).save_pretrained(out, wordpiece_tokenizer)
    return out


def test_cli_output_equals_the_api(bert_dir, tmp_path, capsys):
    texts = TEXTS + ["a text long enough to need two windows: " + "the snake is in the garden " * 6]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["encode", str(bert_dir), "--file", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "v.npy"),
                 "--batch-size", "3", "--normalize"]) == 0
    captured = capsys.readouterr()
    assert "wrote 4 vectors of 32 floats" in captured.out and "layer 2 of 0..2" in captured.out
    assert "encode: 4/4 texts" in captured.err  # plain progress lines when stderr is not a terminal
    expected = load(bert_dir).encode(texts, batch_size=3, normalize=True)
    got = np.load(tmp_path / "v.npy", allow_pickle=False)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)

    rows = [json.dumps({"id": i, "body": t}) for i, t in enumerate(texts)]
    (tmp_path / "texts.jsonl").write_text("\n".join(rows), encoding="utf-8")
    assert main(["encode", str(bert_dir), "--file", str(tmp_path / "texts.jsonl"), "--text-field", "body",
                 "--out", str(tmp_path / "v.parquet"), "--layer", "1", "--pool", "cls"]) == 0
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "v.parquet")
    assert table.column_names == ["text", "vector"] and table.column("text").to_pylist() == texts
    vector_type = table.schema.field("vector").type
    assert pa.types.is_list(vector_type) and vector_type.value_type == pa.float32()
    np.testing.assert_array_equal(load_vectors(tmp_path / "v.parquet"),
                                  load(bert_dir).encode(texts, layer=1, pool="cls"))


@pytest.mark.parametrize("content, argv, message", [
    ("a snake\n\nthe python\n", [], "line 2 is blank"),
    ('{"body": "a snake"}\n{"body": "a python"}\n', [], "line 1 has no field 'text' (found: body)"),
    ('{"body": "a snake"}\n', ["--text-field", "text"], "has no field 'text' (fields: body)"),
    ("a snake\n", ["--pool", "cls", "--layer", "5"], "layer 5 does not exist"),
])
def test_cli_bad_input_is_one_line(bert_dir, tmp_path, capsys, content, argv, message):
    (tmp_path / "in.txt").write_text(content, encoding="utf-8")
    assert main(["encode", str(bert_dir), "--file", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.npy"),
                 *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "v.npy").exists()


def _write_records(folder, fmt: str, texts: list[str]):
    """``texts`` as a ``fmt`` input beside an id column, named as a user would name the file."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / {"csv": "in.csv", "tsv-headerless": "in.tsv", "json": "in.json", "parquet": "in.parquet",
                     "dataset": "ds"}[fmt]
    if fmt == "csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["id", "review"])
            w.writerows(enumerate(texts))
    elif fmt == "tsv-headerless":
        path.write_text("".join(f"{i}\t{t}\n" for i, t in enumerate(texts)), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps({"data": [{"id": i, "review": t} for i, t in enumerate(texts)]}), encoding="utf-8")
    elif fmt == "parquet":
        pq.write_table(pa.table({"id": list(range(len(texts))), "review": texts}), path)
    else:
        import datasets

        datasets.Dataset.from_dict({"id": list(range(len(texts))), "review": texts}).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("fmt, column", [("csv", "review"), ("tsv-headerless", "1"), ("json", "review"),
                                         ("parquet", "review"), ("dataset", "review")])
def test_cli_reads_texts_from_every_record_format(bert_dir, tmp_path, capsys, fmt, column):
    """A CSV (a comma inside a quoted text), headerless TSV, JSON, Parquet or `datasets` input gives the vectors of
    the same texts in a plain-text file, row for row."""
    texts = TEXTS + ["a snake, a language, and a day"]
    path = _write_records(tmp_path, fmt, texts)
    flag = "--text-column" if fmt in ("csv", "tsv-headerless") else "--text-field"
    assert main(["encode", str(bert_dir), "--file", str(path), flag, column, "--out", str(tmp_path / "v.parquet")]) == 0
    capsys.readouterr()
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "v.parquet").column("text").to_pylist() == texts
    np.testing.assert_array_equal(load_vectors(tmp_path / "v.parquet"), load(bert_dir).encode(texts))


@pytest.mark.parametrize("fmt, argv, message", [
    ("csv", [], "has no column 'text' (columns: id, review); choose one with --text-column NAME"),
    ("tsv-headerless", ["--text-column", "4"], "has 2 columns, no column 4 (0-based)"),
    ("parquet", ["--text-field", "id"], "field 'id' is a int, not a string"),
    ("json", ["--text-field", "review"], ": field 'review' is blank"),
])
def test_cli_bad_records_are_one_line(bert_dir, tmp_path, capsys, fmt, argv, message):
    path = _write_records(tmp_path, fmt, ["a snake", " ", "the python"])
    assert main(["encode", str(bert_dir), "--file", str(path), "--out", str(tmp_path / "v.npy"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "v.npy").exists()


def test_json_lines_in_a_txt_file_are_read_as_records_unless_told(bert_dir, tmp_path, capsys):
    """A file that starts with a JSON object is JSON Lines whatever its suffix (as the corpus readers decide);
    --format lines encodes its lines as they are."""
    lines = ['{"text": "a snake"}', '{"text": "the python"}']
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for argv, texts in (([], ["a snake", "the python"]), (["--format", "lines"], lines)):
        assert main(["encode", str(bert_dir), "--file", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.npy"),
                     "--overwrite", *argv]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), load(bert_dir).encode(texts))
    capsys.readouterr()


def test_cli_never_overwrites_its_input(bert_dir, tmp_path, capsys):
    src = tmp_path / "texts.npy"  # a text file that happens to end in .npy
    src.write_text("a snake\n", encoding="utf-8")
    assert main(["encode", str(bert_dir), "--file", str(src), "--out", str(src)]) == 2
    assert "is the file this command reads" in capsys.readouterr().err
    assert src.read_text(encoding="utf-8") == "a snake\n"
    assert main(["encode", str(bert_dir), "--file", str(src), "--out", str(tmp_path / "v.csv")]) == 2
    assert "must end in .npy or .parquet" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(FAMILIES))
def test_cli_bf16_vectors_follow_fp32_for_every_family(name, request, tmp_path, capsys):
    model = small_model(name, request)
    folder = tmp_path / name
    model.save_pretrained(folder, model.tokenizer)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    out = {}
    for precision in ("fp32", "bf16"):
        capsys.readouterr()
        assert main(["encode", str(folder), "--file", str(texts), "--out", str(tmp_path / f"{precision}.npy"),
                     "--precision", precision, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["precision"] == precision
        out[precision] = np.load(tmp_path / f"{precision}.npy")
    np.testing.assert_array_equal(out["fp32"], model.encode(TEXTS))  # fp32: exactly what the API gives
    cos = (out["fp32"] * out["bf16"]).sum(1) / np.linalg.norm(out["fp32"], axis=1) / np.linalg.norm(out["bf16"], axis=1)
    assert out["bf16"].dtype == np.float32 and cos.min() > 0.99, cos
    if name in ("bert", "gpt", "electra"):  # bf16 matmuls: the vectors move, a little
        assert not np.array_equal(out["fp32"], out["bf16"])


def test_cli_precision_auto_and_fp16_on_a_cpu(bert_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    capsys.readouterr()
    assert main(["encode", str(bert_dir), "--file", str(texts), "--out", str(tmp_path / "a.npy"), "--precision",
                 "auto", "--device", "cpu", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["precision"] == "fp32"  # width 32: below where bf16 gains on a CPU
    if native_bf16(torch.device("cpu")):
        assert "precision fp32 (auto: the model's width 32 is below 64" in cap.err
    else:
        assert "precision fp32 (auto: this CPU has no native bf16" in cap.err
    assert main(["encode", str(bert_dir), "--file", str(texts), "--out", str(tmp_path / "b.npy"), "--precision",
                 "fp16", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--precision fp16 needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.npy").exists()
