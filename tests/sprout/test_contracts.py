"""One contract per class: `Sprout` and `WalkthroughGPT` answer as TransformerLens' HookedTransformer (the
forward is a plain Tensor of logits), `sprout.model.GPT` as the course's model.py (`(logits, loss)`), over
the same modules and the same state dict. The course class is checked against `PlainSprout`, an
independent copy of model.py."""
import re
from pathlib import Path

import pytest
import torch

import sprout
from benchmarks.plain_sprout import PlainSprout
from sprout import GPT, Sprout, build_step
from sprout.tl.generation import sample
from tests.conftest import TINY, randomize_gains


def ids(batch: int, pos: int = 9, seed: int = 0, vocab: int = TINY.vocab_size) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("make", [lambda: Sprout(TINY).eval(), lambda: build_step("4.10").eval()],
                         ids=["Sprout", "WalkthroughGPT"])
def test_the_forward_unpacks_as_any_tensor(make):
    model = make()
    vocab = model.cfg.d_vocab
    three, two = ids(3, 6, vocab=vocab), ids(2, 6, vocab=vocab)
    with torch.no_grad():
        with pytest.raises(ValueError, match="too many values to unpack"):
            a, b = model(three)
        a, b = model(two)
        both = model(two)
    assert type(both) is torch.Tensor
    assert torch.equal(a, both[0]) and torch.equal(b, both[1])


def test_sprout_load_gives_the_transformerlens_class():
    model = sprout.load("gpt-4")
    assert type(model) is Sprout
    with torch.no_grad():
        with pytest.raises(ValueError, match="too many values to unpack"):
            a, b = model(ids(3, vocab=model.cfg.d_vocab))
        a, b = model(ids(2, vocab=model.cfg.d_vocab))
    assert a.shape == b.shape == (9, model.cfg.d_vocab)


def test_the_state_dict_keys_are_the_course_model_py_keys():
    course = PlainSprout(TINY).state_dict()
    for model in (GPT(TINY), Sprout(TINY)):
        assert list(model.state_dict()) == list(course)
        assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in course.items()}


def test_the_course_training_loop_runs_unchanged_and_trains_as_model_py():
    torch.manual_seed(0)
    model = GPT(TINY)
    plain = PlainSprout(TINY)
    plain.load_state_dict(model.state_dict(), strict=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    for step in range(3):
        seq = ids(4, 17, seed=step)
        x, y = seq[:, :-1], seq[:, 1:]
        logits, loss = model(x, y)  # the course's loop, word for word
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        plain_logits, plain_loss = plain(x, y)
        plain_optimizer.zero_grad(set_to_none=True)
        plain_loss.backward()
        plain_optimizer.step()
        torch.testing.assert_close(loss, plain_loss)
        torch.testing.assert_close(logits, plain_logits)
    logits, _ = model(x)  # the course's `logits, _ = model(idx)`
    assert _ is None and logits.shape == (4, 16, TINY.vocab_size)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def test_loss_mask_weights_the_positions_as_model_py():
    model = GPT(TINY)
    x, y = ids(2, 10, seed=1), ids(2, 10, seed=2)
    mask = torch.zeros(2, 10)
    mask[1, 2:5] = 1
    logits, masked = model(x, y, mask)
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, TINY.vocab_size), y.reshape(-1), reduction="none")
    torch.testing.assert_close(masked, per_token.view(2, 10)[1, 2:5].mean())


def test_the_two_classes_share_their_modules_and_give_the_same_logits():
    tl = randomize_gains(Sprout(TINY).eval())
    course = GPT.from_sprout(tl)
    assert course.embed.weight is tl.embed.weight and course.blocks is tl.blocks
    x = ids(2, 12)
    with torch.no_grad():
        logits, none = course(x)
        assert none is None and torch.equal(logits, tl(x))
        assert torch.equal(course(x, x)[1], tl(x, return_type="loss", targets=x))
        course.blocks[0].ffn.w2.weight.mul_(2)  # one set of parameters: a change shows through both
        assert torch.equal(course(x)[0], tl(x))
    back = Sprout.from_gpt(course)
    assert back.cfg is tl.cfg and back.head.weight is tl.embed.weight  # still tied
    with torch.no_grad():
        assert torch.equal(back(x), tl(x))
    with pytest.raises(ValueError, match="share="):
        GPT(sprout.SproutConfig(**{**TINY.to_dict(), "n_layer": 1}), share=tl)


def test_a_course_model_loads_into_the_transformerlens_class():
    course = GPT(TINY).eval()
    tl = Sprout(TINY).eval()
    tl.load_state_dict(course.state_dict(), strict=True)
    x = ids(3, 8)
    with torch.no_grad():
        assert torch.equal(course(x)[0], tl(x))


def test_the_course_generate_is_model_py_sampler_on_the_same_weights():
    course = GPT(TINY).eval()
    prompt = ids(1, 4)
    torch.manual_seed(3)
    ours = course.generate(prompt, 5)
    torch.manual_seed(3)
    theirs = sample(Sprout.from_gpt(course), prompt, 5)
    assert ours.shape == (1, 9) and torch.equal(ours, theirs) and torch.equal(ours[:, :4], prompt)


def test_targets_without_a_loss_and_tensors_as_return_type_are_refused():
    model = Sprout(TINY)
    x = ids(1, 5)
    with pytest.raises(ValueError, match="the second positional argument is return_type"):
        model(x, x)
    with pytest.raises(ValueError, match="targets= is read only for a loss"):
        model(x, targets=x)
    with pytest.raises(ValueError, match="loss_mask= is read only for a loss"):
        model(x, loss_mask=torch.ones(1, 5))


def test_the_docs_block_on_the_two_classes_runs_as_written():
    page = (Path(__file__).resolve().parents[2] / "docs/guide/transformerlens.md").read_text(encoding="utf-8")
    section = page.split("## Two classes, one set of weights", 1)[1]
    code = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    seq = ids(2, 9, vocab=1000)  # within every demo vocabulary
    scope = {"tokens": seq, "idx": seq[:, :-1], "targets": seq[:, 1:]}
    exec(code, scope)
    with torch.no_grad():
        assert torch.equal(scope["back"](seq), scope["model"](seq))
    assert scope["loss"].item() == pytest.approx(scope["model"](seq[:, :-1], return_type="loss", targets=seq[:, 1:]).item())
