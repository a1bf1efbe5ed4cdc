"""`sprout lens / heads / rms` (interp.cli) and the `sprout` command's table (sprout_cli)."""
import re
from pathlib import Path

import pytest
import torch

import interp
import sprout
import sprout_cli
from interp import cli
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus
from sprout.tokenizer import encode, train_bpe

CFG = SproutConfig(vocab_size=300, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64)
LONG = "Zorbin Plax met Mira by the river. Then Zorbin Plax and Mira walked home over the old bridge together."


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    torch.manual_seed(0)
    tok = train_bpe(generate_corpus(15_000, seed=3) + " Zorbin Plax", vocab_size=CFG.vocab_size)
    path = tmp_path_factory.mktemp("cli") / "tiny"
    sprout.save(Sprout(CFG, tokenizer=tok), path)
    return str(path)


def test_lens_prints_one_line_per_token_of_a_short_text(spec, capsys):
    assert cli.lens_main(["Zorbin Plax met Mira.", "--model", spec]) == 0
    lines = capsys.readouterr().out.splitlines()
    n_tokens = len(sprout.load(spec).to_tokens("Zorbin Plax met Mira.")[0])
    assert len(lines) == n_tokens + 3 and lines[0].split()[2:] == ["emb", "L1", "L2"]
    assert not any(line.startswith("window") for line in lines)


def test_lens_shows_every_window_of_a_text_longer_than_the_context(spec, capsys):
    """Every token of the text appears once, in order, under a header naming its window."""
    model = sprout.load(spec)
    n = len(encode(model.tokenizer, LONG))
    assert n > 2 * CFG.context
    assert cli.lens_main([LONG, "--model", spec]) == 0
    out = capsys.readouterr().out
    n_windows = -(-n // CFG.context)
    headers = re.findall(r"^window (\d+) of (\d+): tokens (\d+)\.\.(\d+)", out, re.M)
    assert [(int(a), int(b)) for a, b, _, _ in headers] == [(i + 1, n_windows) for i in range(n_windows)]
    assert int(headers[-1][3]) == n - 1 and int(headers[0][2]) == 0
    positions = [int(m) for m in re.findall(r"^\s*(\d+) \S", out, re.M)]
    assert positions == list(range(n))


def test_heads_and_rms_print_their_tables(spec, capsys):
    assert cli.heads_main(["--model", spec, "--kind", "previous_token", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 + 3 and re.match(r"\s+1 L\dH\d", out[3])
    assert cli.rms_main(["--model", spec, "--chars", "2000"]) == 0
    out = capsys.readouterr().out
    assert "blocks.1.hook_resid_post" in out and "blocks.0.hook_resid_mid" in out


def test_the_sprout_command_dispatches_to_each_main(spec, capsys):
    assert sprout_cli.main([]) == 0 and "lens" in capsys.readouterr().out
    assert sprout_cli.main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    assert sprout_cli.main(["lens", "Zorbin Plax", "--model", spec]) == 0
    assert sprout_cli.COMMANDS["lens"][0] is sprout_cli.lens_main
    assert set(sprout_cli.COMMANDS) == {"train", "export-hf", "import-hf", "lens", "heads", "rms"}


def test_lens_tuned_reads_the_lens_beside_the_checkpoint(spec, capsys, tmp_path):
    with pytest.raises(SystemExit, match="no tuned lens beside"):
        cli.lens_main(["Zorbin Plax met Mira.", "--model", spec, "--tuned"])
    model = sprout.load(spec)
    lens = interp.TunedLens(model)
    with torch.no_grad():
        lens.translators[0].bias.copy_(model.embed.weight[7] * 50)  # the embedding row now reads as token 7
    lens.save(spec)
    assert cli.lens_main(["Zorbin Plax met Mira.", "--model", spec, "--tuned"]) == 0
    out = capsys.readouterr().out
    want = interp.tuned_lens(model, "Zorbin Plax met Mira.", lens, k=1)
    emb = want[want.layer == 0].sort_values("pos").top_tokens.str[0].tolist()
    assert "(tuned lens)" in out and emb.count(emb[0]) == len(emb)
    rows = [l.split() for l in out.splitlines()[2:2 + len(emb)]]
    assert all(r[2].startswith(cli._tok(emb[0], 8)[:3]) for r in rows)
    for f in ("tuned_lens.safetensors", "tuned_lens.json"):
        (Path(spec) / f).unlink()


@pytest.mark.parametrize("command,flag", [("train", "--recipe"), ("export-hf", "out_dir"), ("import-hf", "hf_dir")])
def test_the_sprout_command_reaches_training_and_the_hugging_face_bridge(command, flag, capsys):
    with pytest.raises(SystemExit) as e:
        sprout_cli.main([command, "--help"])
    assert e.value.code == 0 and flag in capsys.readouterr().out


def test_sprout_help_imports_neither_torch_nor_the_commands():
    """`sprout --help` answers without loading torch, TransformerLens or any command's module."""
    import subprocess
    import sys

    code = ("import sys, sprout_cli; sprout_cli.main(['--help']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformer_lens', 'interp', 'sprout')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: sprout COMMAND" in out and out.strip().endswith("[]"), out
