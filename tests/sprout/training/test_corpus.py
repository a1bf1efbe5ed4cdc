"""Training corpora: user text, token files and batches (sprout.training.corpus)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sprout.material import generate_corpus
from sprout.tokenizer import char_tokenizer, decode, encode, train_bpe
from sprout.training import corpus as data
from sprout.training.corpus import TokenDataset, build_token_files, get_batch, read_text


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(300_000, seed=0)


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_bpe(corpus, vocab_size=512)


# ----------------------------------------------------------------------------- user corpora

def test_read_text_file_and_folder(tmp_path):
    (tmp_path / "one.txt").write_text("\ufeffHello there.\nSecond line.", encoding="utf-8")
    assert read_text(tmp_path / "one.txt") == "Hello there.\nSecond line."
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "b.txt").write_text("Bee", encoding="utf-8")
    (folder / "a.txt").write_text("Ant", encoding="utf-8")
    (folder / "c.md").write_text("not read", encoding="utf-8")
    (folder / "d.txt").write_text("  \n", encoding="utf-8")
    assert read_text(str(folder)) == "Ant\n\nBee"


def test_read_text_saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["first doc", "", "second doc"], "id": [1, 2, 3]})
    ds.save_to_disk(str(tmp_path / "ds"))
    assert read_text(tmp_path / "ds") == "first doc\n\nsecond doc"
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dd"))
    assert read_text(tmp_path / "dd") == "first doc\n\nsecond doc"
    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "notext"))
    with pytest.raises(ValueError, match="no 'text' column"):
        read_text(tmp_path / "notext")


def test_read_text_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        read_text(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text(" \n\n ", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.txt"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "bad.txt").write_bytes("héllo ".encode() + b"\xff\xfe world")
    with pytest.raises(ValueError, match=r"bad\.txt.*offset 7"):
        read_text(tmp_path / "bad.txt")
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match="no .txt files"):
        read_text(tmp_path / "dir")
    (tmp_path / "dir" / "bad.txt").write_bytes(b"\x80")
    with pytest.raises(ValueError, match=r"bad\.txt.*offset 0"):
        read_text(tmp_path / "dir")


# ----------------------------------------------------------------------------- token files

def test_build_token_files_splits_on_a_story_boundary(corpus, bpe, tmp_path):
    train_path, val_path = build_token_files(corpus, bpe, tmp_path / "tok", chunk_chars=5_000)
    train, val = np.fromfile(train_path, dtype=np.uint16), np.fromfile(val_path, dtype=np.uint16)
    train_text, val_text = decode(bpe, train), decode(bpe, val)
    assert train_text + "\n\n" + val_text == corpus
    assert 0.07 < len(val_text) / len(corpus) < 0.13
    assert not val_text.startswith("\n") and not train_text.endswith("\n")
    # chunked encoding gives exactly the ids of one whole encoding
    assert train.tolist() == encode(bpe, train_text)
    assert val.tolist() == encode(bpe, val_text)


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab. ,\n\t\x1c\xa0\u3000'!é😀")) | st.text(), size=st.integers(1, 8))
def test_chunked_encoding_equals_whole_encoding(bpe, text, size):
    pieces = list(data._chunks(text, size))
    assert "".join(pieces) == text
    assert [i for p in pieces for i in encode(bpe, p)] == encode(bpe, text)


def test_build_token_files_char_level(tmp_path):
    text = "ab ba\n\ncab\n\nbbb a"
    tok = char_tokenizer(text)
    train_path, val_path = build_token_files(text, tok, tmp_path, val_fraction=0.3)
    stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}
    assert np.fromfile(train_path, dtype=np.uint16).tolist() == [stoi[c] for c in "ab ba\n\ncab"]
    assert np.fromfile(val_path, dtype=np.uint16).tolist() == [stoi[c] for c in "bbb a"]
    with pytest.raises(ValueError, match="'xz'"):
        build_token_files("abxz", tok, tmp_path)


def test_build_token_files_errors(tmp_path):
    huge = char_tokenizer("".join(chr(0x10000 + i) for i in range(70_000)))
    with pytest.raises(ValueError, match="uint16"):
        build_token_files("x", huge, tmp_path)
    with pytest.raises(ValueError, match="val_fraction"):
        build_token_files("ab", char_tokenizer("ab"), tmp_path, val_fraction=1.0)


def _token_file(path, tokens):
    np.asarray(tokens, dtype=np.uint16).tofile(path)
    return path


def test_get_batch_windows_and_targets(tmp_path):
    tokens = np.arange(1000) % 700
    ds = TokenDataset(_token_file(tmp_path / "t.bin", tokens), context=16)
    assert len(ds) == 1000
    x, y = ds.batch(32, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (32, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):  # each row is a real window of the file
        i = int(np.flatnonzero(tokens == int(row_x[0]))[0])
        assert row_x.tolist() == tokens[i:i + 16].tolist()
        assert row_y.tolist() == tokens[i + 1:i + 17].tolist()


def test_get_batch_reaches_the_last_token_and_no_further():
    data_ = np.arange(9, dtype=np.uint16)
    x, y = get_batch(data_, 4, 8, torch.Generator().manual_seed(1))
    assert (x == torch.arange(8)).all() and (y == torch.arange(1, 9)).all()


def test_get_batch_resumes_bit_exactly(tmp_path):
    ds = TokenDataset(_token_file(tmp_path / "t.bin", np.arange(5000) % 3000), context=32)
    g = torch.Generator().manual_seed(123)
    ds.batch(8, g)
    state = g.get_state()
    expected = [ds.batch(8, g) for _ in range(3)]
    g2 = torch.Generator()
    g2.set_state(state)
    for (x, y), (x2, y2) in zip(expected, (ds.batch(8, g2) for _ in range(3))):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(expected[0][0], expected[1][0])


def test_corpus_smaller_than_one_batch(tmp_path):
    path = _token_file(tmp_path / "short.bin", range(8))
    with pytest.raises(ValueError, match=r"corpus smaller than one batch.*8 tokens.*9"):
        TokenDataset(path, context=8)
    with pytest.raises(ValueError, match="corpus smaller than one batch.*0 tokens"):
        TokenDataset(_token_file(tmp_path / "empty.bin", []), context=4)
    with pytest.raises(ValueError, match="corpus smaller than one batch"):
        get_batch(np.zeros(5, dtype=np.uint16), 2, 5, torch.Generator())
    assert len(TokenDataset(path, context=7)) == 8
    with pytest.raises(ValueError, match="no token file"):
        TokenDataset(tmp_path / "missing.bin", context=4)


