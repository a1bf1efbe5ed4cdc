"""Nothing of the user's is deleted: save, export-hf and import-hf replace only a folder they can show
they wrote; anything else is refused with the path and the files that would have been lost. A single
file is replaced all or nothing (`replace_file`, the one atomic write)."""
import errno
import json
import os
import stat

import pytest
import torch

from sprout import Sprout
from sprout.files import checkpoint
from sprout.files.folders import NotOursError, is_temp_sibling, replace_file
from sprout.files.hf import export, export_main, import_, import_main
from sprout.tokenizer import char_tokenizer
from tests.conftest import TINY


def model(seed=0):
    torch.manual_seed(seed)
    m = Sprout(TINY).eval()
    m.tokenizer = char_tokenizer("abcdefgh ")
    return m


def tree(folder):
    """{relative path: bytes} of every file below `folder`."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def project(tmp_path):
    """A user's folder that merely holds a config.json, beside a thesis and a data folder."""
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"lr": 0.1}))
    (folder / "thesis.tex").write_text("\\section{Results}")
    (folder / "data" / "train.txt").write_text("hello")
    return folder


def test_save_refuses_a_project_folder_naming_what_would_be_lost(tmp_path):
    folder = project(tmp_path)
    before = tree(folder)
    with pytest.raises(NotOursError) as err:
        checkpoint.save(model(), folder)
    msg = str(err.value)
    assert str(folder) in msg and "thesis.tex" in msg and "data/" in msg
    assert isinstance(err.value, FileExistsError) and isinstance(err.value, ValueError)
    assert tree(folder) == before
    assert sorted(os.listdir(tmp_path)) == ["project"]  # no temporary folder left beside it


def test_save_refuses_a_folder_of_only_checkpoint_names_that_is_not_ours(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))  # no "family": not ours
    with pytest.raises(NotOursError, match="config.json"):
        checkpoint.save(model(), folder)
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "qwen3"}


def test_save_replaces_its_own_checkpoint(tmp_path):
    a, b = model(0), model(1)
    checkpoint.save(a, tmp_path / "ckpt")
    checkpoint.save(b, tmp_path / "ckpt")
    loaded = checkpoint.load(tmp_path / "ckpt")
    assert torch.equal(loaded.embed.weight, b.embed.weight)
    assert os.listdir(tmp_path) == ["ckpt"]


def test_export_then_import_onto_the_same_folder_keeps_the_hf_files(tmp_path, capsys):
    base, hf = tmp_path / "base", tmp_path / "hf"
    checkpoint.save(model(), base)
    assert export_main([str(base), str(hf)]) == 0
    (hf / "README.md").write_text("# my model card")
    before = tree(hf)
    with pytest.raises(SystemExit) as err:  # one line, no traceback
        import_main([str(hf), str(hf)])
    msg = str(err.value)
    assert msg.startswith(f"sprout import-hf: refusing to replace {hf}")
    assert "README.md" in msg and "tokenizer_config.json" in msg
    assert tree(hf) == before
    with pytest.raises(SystemExit, match="README.md"):  # --overwrite replaces only an export of ours
        export_main([str(base), str(hf), "--overwrite"])
    assert tree(hf) == before
    with pytest.raises(NotOursError, match="README.md"):
        checkpoint.save(import_(hf), hf)


def test_export_overwrite_replaces_its_own_export_only(tmp_path):
    hf = tmp_path / "hf"
    export(model(0), hf)
    export(model(1), hf, overwrite=True)
    assert sorted(os.listdir(hf)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    downloaded = tmp_path / "downloaded"
    downloaded.mkdir()
    for name in ("config.json", "model.safetensors"):  # our file names, but not our export
        (downloaded / name).write_bytes((hf / name).read_bytes() if name == "config.json" else b"\0" * 16)
    with pytest.raises(NotOursError, match="config.json, model.safetensors"):
        export(model(), downloaded, overwrite=True)


def test_save_onto_a_symlink_keeps_the_link_and_leaves_nothing_behind(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    checkpoint.save(model(0), real)
    link.symlink_to(real, target_is_directory=True)
    b = model(1)
    checkpoint.save(b, link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert torch.equal(checkpoint.load(link).embed.weight, b.embed.weight)
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]  # no dangling .old-* or .tmp-*


def test_saved_files_get_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        checkpoint.save(model(), tmp_path / "ckpt")
        export(model(), tmp_path / "hf")
    finally:
        os.umask(old)
    for folder in (tmp_path / "ckpt", tmp_path / "hf"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
        assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o644}


def test_a_file_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "ckpt").write_text("my notes")
    with pytest.raises(NotOursError, match="a file is there"):
        checkpoint.save(model(), tmp_path / "ckpt")
    assert (tmp_path / "ckpt").read_text() == "my notes"


def test_leftovers_of_a_killed_save_are_cleaned_only_when_ours(tmp_path):
    checkpoint.save(model(), tmp_path / "ckpt")
    ours = tmp_path / ".ckpt.tmp-dead0001"
    ours.mkdir()
    (ours / "model.safetensors").write_bytes(b"half")
    theirs = tmp_path / ".ckpt.old-mine"
    theirs.mkdir()
    (theirs / "diary.txt").write_text("keep")
    checkpoint.save(model(1), tmp_path / "ckpt")
    assert not ours.exists()
    assert (theirs / "diary.txt").read_text() == "keep"


def test_replace_file_leaves_the_old_file_or_the_new_one_and_nothing_else(tmp_path):
    target = tmp_path / "table.md"
    target.write_bytes(b"old")

    def half_then_disk_full(f):
        f.write(b"new, ha")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        replace_file(target, half_then_disk_full)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["table.md"]
    assert replace_file(target, lambda f: f.write(b"new")) == target and target.read_bytes() == b"new"
    replace_file(target, b"bytes")
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_bytes() == b"bytes" and os.listdir(tmp_path) == ["table.md"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_only_replace_files_own_temporary_names_count_as_its_debris():
    assert is_temp_sibling(".run.json.tmp-0123abcd", "run.json")
    assert not any(is_temp_sibling(e, "run.json") for e in
                   ("run.json.tmp", ".run.json.tmp-notes.txt", ".run.json.tmp-0123ABCD", ".log.tmp-0123abcd", ".run.json.tmp-"))
