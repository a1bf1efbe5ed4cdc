"""`python -m interp.saes.training`: flags generated from TrainSettings, a run equal to train_sae's with the
same settings, and bad input refused in one line before any training."""
from dataclasses import fields

import pytest
import torch

from interp import SAE
from interp.saes.settings import TrainSettings
from interp.saes.training import cli, train_sae
from sprout.files import load
from sprout.settings import field_comments

H0 = "blocks.0.hook_resid_post"
TEXT = "Once upon a time there was a little cat. The cat liked to play in the sun with a red ball. " * 8
FLAGS = ["--d-sae", "16", "--k", "4", "--steps", "3", "--batch-size", "64", "--seq-len", "16",
         "--buffer-tokens", "256", "--no-progress"]


def test_every_settings_field_is_a_flag_with_its_comment_as_help():
    helps = {a.dest: a.help for a in cli.parser()._actions}
    comments = field_comments(TrainSettings)
    for f in fields(TrainSettings):
        if f.name != "widths":  # a tuple: the API's
            assert helps[f.name] == comments[f.name], f.name


def test_the_command_saves_what_train_sae_trains(tmp_path):
    text = tmp_path / "own.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert cli.main(["gpt-1", "--hook", H0, "--out", str(tmp_path / "sae"), "--text-file", str(text), *FLAGS]) == 0
    saved = SAE.load(tmp_path / "sae")
    direct = train_sae(load("gpt-1"), H0, data=TEXT, d_sae=16, k=4, steps=3, batch_size=64, seq_len=16,
                       buffer_tokens=256, progress=False)
    assert saved.kind == "topk" and saved.k == 4 and saved.d_sae == 16
    for name, t in direct.state_dict().items():
        assert torch.equal(saved.state_dict()[name], t), name


@pytest.mark.parametrize("flag,value,words", [("--kind", "nope", "expected 'batchtopk' or 'jumprelu'"),
                                              ("--d-sae", "0", "expected a whole number >= 1, got 0"),
                                              ("--lr", "nan", "expected a finite number")])
def test_a_setting_out_of_its_range_is_a_usage_error_naming_the_flag(tmp_path, capsys, flag, value, words):
    with pytest.raises(SystemExit) as err:
        cli.main(["gpt-1", "--hook", H0, "--out", str(tmp_path / "sae"), flag, value])
    assert err.value.code == 2 and f"argument {flag}: {words}" in capsys.readouterr().err


def test_bad_settings_together_or_text_are_one_line(tmp_path, capsys):
    for argv, words in ((["--hook", H0, "--skip"], "skip is for transcoders"),
                        (["--hook", H0, "--text-file", "/no/such/file.txt"], "--text-file /no/such/file.txt")):
        assert cli.main(["gpt-1", "--out", str(tmp_path / "sae"), *FLAGS[4:], *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("python -m interp.saes.training: error:") and words in err and err.count("\n") == 1


def test_an_out_folder_of_someone_elses_is_refused_before_the_model_loads(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert cli.main([str(tmp_path / "no-such-model"), "--hook", H0, "--out", str(tmp_path / "mine")]) == 1
    assert "--out" in capsys.readouterr().err and (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
