"""Issue 13, model side: unknown ids decode visibly, threads never mix caches, hooks' replacements are
checked, incl_bwd leaves .grad alone, run_with_cache_into refuses buffers that would lose data."""
import re
import threading

import pytest
import torch

from interp._core.model import str_tokens
from sprout import Sprout
from sprout.tokenizer import char_tokenizer
from tests.conftest import TINY, randomize_gains

ALPHABET = "abcdefgh \n"  # 10 ids, while the model has 256


@pytest.fixture
def char_model() -> Sprout:
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY, tokenizer=char_tokenizer(ALPHABET)).eval())


# --- ids the tokenizer lacks ------------------------------------------------------------------------

def test_every_decode_path_shows_unknown_ids_the_same_way(char_model):
    ids = torch.tensor([2, 200, 3, 11])
    # sorted characters: "\n" 0, " " 1, "a" 2, "b" 3 ...
    assert char_model.to_string(ids) == "a<unk:200>b<unk:11>"
    assert char_model.to_str_tokens(ids) == ["a", "<unk:200>", "b", "<unk:11>"]
    assert str_tokens(char_model, ids) == ["a", "<unk:200>", "b", "<unk:11>"]
    assert char_model.tokenizer.decode(ids.tolist()) == "a<unk:200>b<unk:11>"


def test_generate_returns_every_token_it_drew(char_model):
    with torch.no_grad():
        char_model.embed.weight[200:] *= 20  # unknown ids now win often (the output layer is tied)
    torch.manual_seed(1)
    text = char_model.generate("abc", max_new_tokens=12, stop_at_eos=False, verbose=False)
    pieces = re.findall(r"<unk:\d+>|.", text, flags=re.S)
    assert len(pieces) == 3 + 12 and any(p.startswith("<unk:") for p in pieces)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_non_integer_ids_are_a_type_error_everywhere(char_model, dtype):
    ids = torch.tensor([[1, 2, 0]]).to(dtype)
    for call in (char_model.to_string, char_model.to_str_tokens, char_model, char_model.run_with_cache,
                 lambda t: char_model.generate(t, max_new_tokens=1)):
        with pytest.raises(TypeError, match="integer"):
            call(ids)


# --- threads -----------------------------------------------------------------------------------------

def test_two_threads_never_mix_their_caches(tiny_model):
    inputs = [torch.randint(0, TINY.vocab_size, (2, 24), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    names = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern", "unembed.hook_out"]
    refs = [tiny_model.run_with_cache(x, names_filter=names)[1] for x in inputs]
    plain_refs = [tiny_model(x, return_type="logits") for x in inputs]
    bad, errors = [], []

    def work(i):
        try:
            for _ in range(25):
                _, cache = tiny_model.run_with_cache(inputs[i], names_filter=names)
                if not all(torch.equal(cache[n], refs[i][n]) for n in names):
                    bad.append(i)
                plain = tiny_model(inputs[1 - i], return_type="logits")  # a plain call beside them
                if not torch.equal(plain, plain_refs[1 - i]):
                    bad.append(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not bad


def test_a_generator_suspended_inside_hooks_keeps_its_hooks_to_its_own_thread(tiny_model):
    seen = []

    def gen():
        with tiny_model.hooks(fwd_hooks=[("hook_embed", lambda t, hook: seen.append(threading.get_ident()))]):
            yield

    g = gen()
    next(g)  # suspended inside hooks()
    ids = torch.randint(0, TINY.vocab_size, (1, 5))
    tiny_model(ids)
    assert seen == [threading.get_ident()]  # documented: in its own thread the hooks stay active
    done = []
    other = threading.Thread(target=lambda: done.append(tiny_model(ids, return_type="logits")))
    other.start()
    other.join(timeout=0.5)
    assert not done  # the other thread waits instead of running through these hooks
    g.close()
    other.join(timeout=30)
    assert len(done) == 1 and len(seen) == 1


# --- hooks -------------------------------------------------------------------------------------------

def test_a_hook_returning_a_broadcastable_shape_is_refused(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 5))

    def wrong(t, hook):
        return t.expand(2, 5, TINY.d_model).clone()  # [B, T, D] for a [B, T, 1] scale: would broadcast

    with pytest.raises(ValueError, match=r"'blocks\.0\.ln1\.hook_scale' returned shape \[2, 5, 64\] .*shape \[2, 5, 1\]"):
        tiny_model.run_with_hooks(ids, fwd_hooks=[("blocks.0.ln1.hook_scale", wrong)])
    with pytest.raises(TypeError, match=r"'blocks\.1\.hook_resid_mid' returned dtype torch\.float64"):
        tiny_model.run_with_hooks(ids, fwd_hooks=[("blocks.1.hook_resid_mid", lambda t, hook: t.double())])
    with pytest.raises(TypeError, match=r"'hook_embed' returned a list"):
        tiny_model.run_with_hooks(ids, fwd_hooks=[("hook_embed", lambda t, hook: [t])])
    tiny_model.add_hook("hook_embed", lambda t, hook: t[:, :1])
    try:
        with pytest.raises(ValueError, match="'hook_embed' returned shape"):
            tiny_model(ids)
    finally:
        tiny_model.reset_hooks()
    assert torch.equal(tiny_model.run_with_hooks(ids, fwd_hooks=[("hook_embed", lambda t, hook: t * 1)]),
                       tiny_model(ids, return_type="logits"))


def test_incl_bwd_leaves_parameter_grads_as_they_were(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 6))
    _, cache = tiny_model.run_with_cache(ids, "loss", targets=ids, incl_bwd=True)
    assert "hook_embed_grad" in cache.cache_dict
    assert all(p.grad is None for p in tiny_model.parameters())
    tiny_model.embed.weight.grad = torch.ones_like(tiny_model.embed.weight)
    _, cache2 = tiny_model.run_with_cache(ids, return_type="loss", incl_bwd=True)
    assert torch.equal(tiny_model.embed.weight.grad, torch.ones_like(tiny_model.embed.weight))
    torch.testing.assert_close(cache2["blocks.0.hook_resid_post_grad"].abs().sum() > 0, torch.tensor(True))


def test_run_with_cache_into_refuses_small_or_integer_buffers(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 6))
    with pytest.raises(ValueError, match=r"'blocks\.0\.hook_resid_post' has shape \[2, 4, 64\] but the activation has shape \[2, 6, 64\]"):
        tiny_model.run_with_cache_into(ids, {"blocks.0.hook_resid_post": torch.zeros(2, 4, 64)})
    with pytest.raises(TypeError, match=r"'blocks\.0\.hook_resid_post' has dtype torch\.int64"):
        tiny_model.run_with_cache_into(ids, {"blocks.0.hook_resid_post": torch.zeros(2, 6, 64, dtype=torch.long)})
    buf = torch.full((3, 8, 64), float("nan"))
    tiny_model.run_with_cache_into(ids, {"blocks.0.hook_resid_post": buf})
    _, cache = tiny_model.run_with_cache(ids, names_filter="blocks.0.hook_resid_post")
    assert torch.equal(buf[:2, :6], cache["blocks.0.hook_resid_post"]) and buf[2:].isnan().all()
