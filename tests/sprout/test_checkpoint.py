"""Checkpoint I/O: round trips, every input form load() reads, every error it must name, atomic saves."""
import errno
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sprout import Sprout, SproutConfig
from sprout.files import checkpoint, folders
from sprout.tokenizer import char_tokenizer
from tests.conftest import TINY, randomize_gains

IDS = torch.tensor([[3, 17, 42, 99, 200, 7, 7, 1]])


def fresh(cfg: SproutConfig = TINY, seed: int = 0) -> Sprout:
    torch.manual_seed(seed)
    return randomize_gains(Sprout(cfg).eval(), seed)


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS % model.cfg.d_vocab, return_type="logits")


def assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert torch.equal(logits(a), logits(b))


# --- save -> load -----------------------------------------------------------------------------------

def test_round_trip_directory(tmp_path):
    model = fresh()
    model.tokenizer = char_tokenizer("hello world, sprout!")
    out = checkpoint.save(model, tmp_path / "ckpt")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert json.loads((out / "config.json").read_text()) == {"family": "sprout", **TINY.to_dict()}
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert "head.weight" not in f.keys() and "embed.weight" in f.keys()  # tied: stored once
        assert json.loads(f.metadata()["config"])["d_model"] == TINY.d_model

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = checkpoint.load(out)
    assert not loaded.training and loaded.config == TINY
    assert loaded.head.weight is loaded.embed.weight
    assert_same_model(model, loaded)
    assert loaded.tokenizer.get_vocab() == model.tokenizer.get_vocab()
    assert torch.equal(loaded.to_tokens("hello"), model.to_tokens("hello"))


def test_directory_without_tokenizer_cannot_read_text(tmp_path):
    checkpoint.save(fresh(), tmp_path / "ckpt")
    loaded = checkpoint.load(tmp_path / "ckpt")
    assert loaded.tokenizer is None
    with pytest.raises(ValueError, match="no tokenizer"):
        loaded("hello")


def test_tokenizer_argument_and_vocab_check(tmp_path):
    checkpoint.save(fresh(), tmp_path / "ckpt")
    tok = char_tokenizer("abc")
    assert checkpoint.load(tmp_path / "ckpt", tokenizer=tok).to_str_tokens("cab") == ["c", "a", "b"]
    big = char_tokenizer([chr(0x4E00 + i) for i in range(TINY.vocab_size + 1)])
    with pytest.raises(ValueError, match=f"{TINY.vocab_size + 1} tokens.*only {TINY.vocab_size}"):
        checkpoint.load(tmp_path / "ckpt", tokenizer=big)


def test_bfloat16_kept(tmp_path):
    model = fresh().to(torch.bfloat16)
    loaded = checkpoint.load(checkpoint.save(model, tmp_path / "ckpt"))
    assert loaded.embed.weight.dtype == torch.bfloat16
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())


def test_family_comes_from_the_class(tmp_path):
    class Other(Sprout):
        family = "other"

    torch.manual_seed(0)
    checkpoint.save(Other(TINY), tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["family"] == "other"
    with pytest.raises(ValueError, match="unknown model family 'other'"):
        checkpoint.load(tmp_path / "ckpt")


# --- lone safetensors files ---------------------------------------------------------------------------

def test_safetensors_file_config_from_metadata(tmp_path):
    model = fresh()
    checkpoint.save(model, tmp_path / "ckpt")
    alone = tmp_path / "elsewhere" / "weights.safetensors"
    alone.parent.mkdir()
    alone.write_bytes((tmp_path / "ckpt" / "model.safetensors").read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config is in the metadata: nothing to guess
        loaded = checkpoint.load(alone)
    assert loaded.config == TINY  # context 64, not the 512 an inference would assume
    assert_same_model(model, loaded)


def test_safetensors_file_config_beside_it(tmp_path):
    cfg = SproutConfig(vocab_size=256, context=32, n_layer=2, n_head=4, d_model=64, d_ff=128)
    model = fresh(cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"},
              str(tmp_path / "w.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    loaded = checkpoint.load(tmp_path / "w.safetensors")
    assert loaded.config == cfg
    assert_same_model(model, loaded)


def test_config_inferred_from_shapes(tmp_path):
    cfg = SproutConfig(vocab_size=100, context=64, n_layer=3, n_head=2, d_model=32, d_ff=48, rope_base=10000.0)
    model = fresh(cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"},
              str(tmp_path / "bare.safetensors"))
    with pytest.warns(UserWarning, match="context of 512"):
        loaded = checkpoint.load(tmp_path / "bare.safetensors")
    assert loaded.config == SproutConfig(**{**cfg.to_dict(), "context": 512})
    assert loaded.head.weight is loaded.embed.weight
    assert_same_model(model, loaded)  # RoPE tables agree on the first 64 positions


# --- torch files ----------------------------------------------------------------------------------------

LAYOUTS = {
    "bare": lambda sd, cfg: sd,
    "model+config": lambda sd, cfg: {"model": sd, "config": cfg, "step": 10},
    "state_dict+cfg": lambda sd, cfg: {"state_dict": sd, "cfg": cfg},
    "model_state_dict+model_args": lambda sd, cfg: {"model_state_dict": sd, "model_args": cfg, "optimizer": {}},
}


@pytest.mark.parametrize("prefix", ["", "_orig_mod.", "module.", "module._orig_mod."])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_file(tmp_path, layout, prefix):
    model = fresh()
    sd = {prefix + k: v for k, v in model.state_dict().items()}
    torch.save(LAYOUTS[layout](sd, TINY.to_dict()), tmp_path / "model.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = checkpoint.load(tmp_path / "model.pt")
    inferred = layout == "bare"
    assert any("context of 512" in str(w.message) for w in caught) == inferred
    assert loaded.config.context == (512 if inferred else TINY.context)
    assert loaded.head.weight is loaded.embed.weight
    assert_same_model(model, loaded)


def test_malicious_pickle_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"model": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError) as err:
        checkpoint.load(tmp_path / "evil.pt")
    msg = str(err.value)
    assert "evil.pt" in msg and "run code to load" in msg and "never do that" in msg
    assert not marker.exists()
    # the payload is live: an unsafe load does create the file, so the assertion above can fail
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.exists()


# --- errors ---------------------------------------------------------------------------------------------

def test_missing_unexpected_misshaped_keys_in_one_error(tmp_path):
    sd = fresh().state_dict()
    sd["blocks.0.attn.qkv.weight"] = torch.zeros(96, 64)
    del sd["blocks.1.ffn.w3.weight"]
    sd["blocks.1.attn.bias"] = torch.zeros(5)
    torch.save({"model": sd, "config": TINY.to_dict()}, tmp_path / "bad.pt")
    with pytest.raises(ValueError) as err:
        checkpoint.load(tmp_path / "bad.pt")
    msg = str(err.value)
    assert "bad.pt" in msg and "3 problem(s)" in msg
    assert "blocks.0.attn.qkv.weight: expected (192, 64), found (96, 64)" in msg
    assert "blocks.1.ffn.w3.weight: missing (expected (128, 64))" in msg
    assert "blocks.1.attn.bias: unexpected (found (5,))" in msg


def test_config_disagreeing_with_weights(tmp_path):
    sd = fresh().state_dict()
    cfg = {**TINY.to_dict(), "n_layer": 3, "d_ff": 100}
    torch.save({"model": sd, "config": cfg}, tmp_path / "m.pt")
    with pytest.raises(ValueError) as err:
        checkpoint.load(tmp_path / "m.pt")
    msg = str(err.value)
    assert "n_layer=3" in msg
    assert "blocks.2.attn.qkv.weight: missing (expected (192, 64))" in msg
    assert "blocks.0.ffn.w1.weight: expected (100, 64), found (128, 64)" in msg
    assert "blocks.1.ffn.w2.weight: expected (64, 100), found (64, 128)" in msg


def test_bad_config_key(tmp_path):
    torch.save({"model": fresh().state_dict(), "config": {**TINY.to_dict(), "n_layers": 2}}, tmp_path / "m.pt")
    with pytest.raises(ValueError, match=r"m\.pt: bad config: unknown SproutConfig keys \['n_layers'\]"):
        checkpoint.load(tmp_path / "m.pt")


def test_untied_head_refused(tmp_path):
    sd = {k: v.clone() for k, v in fresh().state_dict().items()}
    sd["head.weight"] += 1
    torch.save({"model": sd, "config": TINY.to_dict()}, tmp_path / "m.pt")
    with pytest.raises(ValueError, match="head.weight: differs from embed.weight"):
        checkpoint.load(tmp_path / "m.pt")


def test_cannot_infer_without_the_needed_keys(tmp_path):
    torch.save({"w": torch.zeros(3)}, tmp_path / "m.pt")
    with pytest.raises(ValueError, match=r"cannot infer.*embed\.weight"):
        checkpoint.load(tmp_path / "m.pt")


@pytest.mark.parametrize("kind", ["truncated", "garbage"])
def test_corrupt_safetensors(tmp_path, kind):
    checkpoint.save(fresh(), tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if kind == "truncated" else b"\x07not a safetensors file")
    with pytest.raises(ValueError, match=r"cannot read .*model\.safetensors: not a valid safetensors file"):
        checkpoint.load(tmp_path / "ckpt")


@pytest.mark.parametrize("kind", ["truncated", "garbage"])
def test_corrupt_torch_file(tmp_path, kind):
    torch.save(fresh().state_dict(), tmp_path / "m.pt")
    data = (tmp_path / "m.pt").read_bytes()
    (tmp_path / "m.pt").write_bytes(data[: len(data) // 2] if kind == "truncated" else b"garbage" * 10)
    with pytest.raises(ValueError, match=r"cannot read .*m\.pt: not a valid torch file"):
        checkpoint.load(tmp_path / "m.pt")


def test_non_finite_weights_warn_but_load(tmp_path):
    sd = {k: v.clone() for k, v in fresh().state_dict().items()}
    sd["blocks.1.ffn.w2.weight"][0, 0] = float("nan")
    sd["norm.weight"][3] = float("inf")
    torch.save({"model": sd, "config": TINY.to_dict()}, tmp_path / "m.pt")
    with pytest.warns(UserWarning, match=r"2 tensor\(s\): blocks\.1\.ffn\.w2\.weight, norm\.weight"):
        loaded = checkpoint.load(tmp_path / "m.pt")
    assert loaded.blocks[1].ffn.w2.weight[0, 0].isnan()


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a checkpoint: no model.safetensors"):
        checkpoint.load(tmp_path / "empty")
    (tmp_path / "w.npz").write_bytes(b"x")
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        checkpoint.load(tmp_path / "w.npz")
    with pytest.raises(FileNotFoundError, match="no checkpoint file or directory"):
        checkpoint.load(tmp_path / "nothing" / "here.pt")


# --- atomic writes ----------------------------------------------------------------------------------------

def test_overwrite_replaces_and_leaves_nothing_behind(tmp_path):
    a, b = fresh(seed=0), fresh(seed=1)
    checkpoint.save(a, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "trainer.pt").write_bytes(b"stale optimizer state")
    checkpoint.save(b, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == ["ckpt"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.safetensors"]
    assert_same_model(b, checkpoint.load(tmp_path / "ckpt"))


def test_failed_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    a, b = fresh(seed=0), fresh(seed=1)
    a.tokenizer = char_tokenizer("abc")
    checkpoint.save(a, tmp_path / "ckpt")
    real_write = checkpoint.write_bytes

    def disk_full(path, data):
        if path.name == "model.safetensors":
            real_write(path, data[: len(data) // 3])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(checkpoint, "write_bytes", disk_full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(b, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary directory left
    loaded = checkpoint.load(tmp_path / "ckpt")
    assert_same_model(a, loaded)
    assert loaded.tokenizer.get_vocab() == a.tokenizer.get_vocab()


def test_failed_rename_puts_the_old_checkpoint_back(tmp_path, monkeypatch):
    a, b = fresh(seed=0), fresh(seed=1)
    checkpoint.save(a, tmp_path / "ckpt")
    real_rename = os.rename

    def failing_rename(src, dst):
        if ".tmp-" in Path(src).name:
            raise OSError(errno.EIO, "I/O error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", failing_rename)
    monkeypatch.setattr(folders, "exchange", lambda a, b: False)  # the two-rename path, where no atomic swap exists
    with pytest.raises(OSError, match="I/O error"):
        checkpoint.save(b, tmp_path / "ckpt")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt"]
    assert_same_model(a, checkpoint.load(tmp_path / "ckpt"))


def test_refuses_to_replace_a_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="refusing to replace"):
        checkpoint.save(fresh(), tmp_path / "home")
    assert os.listdir(tmp_path / "home") == ["notes.txt"]


# --- run directories and demo names ---------------------------------------------------------------------

def test_run_directory_loads_the_highest_step(tmp_path):
    run = tmp_path / "run"
    assert checkpoint.latest_checkpoint(run) is None
    models = {step: fresh(seed=step) for step in (20, 100, 1000)}
    for step, model in models.items():
        checkpoint.save(model, run / "checkpoints" / f"step_{step:08d}")
        (run / "checkpoints" / f"step_{step:08d}" / "trainer.pt").write_bytes(b"optimizer")
    (run / "checkpoints" / "step_00002000").mkdir()  # an interrupted save: no weights
    (run / "checkpoints" / "step_99999999.tmp").mkdir()
    assert checkpoint.latest_checkpoint(run) == run / "checkpoints" / "step_00001000"
    assert_same_model(models[1000], checkpoint.load(run))


def test_empty_run_directory(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert checkpoint.latest_checkpoint(tmp_path / "run") is None
    with pytest.raises(ValueError, match="holds no complete step_"):
        checkpoint.load(tmp_path / "run")


def test_demo_names(tmp_path, monkeypatch):
    assert checkpoint.demo_dir() == Path(checkpoint.__file__).resolve().parent.parent / "demo"
    monkeypatch.setattr(checkpoint, "demo_dir", lambda: tmp_path / "demo")
    with pytest.raises(FileNotFoundError, match="'gpt-9'.*none are shipped yet"):
        checkpoint.load("gpt-9")
    model = fresh()
    checkpoint.save(model, tmp_path / "demo" / "tiny")
    checkpoint.save(model, tmp_path / "demo" / "tiny-2")
    monkeypatch.chdir(tmp_path)
    assert_same_model(model, checkpoint.load("tiny"))
    with pytest.raises(FileNotFoundError, match=r"no demo model of that name; demo models: tiny, tiny-2"):
        checkpoint.load("gpt-9")


# --- the walkthrough GPT ----------------------------------------------------------------------------------

def walkthrough_model(step: str = "4.10"):
    from sprout.walkthrough import WalkthroughGPT, step_config

    torch.manual_seed(0)
    text = "First Citizen: speak, speak."
    return randomize_gains(WalkthroughGPT(step_config(step, vocab_size=len(set(text))),
                                          tokenizer=char_tokenizer(text)).eval())


def test_walkthrough_round_trip(tmp_path):
    model = walkthrough_model()
    out = checkpoint.save(model, tmp_path / "ckpt")
    assert json.loads((out / "config.json").read_text()) == {"family": "walkthrough", **model.config.to_dict()}
    loaded = checkpoint.load(out)
    assert type(loaded) is type(model) and loaded.config == model.config and not loaded.training
    assert_same_model(model, loaded)
    assert loaded.to_str_tokens("speak") == list("speak")


@pytest.mark.parametrize("step", ["4.2", "4.10"])
def test_walkthrough_state_dict_dispatch(tmp_path, step):
    from sprout.files.walkthrough_keys import to_walkthrough_state_dict

    model = walkthrough_model(step)
    sd = to_walkthrough_state_dict(model)
    assert "token_embedding_table.weight" in sd
    torch.save({"model_state_dict": {"_orig_mod." + k: v for k, v in sd.items()}}, tmp_path / "walk.pt")
    loaded = checkpoint.load(tmp_path / "walk.pt", tokenizer=model.tokenizer)
    assert type(loaded) is type(model)
    assert_same_model(model, loaded)


def test_walkthrough_weights_that_do_not_fit(tmp_path):
    model = walkthrough_model()
    checkpoint.save(model, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, "d_model": 64}))
    expected = r"(?s)do not fit a WalkthroughGPT.*\n  config field d_model=64.*\n  embed\.weight: expected \(\d+, 64\), found \(\d+, 32\)"
    with pytest.raises(ValueError, match=expected):
        checkpoint.load(tmp_path / "ckpt")


def test_corrupt_config_and_tokenizer_files(tmp_path):
    model = fresh()
    model.tokenizer = char_tokenizer("abc")
    checkpoint.save(model, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "tokenizer.json").write_text('{"version": ')
    with pytest.raises(ValueError, match=r"cannot read the tokenizer .*tokenizer\.json"):
        checkpoint.load(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"cannot read .*config\.json: not valid JSON"):
        checkpoint.load(tmp_path / "ckpt")
