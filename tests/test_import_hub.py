"""import-hf with a model id: looked up in the local HF hub cache (HF_HOME), never downloaded."""

from __future__ import annotations

import shutil

import pytest
import torch

from lmforge.cli import main
from lmforge.families import FAMILIES, load
from lmforge.interop import export_hf
from lmforge.interop.hub_cache import cached_snapshot, hub_cache_dir
from lmforge.storage.files import load_safetensors

REPO = "tiny-org/tiny-bert"


def _tiny_bert(folder, tokenizer, seed):
    family = FAMILIES["bert"]
    torch.manual_seed(seed)
    config = family.config_class(**{**family.presets["tiny"], "hidden_size": 32, "num_hidden_layers": 1,
                                    "num_attention_heads": 2, "intermediate_size": 64,
                                    "vocab_size": tokenizer.vocab_size})
    family.model_class(config).save_pretrained(folder, tokenizer)
    return folder


def _put_in_cache(hub, repo, revision, hf_folder):
    """Lay an HF folder out as huggingface_hub does: blobs, and a snapshot of links to them."""
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo_dir / "blobs").mkdir(exist_ok=True)
    for f in sorted(p for p in hf_folder.rglob("*") if p.is_file()):  # an export has subfolders (1_Pooling)
        name = f.relative_to(hf_folder)
        blob = repo_dir / "blobs" / f"{revision}-{'-'.join(name.parts)}"
        shutil.copyfile(f, blob)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(blob)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch, wordpiece_tokenizer):
    """HF_HOME with two revisions of a tiny exported BERT; refs/main names the second (not the newest)."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    cache = tmp_path / "hf_home" / "hub"
    main_rev = _put_in_cache(cache, REPO, "a" * 40, export_hf(_tiny_bert(tmp_path / "m1", wordpiece_tokenizer, 1),
                                                              tmp_path / "hf1"))
    _put_in_cache(cache, REPO, "b" * 40, export_hf(_tiny_bert(tmp_path / "m2", wordpiece_tokenizer, 2),
                                                   tmp_path / "hf2"))
    (cache / f"models--{REPO.replace('/', '--')}" / "refs").mkdir()
    (cache / f"models--{REPO.replace('/', '--')}" / "refs" / "main").write_text("a" * 40)
    return main_rev, tmp_path


def test_cache_folder_follows_hf_home(hub):
    main_rev, tmp_path = hub
    assert hub_cache_dir() == tmp_path / "hf_home" / "hub"
    assert cached_snapshot(REPO) == main_rev
    assert cached_snapshot("tiny-org/other") is None


def test_import_hf_reads_a_model_id_from_the_cache(hub, capsys):
    main_rev, tmp_path = hub
    out = tmp_path / "imported"
    assert main(["import-hf", REPO, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"reading {REPO} from the HF cache: {main_rev}" in printed and "imported bert" in printed
    # the weights are those of the revision refs/main names
    expected = load(tmp_path / "m1").state_dict()
    got = load_safetensors(out / "model.safetensors")
    assert got.keys() and all(torch.equal(got[k], expected[k]) for k in got)


def test_a_name_not_in_the_cache_says_that_only_folders_are_read(hub, capsys):
    _, tmp_path = hub
    assert main(["import-hf", "bert-base-uncased", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "reads local folders only" in err and str(tmp_path / "hf_home" / "hub") in err
    assert not (tmp_path / "out").exists()
