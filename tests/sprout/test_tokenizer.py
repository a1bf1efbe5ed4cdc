import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sprout.files import load_tokenizer, save_tokenizer
from sprout.material import generate_corpus, random_name
from sprout.tokenizer import char_tokenizer, decode, encode, is_char_level, train_bpe


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(generate_corpus(1_000_000, seed=11), vocab_size=4096)


def test_bpe_has_requested_vocab_and_eot_first(bpe):
    assert bpe.get_vocab_size() == 4096
    assert bpe.token_to_id("<|endoftext|>") == 0
    assert encode(bpe, "a<|endoftext|>b") == [encode(bpe, "a")[0], 0, encode(bpe, "b")[0]]
    assert not is_char_level(bpe)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_bpe_round_trips_any_text(bpe, text):
    assert decode(bpe, encode(bpe, text)) == text


@pytest.mark.parametrize("text", [
    "", " ", "  leading and trailing  ", "\r\n\t\x00\x7f", "naïve café 😀 中文 \u200b",
    "story one.\n\n<|endoftext|>\n\nstory two", "Zorbin Plax met Zorbin Plax.",
])
def test_bpe_round_trips_awkward_text(bpe, text):
    assert decode(bpe, encode(bpe, text)) == text


def test_bpe_compresses_and_merges_common_words(bpe):
    text = generate_corpus(20_000, seed=99)
    assert len(encode(bpe, text)) < len(text.encode()) / 2.5
    assert len(encode(bpe, " the")) == 1


def test_names_split_into_several_pieces(bpe):
    rng = random.Random(2024)
    pieces = [len(encode(bpe, " " + random_name(rng))) for _ in range(300)]
    assert statistics.median(pieces) >= 2


def test_bpe_trains_from_an_iterator():
    docs = generate_corpus(100_000, seed=5).split("\n\n")
    tok = train_bpe(iter(docs), vocab_size=400)
    assert tok.get_vocab_size() == 400
    assert decode(tok, encode(tok, docs[0])) == docs[0]


def test_bpe_vocab_too_small_is_an_error():
    with pytest.raises(ValueError, match="too small"):
        train_bpe("some text", vocab_size=200)


def test_char_ids_are_sorted_set_indices():
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}
    tok = char_tokenizer(text)
    assert tok.get_vocab_size() == len(stoi)
    assert tok.get_vocab() == stoi
    assert encode(tok, text) == [stoi[c] for c in text]
    assert stoi["\n"] == 0 and stoi[" "] == 1
    assert is_char_level(tok)


def test_char_tokenizer_from_a_list_of_chars():
    assert char_tokenizer(["b", "a", "b"]).get_vocab() == {"a": 0, "b": 1}
    with pytest.raises(ValueError):
        char_tokenizer("")
    with pytest.raises(ValueError, match="single characters"):
        char_tokenizer(["ab", "c"])


ALPHABET = "\n !',-.:;?ABCabcxyz\tÉé😀"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=ALPHABET))
def test_char_round_trips_its_alphabet(text):
    tok = char_tokenizer(ALPHABET)
    ids = encode(tok, text)
    assert len(ids) == len(text)
    assert decode(tok, ids) == text


def test_char_single_token_decodes_to_its_character():
    tok = char_tokenizer("a \nb")
    assert [decode(tok, [i]) for i in range(4)] == ["\n", " ", "a", "b"]


def test_char_unseen_characters_are_named():
    tok = char_tokenizer("hello world")
    with pytest.raises(ValueError, match=r"'QZ'"):
        encode(tok, "hello Zero Qwerd")
    with pytest.raises(Exception):  # the raw tokenizer refuses too, rather than guessing an id
        tok.encode("Z")


def test_encode_rejects_non_text(bpe):
    with pytest.raises(ValueError, match="str"):
        encode(bpe, [1, 2, 3])
    with pytest.raises(ValueError, match="str"):
        encode(char_tokenizer("ab"), b"ab")


def test_decode_shows_ids_outside_vocab():
    tok = char_tokenizer("abc")
    assert decode(tok, [2, 0]) == "ca"
    assert decode(tok, [3]) == "<unk:3>"
    assert decode(tok, [2, 7, 0, 1, -1]) == "c<unk:7>ab<unk:-1>"
    with pytest.raises(TypeError, match="integers"):
        decode(tok, [1.5])


def test_save_and_load(bpe, tmp_path):
    char = char_tokenizer("abc\n ")
    save_tokenizer(char, tmp_path / "sub" / "char.json")
    save_tokenizer(bpe, tmp_path / "bpe.json")
    char2, bpe2 = load_tokenizer(tmp_path / "sub" / "char.json"), load_tokenizer(tmp_path / "bpe.json")
    assert is_char_level(char2) and not is_char_level(bpe2)
    assert char2.get_vocab() == char.get_vocab()
    assert decode(char2, encode(char2, "cab \n")) == "cab \n"
    text = "Zorbin Plax typed K7-QX-42."
    assert encode(bpe2, text) == encode(bpe, text)
    with pytest.raises(ValueError, match="no tokenizer"):
        load_tokenizer(tmp_path / "missing.json")
