"""The file contract (`sprout.files.weightfiles`): every file we read is a regular file inside its folder, refused
before it is opened otherwise, and tampered JSON is named by file and field; tuned lenses are replaced
only when both files are ours. Named pipes are watched by a process that unblocks any reader, so a
regression fails the test instead of hanging it."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import interp
from sprout import Sprout
from sprout.files import checkpoint, load_tokenizer
from sprout.files.hf import export, import_
from sprout.files.walkthrough_keys import from_walkthrough_state_dict
from sprout.files.weightfiles import file_in, read_json_file, regular_file
from sprout.tokenizer import char_tokenizer
from sprout.training.corpus import TokenDataset, input_files
from tests.conftest import TINY

# A process, not a thread: a reader in Rust (tokenizers, safetensors) may block in open() holding the GIL.
WATCH = """
import os, sys, time
path, mark = sys.argv[1], sys.argv[2]
while True:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # succeeds only while a reader has it open
        open(mark, "w").close()
        os.close(fd)  # the reader gets EOF
    except OSError:  # ENXIO: nobody is reading, as it should be
        pass
    time.sleep(0.05)
"""


class Pipe:
    """A named pipe at `path`, watched by a child process that opens its write end whenever a reader
    has it open and closes it at once, so a reader that opened it gets EOF instead of hanging."""

    def __init__(self, path):
        self.path, self._mark = Path(path), Path(f"{path}.opened")
        os.mkfifo(path)
        self._child = subprocess.Popen([sys.executable, "-c", WATCH, str(path), str(self._mark)])

    @property
    def opened(self) -> bool:
        return self._mark.exists()

    def close(self):
        self._child.kill()
        self._child.wait()


@pytest.fixture
def pipes():
    made = []
    yield lambda path: made.append(Pipe(path)) or made[-1]
    for p in made:
        p.close()


def refused(pipe, call, *words):
    """`call()` raises a ValueError naming the pipe (and `words`) without ever opening it."""
    with pytest.raises(ValueError) as err:
        call()
    assert not pipe.opened, f"{pipe.path} was opened"
    msg = str(err.value)
    assert str(pipe.path) in msg and "named pipe" in msg and all(w in msg for w in words), msg
    return msg


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Sprout(TINY, tokenizer=char_tokenizer("abcdefgh ")).eval()


@pytest.fixture
def ckpt(tmp_path, model):
    return checkpoint.save(model, tmp_path / "ckpt")


@pytest.fixture
def hf(tmp_path, model):
    return export(model, tmp_path / "hf")


def shard(hf_dir, folder, split_at=1):
    """Write hf_dir's weights into `folder` as two shards and an index; returns the index path."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = load_file(hf_dir / "model.safetensors")
    names = sorted(tensors)
    parts = {"a.safetensors": names[:split_at], "b.safetensors": names[split_at:]}
    for f, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, folder / f)
    (folder / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}))
    return index


# --- pipes, devices, sockets: refused before opening -------------------------------------------------

def test_load_refuses_a_pipe_given_as_the_weights(tmp_path, pipes):
    for name in ("w.safetensors", "w.pt"):
        p = pipes(tmp_path / name)
        refused(p, lambda: checkpoint.load(p.path), "checkpoint file")


def test_load_refuses_pipes_inside_a_checkpoint_folder(tmp_path, ckpt, pipes):
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        for f in ("config.json", "tokenizer.json", "model.safetensors"):
            if f != name:
                (folder / f).write_bytes((ckpt / f).read_bytes())
        p = pipes(folder / name)
        refused(p, lambda: checkpoint.load(folder), name)


def test_a_tokenizer_or_walkthrough_file_that_is_a_pipe_is_refused(tmp_path, ckpt, pipes):
    p = pipes(tmp_path / "tok.json")
    refused(p, lambda: checkpoint.load(ckpt, tokenizer=p.path), "tokenizer")
    q = pipes(tmp_path / "walk.pt")
    refused(q, lambda: from_walkthrough_state_dict(q.path))


def test_import_hf_refuses_pipes_for_config_weights_index_and_shards(tmp_path, hf, pipes):
    for name in ("config.json", "model.safetensors"):
        folder = tmp_path / f"hf_{name}"
        folder.mkdir()
        other = {"config.json", "model.safetensors"} - {name}
        for f in other:
            (folder / f).write_bytes((hf / f).read_bytes())
        p = pipes(folder / name)
        refused(p, lambda: import_(folder), name)
    sharded = tmp_path / "sharded"
    index = shard(hf, sharded)
    os.remove(sharded / "b.safetensors")
    p = pipes(sharded / "b.safetensors")
    msg = refused(p, lambda: import_(sharded), "shard")
    assert str(index) in msg
    os.remove(index)
    q = pipes(index)
    refused(q, lambda: import_(sharded), "model.safetensors.index.json")


def test_import_hf_cli_on_a_pipe_is_one_line(tmp_path, hf, pipes, capsys):
    from sprout.files.hf import import_main

    os.remove(hf / "model.safetensors")
    p = pipes(hf / "model.safetensors")
    with pytest.raises(SystemExit) as err:
        import_main([str(hf), str(tmp_path / "out")])
    assert not p.opened
    assert str(err.value).startswith("sprout import-hf: ") and "named pipe" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_tuned_lens_files_and_data_that_are_pipes_are_refused(tmp_path, model, pipes):
    interp.TunedLens(model).save(tmp_path / "lens")
    os.remove(tmp_path / "lens" / "tuned_lens.json")
    p = pipes(tmp_path / "lens" / "tuned_lens.json")
    refused(p, lambda: interp.TunedLens.load(model, tmp_path / "lens"), "tuned-lens file")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello")
    q = pipes(data / "b.txt")
    refused(q, lambda: input_files(data), "--data")


def test_token_and_tokenizer_files_that_are_pipes_are_refused(tmp_path, pipes):
    p = pipes(tmp_path / "train.bin")
    refused(p, lambda: TokenDataset(p.path, context=8), "token file")
    q = pipes(tmp_path / "tokenizer.json")
    refused(q, lambda: load_tokenizer(q.path), "tokenizer file")


def test_a_device_is_refused_by_name():
    with pytest.raises(ValueError, match=r"/dev/null is not a file but a character device"):
        regular_file("/dev/null", "weights file")
    with pytest.raises(ValueError, match=r"/dev/zero is not a file but a character device"):
        checkpoint.load("/dev/zero")


# --- files named by a folder stay inside it -------------------------------------------------------

@pytest.mark.parametrize("name", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/../../outside.safetensors"])
def test_a_shard_path_that_leaves_the_folder_is_refused(tmp_path, hf, name):
    folder = tmp_path / "sharded"
    index = shard(hf, folder)
    save_file({"x": torch.zeros(1)}, tmp_path / "outside.safetensors")
    m = json.loads(index.read_text())
    first = sorted(m["weight_map"])[0]
    m["weight_map"][first] = name
    index.write_text(json.dumps(m))
    with pytest.raises(ValueError) as err:
        import_(folder)
    msg = str(err.value)
    assert str(index) in msg and repr(first) in msg and name in msg and "outside the folder" in msg


def test_a_shard_that_links_out_of_the_folder_is_refused_but_a_hub_snapshot_loads(tmp_path, hf, model):
    folder = tmp_path / "sharded"
    shard(hf, folder)
    elsewhere = tmp_path / "elsewhere.safetensors"
    os.replace(folder / "b.safetensors", elsewhere)
    os.symlink(elsewhere, folder / "b.safetensors")
    with pytest.raises(ValueError, match=rf"b\.safetensors: the shard is a link to {elsewhere}, outside {folder}"):
        import_(folder)
    # the Hugging Face hub cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
    repo = tmp_path / "models--me--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(("config.json", "model.safetensors", "tokenizer.json")):
        (blobs / f"blob{i}").write_bytes((hf / f).read_bytes())
        os.symlink(f"../../blobs/blob{i}", snap / f)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(import_(snap)(ids)[0], model(ids)[0])


def test_sharded_weights_load_equal_and_an_index_that_lies_is_refused(tmp_path, hf, model):
    folder = tmp_path / "sharded"
    index = shard(hf, folder, split_at=3)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(import_(folder)(ids)[0], model(ids)[0])
    m = json.loads(index.read_text())
    moved = sorted(m["weight_map"])[0]  # a tensor that lives in a.safetensors, said to be in b
    m["weight_map"][moved] = "b.safetensors"
    index.write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"a\.safetensors does not hold what model\.safetensors\.index\.json says"):
        import_(folder)
    tensors = load_file(folder / "a.safetensors")
    save_file({**load_file(folder / "b.safetensors"), moved: tensors[moved]}, folder / "b.safetensors")
    m["weight_map"][moved] = "a.safetensors"
    index.write_text(json.dumps(m))
    with pytest.raises(ValueError, match=rf"tensor '{moved}' is also in a\.safetensors"):
        import_(folder)


def test_a_checkpoint_file_linking_out_of_its_folder_is_refused(tmp_path, ckpt):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"family": "sprout", **TINY.to_dict()}))
    os.replace(ckpt / "config.json", tmp_path / "old.json")
    os.symlink(secret, ckpt / "config.json")
    with pytest.raises(ValueError, match=rf"config\.json is a link to {secret}, outside {ckpt}"):
        checkpoint.load(ckpt)
    os.remove(ckpt / "config.json")
    os.symlink("config2.json", ckpt / "config.json")  # a link inside the folder is fine
    (ckpt / "config2.json").write_bytes((tmp_path / "old.json").read_bytes())
    assert isinstance(checkpoint.load(ckpt), Sprout)


def test_data_files_linking_out_of_the_data_folder_are_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello")
    (tmp_path / "private.txt").write_text("not for training")
    os.symlink(tmp_path / "private.txt", data / "b.txt")
    with pytest.raises(ValueError, match=r"--data: .*b\.txt: the text file is a link to .*private\.txt, outside"):
        input_files(data)


def test_file_in_refuses_names_that_are_not_relative_file_names(tmp_path):
    for name in ("", "/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(ValueError, match="outside the folder|not a file name"):
            file_in(tmp_path, name, "shard")
    with pytest.raises(ValueError, match="not a file name"):
        file_in(tmp_path, 5, "shard")


# --- tampered JSON: named by file and field -------------------------------------------------------

def test_tampered_checkpoint_config_names_the_file_and_field(ckpt):
    config = ckpt / "config.json"
    good = json.loads(config.read_text())
    cases = {
        "[" * 100_000 + "]" * 100_000: "nested too deeply",
        json.dumps(good).replace('"context": 64', '"context": ' + "9" * 5000): "4300 digits",
        json.dumps(good).replace('"context": 64', '"context": ' + "9" * 4000): "field 'context'",
        json.dumps(good).replace('"context": 64', '"context": NaN'): "NaN is not a JSON number",
        json.dumps(good).replace('"context": 64', '"context": Infinity'): "Infinity is not a JSON number",
    }
    for text, words in cases.items():
        config.write_text(text)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "config.json disagrees with the config inside": said, then refused
            with pytest.raises(ValueError) as err:
                checkpoint.load(ckpt)
        assert type(err.value) is ValueError and str(config) in str(err.value) and words in str(err.value), str(err.value)
        assert len(str(err.value)) < 1000  # a 4000-digit number is shortened, not printed


@pytest.mark.parametrize("field,value,words", [
    ("vocab_size", "256", "field 'vocab_size' is str '256', expected an integer"),
    ("num_hidden_layers", 10**30, "field 'num_hidden_layers' is int 1000000000000000000000000000000"),
    ("rope_parameters", [1], "field 'rope_parameters' is list [1], expected an object or null"),
    ("rope_scaling", "linear", "field 'rope_scaling' is str 'linear'"),
    ("layer_types", 3, "field 'layer_types' is int 3, expected a list"),
    ("layer_types", ["full_attention", {}], "layer_types is ['full_attention', {}]; expected a list of strings"),
    ("rms_norm_eps", "1e-6", "field 'rms_norm_eps' is str '1e-6', expected a finite number"),
    ("tie_word_embeddings", "yes", "field 'tie_word_embeddings' is str 'yes', expected true or false"),
])
def test_tampered_hf_config_names_the_file_and_field(hf, field, value, words):
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError) as err:
        import_(hf)
    assert str(hf / "config.json") in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("index,words", [
    ({"weight_map": [1, 2]}, "field 'weight_map' is list [1, 2], expected an object"),
    ({"weight_map": {"model.norm.weight": 5}}, "field 'weight_map': field 'model.norm.weight' is int 5, expected a string"),
    ({"weight_map": {}}, "field 'weight_map' is missing or empty"),
    ({"metadata": 3, "weight_map": {"a": "a.safetensors"}}, "field 'metadata' is int 3"),
])
def test_tampered_shard_index_names_the_file_and_field(tmp_path, hf, index, words):
    folder = tmp_path / "sharded"
    path = shard(hf, folder)
    path.write_text(json.dumps(index))
    with pytest.raises(ValueError) as err:
        import_(folder)
    assert str(path) in str(err.value) and words in str(err.value), str(err.value)
    path.write_text('{"a": ' * 50_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        import_(folder)


@pytest.mark.parametrize("key", ["auto_map", "trust_remote_code"])
def test_custom_code_in_an_hf_config_is_refused_by_name(hf, key):
    config = json.loads((hf / "config.json").read_text())
    value = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"} if key == "auto_map" else True
    (hf / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(ValueError, match=rf"config\.json: .*declares code of its own \({key}="):
        import_(hf)


def test_read_json_file_bounds_size_and_names_fields(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"step": "7", "ok": 1}))
    with pytest.raises(ValueError, match=rf"{path}: field 'step' is str '7', expected an integer"):
        read_json_file(path, fields={"step": "int", "ok": "int"})
    path.write_text("[1]")
    with pytest.raises(ValueError, match=rf"{path}: expected a JSON object, got list"):
        read_json_file(path)
    with open(path, "wb") as f:  # sparse, no disk used
        f.truncate(65 << 20)
    with pytest.raises(ValueError, match="larger than 64 MiB"):
        read_json_file(path)


# --- tuned lenses ---------------------------------------------------------------------------------

def test_a_lens_replaces_only_its_own_two_files(tmp_path, model):
    lens = interp.TunedLens(model)
    folder = tmp_path / "lens"
    lens.save(folder)
    weights = folder / "tuned_lens.safetensors"
    save_file({"mine": torch.ones(2)}, weights)  # the user's safetensors under our name, our JSON beside it
    before = weights.read_bytes()
    with pytest.raises(FileExistsError, match=rf"{weights} exists and is not a tuned lens written here"):
        lens.save(folder)
    assert weights.read_bytes() == before
    lens.save(tmp_path / "lens2")
    (tmp_path / "lens2" / "tuned_lens.json").write_text('{"my": "notes"}')  # our weights, the user's JSON
    with pytest.raises(FileExistsError, match=r"tuned_lens\.json exists and is not a tuned lens written here"):
        lens.save(tmp_path / "lens2")
    assert json.loads((tmp_path / "lens2" / "tuned_lens.json").read_text()) == {"my": "notes"}
    lens.save(tmp_path / "lens3")
    lens.translators[0].bias.data.fill_(0.5)
    lens.save(tmp_path / "lens3")  # both ours: replaced
    assert torch.equal(interp.TunedLens.load(model, tmp_path / "lens3").translators[0].bias, lens.translators[0].bias)
    user = tmp_path / "notes.txt"
    user.write_text("mine")
    with pytest.raises(FileExistsError, match=rf"{user} is a file"):
        lens.save(user)
    assert user.read_text() == "mine"


def test_a_lens_with_integer_or_nan_tensors_is_refused_or_warned(tmp_path, model):
    lens = interp.TunedLens(model)
    path = lens.save(tmp_path / "lens")
    meta = json.loads((tmp_path / "lens" / "tuned_lens.json").read_text())
    del meta["weights_sha256"]  # hand-edited tensors: the sha256 check is its own test
    (tmp_path / "lens" / "tuned_lens.json").write_text(json.dumps(meta))
    tensors = load_file(path)
    save_file({**tensors, "translators.0.bias": tensors["translators.0.bias"].long()}, path, metadata={"format": "sprout-tuned-lens"})
    with pytest.raises(ValueError, match=r"translators\.0\.bias \(torch\.int64\)"):
        interp.TunedLens.load(model, tmp_path / "lens")
    nan = tensors["translators.1.weight"].clone()
    nan[0, 0] = float("nan")
    save_file({**tensors, "translators.1.weight": nan}, path, metadata={"format": "sprout-tuned-lens"})
    with pytest.warns(UserWarning, match=r"non-finite .* translators\.1\.weight"):
        interp.TunedLens.load(model, tmp_path / "lens")


def test_a_lens_whose_two_files_come_from_different_saves_is_refused(tmp_path, model):
    a, b = interp.TunedLens(model), interp.TunedLens(model)
    b.translators[0].bias.data.fill_(1.0)
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    os.replace(tmp_path / "b" / "tuned_lens.safetensors", tmp_path / "a" / "tuned_lens.safetensors")
    with pytest.raises(ValueError, match=r"is not the file its tuned_lens\.json was saved with"):
        interp.TunedLens.load(model, tmp_path / "a")


@pytest.mark.parametrize("field,value,words", [
    ("step", "150", "field 'step' is str '150', expected an integer"),
    ("step", 10**40, "field 'step' is int"),
    ("model_config", [1], "field 'model_config' is list [1], expected an object"),
    ("fingerprint", 5, "field 'fingerprint' is int 5, expected a string"),
])
def test_a_tampered_lens_json_names_the_file_and_field(tmp_path, model, field, value, words):
    interp.TunedLens(model).save(tmp_path / "lens")
    path = tmp_path / "lens" / "tuned_lens.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(ValueError) as err:
        interp.TunedLens.load(model, tmp_path / "lens")
    assert str(path) in str(err.value) and words in str(err.value), str(err.value)
    path.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        interp.TunedLens.load(model, tmp_path / "lens")


def test_a_lens_with_nan_in_its_info_saves_as_json_null(tmp_path, model):
    lens = interp.TunedLens(model)
    lens.info = {"held_out_kl": [float("nan"), 1.5]}
    lens.save(tmp_path / "lens")
    assert "NaN" not in (tmp_path / "lens" / "tuned_lens.json").read_text()
    assert interp.TunedLens.load(model, tmp_path / "lens").info["held_out_kl"] == [None, 1.5]
