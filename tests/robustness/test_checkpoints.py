"""Bad checkpoints: cut short, booby-trapped, from another preset, with a config that lies, with
non-finite weights, without a tokenizer. Each is refused or loaded with a message that names the file,
the key and the numbers; a pickle that wants to run code is refused before it runs."""
import builtins
import gc
import json
import os
import pickle
import warnings

import pytest
import torch

from sprout import Sprout, SproutConfig
from sprout.files import checkpoint
from sprout.files.checkpoint import from_state_dict
from sprout.tokenizer import char_tokenizer
from tests.conftest import TINY
from tests.sprout.test_checkpoint import assert_same_model, fresh

# --- truncated and empty files ------------------------------------------------------------------------

CUTS = {"empty": lambda n: 0, "1 byte": lambda n: 1, "8 bytes": lambda n: 8, "100 bytes": lambda n: 100,
        "half": lambda n: n // 2, "all but 1 byte": lambda n: n - 1}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One checkpoint directory, one zip torch file and one legacy-format torch file of the same model."""
    root = tmp_path_factory.mktemp("saved")
    model = fresh()
    checkpoint.save(model, root / "ckpt")
    torch.save({"model": model.state_dict(), "config": TINY.to_dict()}, root / "zip.pt")
    torch.save({"model": model.state_dict(), "config": TINY.to_dict()}, root / "legacy.pt",
               _use_new_zipfile_serialization=False)
    return root


def cut_copy(src, dst, cut):
    data = src.read_bytes()
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data[:CUTS[cut](len(data))])
    return dst


@pytest.mark.parametrize("cut", CUTS)
def test_truncated_safetensors_is_refused_naming_the_file(saved, tmp_path, cut):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_bytes((saved / "ckpt" / "config.json").read_bytes())
    weights = cut_copy(saved / "ckpt" / "model.safetensors", ckpt / "model.safetensors", cut)
    with pytest.raises(ValueError) as err:
        checkpoint.load(ckpt)
    expected = ("the file is empty (0 bytes" if cut == "empty"
                else "not a valid safetensors file (truncated or corrupt?)")
    assert str(err.value).startswith(f"cannot read {weights}: {expected}")


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("cut", CUTS)
def test_truncated_torch_file_is_refused_naming_the_file(saved, tmp_path, fmt, cut):
    path = cut_copy(saved / f"{fmt}.pt", tmp_path / "m.pt", cut)
    with pytest.raises(ValueError) as err:
        checkpoint.load(path)
    expected = ("the file is empty (0 bytes" if cut == "empty"
                else "not a valid torch file (truncated or corrupt?)")
    assert str(err.value).startswith(f"cannot read {path}: {expected}")
    assert "miniz" not in str(err.value) and "weights_only` argument" not in str(err.value)  # no torch advice


def test_the_untouched_files_load(saved):
    model = fresh()
    for path in (saved / "ckpt", saved / "zip.pt", saved / "legacy.pt"):
        assert_same_model(model, checkpoint.load(path))


# --- pickles that would run code -----------------------------------------------------------------------

def payloads(marker):
    class Open:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    class Exec:
        def __reduce__(self):
            return (builtins.exec, (f"open({str(marker)!r}, 'w').close()",))

    class System:
        def __reduce__(self):
            return (os.system, (f"touch '{marker}'",))

    return {"open": Open, "exec": Exec, "os.system": System}


WRITERS = {
    "torch.save": lambda obj, path: torch.save(obj, path),
    "torch.save legacy": lambda obj, path: torch.save(obj, path, _use_new_zipfile_serialization=False),
    "pickle protocol 2": lambda obj, path: path.write_bytes(pickle.dumps(obj, protocol=2)),
    "pickle protocol 5": lambda obj, path: path.write_bytes(pickle.dumps(obj, protocol=5)),
}
PLACES = {  # where in the file the payload hides
    "beside the weights": lambda sd, p: {"model": sd, "config": TINY.to_dict(), "extra": p},
    "as a weight": lambda sd, p: {**sd, "blocks.0.attn.qkv.weight": p},
    "as the config": lambda sd, p: {"model": sd, "config": p},
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("kind", ["open", "exec", "os.system"])
def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path, kind, writer, place):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    WRITERS[writer](PLACES[place](fresh().state_dict(), payloads(marker)[kind]()), path)
    with pytest.raises(ValueError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note that protocol 5 is not its default
        checkpoint.load(path)
    assert not marker.exists(), "the payload ran"
    msg = str(err.value)
    if writer == "pickle protocol 5":  # torch's reader cannot parse it at all, so cannot be tricked by it
        assert msg.startswith(f"cannot read {path}: it is a plain pickle (protocol 5), not a torch.save file")
    else:
        assert msg.startswith(f"refusing to load {path}: it holds more than tensors and plain data, so it "
                              "would need to run code to load, and we never do that")
        wanted = msg.split("the weights-only reader stopped at: ")[1]
        if writer.startswith("torch.save"):  # (a plain pickle's tensors are refused first, being code too)
            assert "GLOBAL" in wanted and kind.split(".")[-1] in wanted  # names what it wanted to call
    # the payload is live: an unsafe load creates the file, so the assertion above can fail
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the file object the payload opened is dropped unclosed
        try:
            torch.load(path, weights_only=False)
        except Exception:
            pass  # a plain pickle is no torch file, but it ran on the way
        gc.collect()
    assert marker.exists()


# --- weights that do not fit ----------------------------------------------------------------------------

def preset_state_dict(name):
    torch.manual_seed(0)
    return Sprout(SproutConfig.preset(name)).state_dict()


def test_weights_of_a_smaller_preset_are_refused_naming_every_missing_key(tmp_path):
    torch.save({"model": preset_state_dict("gpt-1"), "config": SproutConfig.preset("gpt-4").to_dict()},
               tmp_path / "m.pt")
    with pytest.raises(ValueError) as err:
        checkpoint.load(tmp_path / "m.pt")
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'm.pt'}: the weights do not fit a Sprout with config SproutConfig("
                          "vocab_size=8192, context=512, n_layer=4")
    assert "(27 problem(s))" in msg  # 9 tensors in each of blocks 1, 2, 3
    for l in (1, 2, 3):
        assert f"blocks.{l}.attn.qkv.weight: missing (expected (576, 192))" in msg
        assert f"blocks.{l}.ffn.w2.weight: missing (expected (192, 512))" in msg


def test_weights_of_a_larger_preset_are_refused_naming_every_unexpected_key():
    with pytest.raises(ValueError) as err:
        from_state_dict(preset_state_dict("gpt-4"), SproutConfig.preset("gpt-1"), source="gpt-4 weights")
    msg = str(err.value)
    assert msg.startswith("gpt-4 weights: the weights do not fit a Sprout") and "(27 problem(s))" in msg
    assert "blocks.3.norm2.weight: unexpected (found (192,))" in msg


def test_weights_of_a_wider_preset_are_refused_naming_the_shapes():
    sd = {k: v for k, v in preset_state_dict("sprout").items() if not k.startswith(("blocks.4", "blocks.5",
                                                                                    "blocks.6", "blocks.7"))}
    with pytest.raises(ValueError) as err:
        from_state_dict(sd, SproutConfig.preset("gpt-4"), source="sprout weights")
    msg = str(err.value)
    assert "embed.weight: expected (8192, 192), found (8192, 384)" in msg
    assert "blocks.0.attn.q_norm.weight: expected (64,), found (64,)" not in msg  # d_head is 64 in both
    assert "blocks.2.ffn.w1.weight: expected (512, 192), found (1024, 384)" in msg


@pytest.mark.parametrize("field, value, named", [
    ("n_layer", 3, ["blocks.2.attn.qkv.weight: missing (expected (192, 64))"]),
    ("d_ff", 100, ["blocks.0.ffn.w1.weight: expected (100, 64), found (128, 64)",
                   "blocks.1.ffn.w2.weight: expected (64, 100), found (64, 128)"]),
    ("vocab_size", 300, ["embed.weight: expected (300, 64), found (256, 64)"]),
    ("n_head", 2, ["blocks.0.attn.q_norm.weight: expected (32,), found (16,)"]),
    ("d_model", 32, ["blocks.0.attn.proj.weight: expected (32, 32), found (64, 64)"]),
])
def test_a_config_whose_numbers_disagree_with_the_weights_is_refused(tmp_path, field, value, named):
    ckpt = checkpoint.save(fresh(), tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the disagreement with the metadata is reported too
        checkpoint.load(ckpt)
    msg = str(err.value)
    assert "the weights do not fit a Sprout with config SproutConfig(" in msg and f"{field}={value}" in msg
    for line in named:
        assert line in msg


def test_an_edited_context_fits_any_weights_so_the_disagreement_is_a_warning(tmp_path):
    ckpt = checkpoint.save(fresh(), tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "context": 128, "rope_base": 500.0}))
    with pytest.warns(UserWarning) as caught:
        model = checkpoint.load(ckpt)
    assert str(caught[0].message) == (
        f"{ckpt / 'config.json'} disagrees with the config saved inside model.safetensors on context "
        "(128 vs 64), rope_base (500.0 vs 10000.0); using config.json")
    assert model.cfg.n_ctx == 128 and model.config.rope_base == 500.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an untouched checkpoint loads without a word
        checkpoint.load(checkpoint.save(fresh(), tmp_path / "clean"))


# --- non-finite weights ---------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["directory", "torch file"])
def test_nan_and_inf_weights_load_with_a_warning_naming_each_tensor(tmp_path, form):
    model = fresh()
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[5, 7] = float("nan")
        model.blocks[1].ffn.w3.weight[0, 0] = float("-inf")
        model.norm.weight[2] = float("inf")
    if form == "directory":
        path = checkpoint.save(model, tmp_path / "ckpt") / "model.safetensors"
        source = path
    else:
        path = tmp_path / "m.pt"
        torch.save({"model": model.state_dict(), "config": TINY.to_dict()}, path)
        source = path
    with pytest.warns(UserWarning) as caught:
        loaded = checkpoint.load(path.parent if form == "directory" else path)
    messages = [str(w.message) for w in caught]
    assert messages == [f"{source}: non-finite (NaN or inf) values in 3 tensor(s): blocks.0.attn.qkv.weight, "
                        "blocks.1.ffn.w3.weight, norm.weight"]
    assert loaded.blocks[0].attn.qkv.weight[5, 7].isnan() and loaded.norm.weight[2] == float("inf")
    assert torch.isfinite(loaded.blocks[0].attn.qkv.weight[5, 6])


# --- no tokenizer ---------------------------------------------------------------------------------------

def test_a_directory_without_its_tokenizer_loads_and_text_then_fails_saying_so(tmp_path):
    model = fresh()
    model.tokenizer = char_tokenizer("abc ")
    ckpt = checkpoint.save(model, tmp_path / "ckpt")
    os.remove(ckpt / "tokenizer.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = checkpoint.load(ckpt)
    assert loaded.tokenizer is None
    ids = torch.tensor([[0, 1, 2, 3]])
    assert torch.equal(loaded(ids, return_type="logits"), model(ids, return_type="logits"))  # token ids work as before
    no_tokenizer = "this model has no tokenizer, so it cannot read text: pass token ids, or give it one"
    for attempt in (lambda: loaded("abc"), lambda: loaded.to_tokens("abc"), lambda: loaded.to_str_tokens("abc"),
                    lambda: loaded.run_with_cache("abc"), lambda: loaded.generate("abc", 2),
                    lambda: loaded.to_string(ids), lambda: loaded.to_str_tokens(ids)):
        with pytest.raises(ValueError) as err:
            attempt()
        assert str(err.value).startswith(no_tokenizer)
    loaded.tokenizer = model.tokenizer  # the fix the message suggests
    assert loaded.to_string(ids) == [" abc"]  # ids in sorted order: " " is 0


# --- a save killed half way -------------------------------------------------------------------------------

def test_a_save_killed_between_its_renames_is_found_and_its_debris_cleared(tmp_path):
    a, b = fresh(seed=0), fresh(seed=1)
    ckpt = checkpoint.save(a, tmp_path / "ckpt")
    # What SIGKILL between save()'s two renames leaves: the old checkpoint moved aside, the new one
    # complete under its temporary name, nothing at the path itself.
    os.rename(ckpt, tmp_path / ".ckpt.old-1a2b3c4d")
    checkpoint.save(b, tmp_path / "elsewhere")
    os.rename(tmp_path / "elsewhere", tmp_path / ".ckpt.tmp-x9y8z7")
    with pytest.raises(FileNotFoundError) as err:
        checkpoint.load(ckpt)
    assert str(err.value) == (f"no checkpoint at {ckpt}, but a save that was killed half way left the previous "
                              f"one at {tmp_path / '.ckpt.old-1a2b3c4d'}: move it back "
                              f"(mv '{tmp_path / '.ckpt.old-1a2b3c4d'}' '{ckpt}')")
    assert_same_model(a, checkpoint.load(tmp_path / ".ckpt.old-1a2b3c4d"))  # it is intact
    (tmp_path / ".other.tmp-keep").mkdir()  # another checkpoint's temporary folder is not ours to clear
    checkpoint.save(b, ckpt)
    assert sorted(os.listdir(tmp_path)) == [".other.tmp-keep", "ckpt"]
    assert_same_model(b, checkpoint.load(ckpt))
