"""A config.json that lies about the size of the model is refused before any module is built, naming the
field and the file; integer weights are refused naming the keys; a bad config names its field."""
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from sprout import Sprout, SproutConfig
from sprout import model as model_module
from sprout.files import checkpoint
from sprout.files.hf import export, import_
from tests.conftest import TINY


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "ckpt"
    checkpoint.save(Sprout(TINY), path)
    return path


@pytest.fixture
def blocks_built(monkeypatch):
    """How many transformer blocks were constructed off the meta device (where memory is spent)."""
    built = []
    real = model_module.Block.__init__

    def counting(self, cfg, *args, **kwargs):
        real(self, cfg, *args, **kwargs)
        if self.norm1.weight.device.type != "meta":
            built.append(cfg)

    monkeypatch.setattr(model_module.Block, "__init__", counting)
    return built


def edit_config(path, **fields):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))


@pytest.mark.parametrize("field, value", [("n_layer", 20_000), ("n_layer", 10**6), ("d_model", 10**7),
                                          ("vocab_size", 10**9), ("d_ff", 10**9)])
def test_a_config_far_larger_than_the_weights_is_refused_before_building(saved, blocks_built, field, value):
    edit_config(saved, **{field: value, **({"n_head": 10} if field == "d_model" else {})})
    with pytest.warns(UserWarning, match="disagrees with the config saved inside"):
        with pytest.raises(ValueError) as err:
            checkpoint.load(saved)
    msg = str(err.value)
    assert str(saved / "model.safetensors") in msg and f"{field}={value}" in msg
    assert blocks_built == []  # no block of the claimed model (or of any other) was built for real
    assert len(msg) < 20_000  # the error lists what is there, not a million missing keys


def test_a_huge_context_is_refused_naming_the_field(saved, blocks_built):
    edit_config(saved, context=10**9)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"config field context=1000000000 .*GiB of RoPE"):
        checkpoint.load(saved)
    assert blocks_built == []


def test_a_huge_hf_config_is_refused_naming_the_field(tmp_path):
    torch.manual_seed(0)
    export(Sprout(TINY), tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**6}))
    with pytest.raises(ValueError, match=r"num_hidden_layers=1000000, but the weights hold 2 layer"):
        import_(tmp_path / "hf")


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, torch.bool])
@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_integer_weights_are_refused_naming_the_keys(tmp_path, dtype, fmt):
    torch.manual_seed(0)
    sd = {k: v.clone() for k, v in Sprout(TINY).state_dict().items() if k != "head.weight"}
    for key in ("blocks.0.attn.qkv.weight", "norm.weight"):
        sd[key] = (sd[key] * 100).to(dtype)
    path = tmp_path / f"m.{fmt}"
    if fmt == "pt":
        torch.save({"model": sd, "config": TINY.to_dict()}, path)
    else:
        save_file(sd, str(path), metadata={"config": json.dumps({"family": "sprout", **TINY.to_dict()})})
    with pytest.raises(ValueError) as err:
        checkpoint.load(path)
    msg = str(err.value)
    assert str(path) in msg and "2 weight(s) are not floating point" in msg
    assert f"blocks.0.attn.qkv.weight ({dtype})" in msg and f"norm.weight ({dtype})" in msg


@pytest.mark.parametrize("value, why", [("10000", "finite number > 1"), (float("inf"), "finite number > 1"),
                                        (True, "finite number > 1"), (0.5, "finite number > 1")])
def test_rope_base_of_the_wrong_type_or_range_is_refused(saved, value, why):
    config = json.loads((saved / "config.json").read_text())
    text = json.dumps({**config, "rope_base": value}).replace("Infinity", "1e999")
    (saved / "config.json").write_text(text)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=rf"config.json.*rope_base must be a {why}"):
        checkpoint.load(saved)
    with pytest.raises(ValueError, match="rope_base"):
        SproutConfig(**{**TINY.to_dict(), "rope_base": value})


@pytest.mark.filterwarnings("ignore:.*disagrees with the config saved inside")
@pytest.mark.parametrize("field, value", [("n_layer", 2.0), ("n_head", "4"), ("vocab_size", None), ("d_ff", -1)])
def test_other_fields_of_the_wrong_type_name_the_field(saved, field, value):
    edit_config(saved, **{field: value})
    with pytest.raises(ValueError, match=rf"config.json.*SproutConfig\.{field} must be"):
        checkpoint.load(saved)


def test_a_deeply_nested_config_names_the_file(saved, tmp_path):
    (saved / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"cannot read .*config\.json: its JSON is nested too deeply"):
        checkpoint.load(saved)
    torch.manual_seed(0)
    export(Sprout(TINY), tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ValueError, match=r"hf/config\.json: its JSON is nested too deeply"):
        import_(tmp_path / "hf")


def test_a_tokenizer_json_that_is_a_folder_is_an_error(saved, tmp_path):
    (saved / "tokenizer.json").mkdir()
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a file"):
        checkpoint.load(saved)
    torch.manual_seed(0)
    export(Sprout(TINY), tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").mkdir()
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a file"):
        import_(tmp_path / "hf")


def test_both_weight_files_in_one_folder_say_which_is_read(saved):
    torch.manual_seed(1)
    other = Sprout(TINY)
    torch.save({"model": other.state_dict(), "config": TINY.to_dict()}, saved / "model.pt")
    with pytest.warns(UserWarning, match=r"holds model\.safetensors and also model\.pt: reading model\.safetensors"):
        loaded = checkpoint.load(saved)
    assert not torch.equal(loaded.embed.weight, other.embed.weight)
    assert torch.equal(checkpoint.load(saved / "model.pt").embed.weight, other.embed.weight)


def test_a_bare_demo_name_means_the_demo(tmp_path, monkeypatch):
    demos = checkpoint.demo_names()
    if not demos:
        pytest.skip("no demo models shipped")
    name = demos[0]
    torch.manual_seed(0)
    checkpoint.save(Sprout(TINY), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match=rf"reads the shipped demo, not \./{name}"):
        demo = checkpoint.load(name)
    assert demo.cfg.d_vocab != TINY.vocab_size or demo.cfg.n_layers != TINY.n_layer
    local = checkpoint.load(f"./{name}")
    assert (local.cfg.d_vocab, local.cfg.n_layers) == (TINY.vocab_size, TINY.n_layer)


OOM = textwrap.dedent("""
    import json, resource, struct, sys
    from pathlib import Path
    from sprout.files import checkpoint
    path = Path(sys.argv[1])
    n = 1 << 29  # float32: a 2 GiB tensor, in a sparse file
    header = json.dumps({"big": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 4 * n)
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
    try:
        checkpoint.load(path)
    except MemoryError as e:
        print("MemoryError:", e)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_a_tensor_larger_than_memory_is_reported_as_out_of_memory(tmp_path):
    out = subprocess.run([sys.executable, "-c", OOM, str(tmp_path / "big.safetensors")], capture_output=True,
                         text=True, timeout=300)
    assert "MemoryError: out of memory reading" in out.stdout, out.stderr[-2000:]
    assert "big [536870912] F32, alone needs 2.00 GiB" in out.stdout
    assert "truncated or corrupt" not in out.stdout
