"""Bad inputs to a model: every one is refused with an error that names the problem, nothing is
truncated or wrapped around silently, and a long text can be cut into windows only on request."""
import pytest
import torch

from sprout import Sprout
from sprout.tl.text import windows
from sprout.tokenizer import char_tokenizer, encode
from tests.conftest import TINY, randomize_gains

ALPHABET = "abcdefgh ."


@pytest.fixture
def char_model() -> Sprout:
    """The tiny Sprout reading text through a 10-character tokenizer (context 64)."""
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY, tokenizer=char_tokenizer(ALPHABET)).eval())


# --- text ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("call", ["forward", "run_with_cache", "generate"])
def test_empty_text_is_refused(char_model, call):
    run = {"forward": lambda t: char_model(t), "run_with_cache": char_model.run_with_cache,
           "generate": lambda t: char_model.generate(t, 3)}[call]
    with pytest.raises(ValueError, match="the text is empty: there is nothing to run the model on|the prompt is empty"):
        run("")
    with pytest.raises(ValueError, match="no texts given"):
        char_model.to_tokens([])
    assert char_model.to_tokens("").shape == (1, 0)  # as TransformerLens (issue 23): an empty [1, 0] tensor


def test_text_longer_than_the_context_is_truncated_as_transformer_lens_with_a_warning_naming_the_cut(char_model):
    fits, too_long = "ab" * 32, "ab" * 32 + "cd"  # 64 and 66 characters, one token each
    logits = char_model(fits)
    assert logits.shape == (1, 64, TINY.vocab_size)
    with pytest.warns(UserWarning, match=r"truncated to the model's context of 64 tokens.*text 0 \(66 tokens, the last 2 "
                      r"dropped\).*sprout.tl.text.windows\(ids, 64\)"):
        cut = char_model(too_long)
    assert torch.equal(cut, char_model(char_model.to_tokens(too_long)))  # TransformerLens' to_tokens truncates alike
    assert torch.equal(cut, logits)  # the 64 tokens kept are `fits`
    with pytest.warns(UserWarning, match=r"text 1 \(66 tokens"):
        batch, cache = char_model.run_with_cache(["ab", too_long])
    assert batch.shape == (2, 64, TINY.vocab_size) and cache["blocks.0.hook_resid_post"].shape[1] == 64
    with pytest.raises(ValueError, match="66 tokens is longer"):
        char_model.generate(too_long, 1)  # a prompt is not cut; generation itself slides
    with pytest.raises(ValueError, match="66 tokens is longer"):
        char_model(torch.zeros(1, 66, dtype=torch.long))  # ids are never cut: only text, as in TransformerLens


def test_windows_is_the_explicit_way_to_run_a_long_text(char_model):
    ids = torch.tensor(encode(char_model.tokenizer, "abcdefgh" * 20))  # 160 tokens
    w = windows(ids, 64)
    assert w.shape == (3, 64)
    assert torch.equal(w[0], ids[:64]) and torch.equal(w[1], ids[64:128]) and torch.equal(w[2], ids[-64:])
    logits = char_model(w)  # the windows fit, and run as one batch
    alone = char_model(ids[64:128][None])
    assert torch.allclose(logits[1], alone[0], atol=1e-6)
    overlapping = windows(ids, 64, stride=32)
    starts = [0, 32, 64, 96]  # then the last window moves back to end at token 160
    assert overlapping.shape == (4, 64)
    assert all(torch.equal(overlapping[i], ids[s:s + 64]) for i, s in enumerate(starts))
    positions = torch.arange(160)
    strided = windows(positions, 64, stride=7)
    assert strided.shape == (len(range(0, 96, 7)) + 1, 64)
    assert torch.equal(strided[:, 0], torch.tensor(list(range(0, 96, 7)) + [96]))
    assert torch.equal((strided[:, 1:] - strided[:, :-1]).unique(), torch.tensor([1]))  # contiguous
    assert torch.equal(strided.unique(), positions)  # every token is in some window
    assert torch.equal(windows(ids[:50], 64), ids[:50][None])  # a sequence that fits is one window
    assert torch.equal(windows(ids.tolist(), 64), w)  # a list of ids, as the tokenizer returns them
    with pytest.raises(ValueError, match="stride"):
        windows(ids, 64, stride=65)
    with pytest.raises(ValueError, match=r"one non-empty sequence .* got shape \(2, 160\)"):
        windows(torch.stack([ids, ids]), 64)


def test_unseen_characters_are_named(char_model):
    with pytest.raises(ValueError) as err:
        char_model("a cab? Zed")
    assert str(err.value) == "2 character(s) not in the tokenizer's vocabulary of 10: '?Z'"
    with pytest.raises(ValueError, match=r"1 character\(s\) not in the tokenizer's vocabulary of 10: 'é'"):
        char_model.to_tokens("café")
    assert char_model.to_str_tokens("a cab.") == list("a cab.")  # seen characters are fine


def test_a_list_of_ids_is_not_mistaken_for_text(char_model):
    with pytest.raises(TypeError, match="a list holding int; pass token ids as a torch.Tensor"):
        char_model([1, 2, 3])


# --- token ids ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [TINY.vocab_size, TINY.vocab_size + 1000, -1])
def test_ids_out_of_range_are_named(tiny_model, bad):
    ids = torch.tensor([[1, 2, bad, 3]])
    with pytest.raises(ValueError) as err:
        tiny_model(ids)
    assert str(err.value) == (f"token id {bad} is out of range for a vocabulary of {TINY.vocab_size} "
                              f"(valid: 0..{TINY.vocab_size - 1})")
    with pytest.raises(ValueError, match=f"token id {bad} is out of range"):
        tiny_model.run_with_hooks(ids, fwd_hooks=[("hook_embed", lambda x, hook: x)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bool, torch.complex64])
def test_wrong_dtype_is_named(tiny_model, dtype):
    with pytest.raises(TypeError, match=f"token ids must be an integer tensor, got dtype {dtype}"):
        tiny_model(torch.zeros(2, 5, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_every_integer_dtype_gives_the_same_logits(tiny_model, dtype):
    ids = torch.tensor([[3, 17, 42, 99, 200, 7]])
    assert torch.equal(tiny_model(ids.to(dtype), return_type="logits"), tiny_model(ids, return_type="logits"))


@pytest.mark.parametrize("shape, message", [
    ((1, 2, 3), r"token ids must have shape \[batch, pos\], got shape \(1, 2, 3\)"),
    ((), r"token ids must have shape \[batch, pos\], got shape \(\)"),
    ((3, 0), r"the sequence is empty \(0 tokens\)"),
    ((0, 5), r"the batch is empty: shape \(0, 5\)"),
])
def test_wrong_shape_is_named(tiny_model, shape, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(torch.zeros(shape, dtype=torch.long))


def test_not_a_tensor_is_named(tiny_model):
    import numpy as np

    with pytest.raises(TypeError, match="expected token ids as a torch.Tensor .* got ndarray"):
        tiny_model(np.zeros((1, 4), dtype=np.int64))


def test_a_batch_with_bad_targets_is_refused(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 3))
    with pytest.raises(ValueError, match=r"targets must be token ids of shape \(2, 3\) .*got \(2, 4\)"):
        tiny_model(ids, return_type="loss", targets=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(IndexError, match=f"Target {TINY.vocab_size + 3} is out of bounds"):
        tiny_model(ids, return_type="loss", targets=torch.full((2, 3), TINY.vocab_size + 3))
    with pytest.raises(RuntimeError, match="expected target dtype to be Long"):
        tiny_model(ids, return_type="loss", targets=torch.zeros(2, 3))
