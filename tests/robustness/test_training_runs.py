"""The run directory as a careless or hostile user meets it (issue 13, items 2-6 and the training weak cases).

A new run never writes into a folder that is not a run of ours; two runs on one folder cannot interleave
(an OS lock, released even by SIGKILL); the data cache follows the files' content, not their stat();
--resume refuses changed data or another tokenizer; every recipe flag is range-checked before any work;
odd --out and --data values, damaged run files and Ctrl-C each end in one line that names the thing.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sprout.tokenizer import decode
from sprout.training import rundir
from sprout.training.cli import main, parse_args
from sprout.training.corpus import MAX_TEXT_BYTES, prepare_data
from sprout.training.loop import train
from sprout.training.recipes import get_recipe
from sprout.training.rundir import RunDir, RunLocked

ROOT = Path(__file__).resolve().parents[2]
TINY = get_recipe("tiny")
SHORT = ["--recipe", "tiny", "--max-steps", "10", "--ckpt-every", "10", "--eval-every", "10", "--eval-batches", "1",
         "--batch-size", "4", "--threads", "1", "--no-progress"]


def text_corpus(path: Path, words=("alpha", "beta", "gamma", "delta")) -> Path:
    path.write_text("\n\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(60)))
    return path


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    prepare_data(TINY, root)
    return root


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache):
    """A run of ten steps with one checkpoint."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main([*SHORT, "--out", str(out), "--data-cache", str(cache)]) == 0
    return out


def copy_run(finished, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out, ignore=shutil.ignore_patterns(rundir.LOCK))
    return out


# --- 2. a user's folder is never written into ------------------------------------------------------------

def test_a_new_run_refuses_a_users_folder_and_names_what_is_there(tmp_path, cache, capsys):
    folder = tmp_path / "project"
    (folder / "checkpoints" / "step_00000005").mkdir(parents=True)
    (folder / "thesis.tex").write_text("\\chapter{Mine}")
    (folder / "train_log.csv").write_text("step,my numbers\n1,2\n")
    (folder / "recipe.json").write_text('{"cake": "flour"}')
    (folder / "checkpoints" / "step_00000005" / "notes.txt").write_text("keep me")
    before = snapshot(folder)
    for extra in ([], ["--resume"]):
        assert main([*SHORT, "--out", str(folder), "--data-cache", str(cache), *extra]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(folder) in err and "not a sprout run directory" in err
        assert "thesis.tex" in err and "train_log.csv" in err and "checkpoints/" in err
        assert snapshot(folder) == before and sorted(os.listdir(folder)) == sorted(
            ["checkpoints", "thesis.tex", "train_log.csv", "recipe.json"])  # not even a lock file


def test_a_new_run_may_use_an_empty_folder_and_refuses_a_run_with_checkpoints(tmp_path, cache, finished, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*SHORT, "--out", str(empty), "--data-cache", str(cache)]) == 0
    out = copy_run(finished, tmp_path)
    before = snapshot(out)
    assert main([*SHORT, "--out", str(out), "--data-cache", str(cache)]) == 1
    assert "already holds checkpoints: pass --resume" in capsys.readouterr().err
    assert snapshot(out) == before


def test_a_run_killed_while_writing_run_json_starts_again_and_its_half_written_file_goes(tmp_path):
    """replace_file's temporary sibling of run.json (or of the log) is ours; a look-alike name is not."""
    out = tmp_path / "run"
    out.mkdir()
    (out / rundir.LOCK).write_text("")
    (out / ".run.json.tmp-0123abcd").write_text('{"format": "sprout-')
    (out / ".train_log.csv.tmp-89abcdef").write_text("step,tok")
    with RunDir(out) as run:
        run.open(resume=False)
    assert sorted(os.listdir(out)) == sorted([rundir.LOCK, rundir.MARKER])
    assert json.loads((out / rundir.MARKER).read_text())["format"] == rundir.FORMAT
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".run.json.tmp-my-notes").write_text("keep me")
    with pytest.raises(rundir.RunDirError, match="not a sprout run directory"):
        RunDir(mine).open(resume=False)
    assert os.listdir(mine) == [".run.json.tmp-my-notes"]


def test_pruning_deletes_only_what_a_checkpoint_is_made_of(tmp_path, finished):
    root = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        shutil.copytree(finished / "checkpoints" / "step_00000010", root / f"step_{step:08d}")
    (root / "step_00000010" / "my_notes.txt").write_text("mine")
    with pytest.warns(UserWarning, match="my_notes.txt"):
        rundir.prune(root, keep=set())
    assert os.listdir(root / "step_00000010") == ["my_notes.txt"]  # the checkpoint's files went, the note stayed
    assert sorted(os.listdir(root)) == ["step_00000010", "step_00000020", "step_00000030"]


# --- 3. one run per folder --------------------------------------------------------------------------------

def test_a_second_run_on_a_locked_folder_fails_at_once_and_sigkill_releases_the_lock(tmp_path, cache):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "sprout.train", *SHORT, "--max-steps", "100000", "--out", str(out),
           "--data-cache", str(cache)]
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / "checkpoints" / "step_00000010").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, "the first run ended early"
        second = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert f"another sprout train (PID {first.pid})" in second.stderr and str(out) in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first run is still going, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    with RunDir(out) as run:  # no stale lock: the kernel released it with the process
        run.lock()
        with pytest.raises(RunLocked, match=f"PID {os.getpid()}"):  # and it is exclusive
            RunDir(out).lock()


# --- 4. the data cache follows the content ----------------------------------------------------------------

@pytest.mark.parametrize("as_folder", [False, True])
def test_the_data_cache_sees_a_file_rewritten_with_the_same_size_and_time(tmp_path, as_folder):
    folder = tmp_path / "books"
    folder.mkdir()
    path = text_corpus(folder / "book.txt")
    recipe = TINY.override(data=str(folder if as_folder else path), tokenizer="char")
    first = prepare_data(recipe, tmp_path / "cache")
    stat = path.stat()
    path.write_text(path.read_text().replace("alpha", "omega"))  # same length
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    second = prepare_data(recipe, tmp_path / "cache")
    assert second.folder != first.folder
    text = decode(second.tokenizer, second.train.tolist())
    assert "omega" in text and "alpha" not in text
    assert prepare_data(recipe, tmp_path / "cache").folder == second.folder  # unchanged content: cached


def test_the_data_stamp_holds_each_files_name_size_and_hash(tmp_path):
    text_corpus(tmp_path / "a.txt")
    stamp = prepare_data(TINY.override(data=str(tmp_path), tokenizer="char"), tmp_path / "cache").stamp
    assert [f["name"] for f in stamp["files"]] == ["a.txt"]
    assert stamp["files"][0]["size"] == (tmp_path / "a.txt").stat().st_size and len(stamp["files"][0]["sha256"]) == 64
    assert stamp["tokenizer"] == "char"


# --- 5. resume checks the data and the tokenizer ----------------------------------------------------------

def test_resume_refuses_changed_data_naming_the_file(tmp_path, capsys):
    data = text_corpus(tmp_path / "corpus.txt")
    args = [*SHORT, "--out", str(tmp_path / "run"), "--data", str(data), "--tokenizer", "char"]
    assert main(args) == 0
    text_corpus(data, words=("alpha", "beta", "gamma", "zeta"))  # the same characters: the same tokenizer
    before, caches = snapshot(tmp_path / "run" / "checkpoints"), os.listdir(tmp_path / "run" / "data")
    assert main([*args, "--resume"]) == 1
    err = capsys.readouterr().err
    assert "the data changed" in err and "corpus.txt changed" in err
    assert snapshot(tmp_path / "run" / "checkpoints") == before
    assert os.listdir(tmp_path / "run" / "data") == caches  # refused before tokenising anything


def test_resume_refuses_another_tokenizer_even_without_a_stamp(tmp_path, capsys):
    data = text_corpus(tmp_path / "corpus.txt")
    args = [*SHORT, "--out", str(tmp_path / "run"), "--data", str(data), "--tokenizer", "char"]
    assert main(args) == 0
    os.remove(tmp_path / "run" / rundir.MARKER)  # a run written before the stamp existed
    text_corpus(data, words=("alpha", "beta", "gamma", "delta", "xyzzy"))  # new characters: another vocabulary
    assert main([*args, "--resume"]) == 1
    err = capsys.readouterr().err
    assert "the tokenizer differs from the run's" in err and "step_00000010/tokenizer.json" in err


def test_resume_with_unchanged_data_continues(tmp_path, finished, cache, capsys):
    out = copy_run(finished, tmp_path)
    assert main([*SHORT, "--out", str(out), "--data-cache", str(cache), "--resume"]) == 0  # finished: nothing to do
    assert "done:" in capsys.readouterr().out


# --- 6. every recipe field has a range, checked before any work ------------------------------------------

@pytest.mark.parametrize("flag,value", [("--grad-clip", "-1"), ("--weight-decay", "-0.1"), ("--threads", "-1"),
                                        ("--threads", "0"), ("--lr", "nan"), ("--lr", "inf"), ("--lr", "0"),
                                        ("--beta1", "1"), ("--beta2", "-0.5"), ("--eval-every", "0"),
                                        ("--val-fraction", "1"), ("--batch-size", "0"), ("--max-steps", "-3"),
                                        ("--n-head", "5"), ("--vocab-size", "70000"), ("--seed", "-1"),
                                        ("--warmup-steps", "-1"), ("--repeat-max", "2"), ("--min-lr", "1"),
                                        ("--corpus-chars", "100000000000")])
def test_an_out_of_range_flag_is_refused_naming_it_before_any_work(flag, value, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main([*SHORT, "--out", str(out), flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "must be" in err
    assert not out.exists()


def test_a_model_too_large_to_hold_is_refused_before_it_is_built(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*SHORT, "--out", str(tmp_path / "run"), "--n-layer", "1000000", "--d-model", "1024"])
    err = capsys.readouterr().err
    assert "--n-layer 1000000" in err and "parameters" in err
    assert not (tmp_path / "run").exists()


def test_grad_clip_zero_means_no_clipping(tmp_path, cache, capsys):
    models = {clip: train(TINY.override(max_steps=3, grad_clip=clip, eval_every=3), tmp_path / str(clip),
                          data_cache=cache, progress=False) for clip in (0.0, 1e12, 1e-3)}
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert same(models[0.0], models[1e12])
    assert not same(models[0.0], models[1e-3])  # clipping does change the updates
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "0 = no clipping" in " ".join(capsys.readouterr().out.split())


# --- weak cases -------------------------------------------------------------------------------------------

def test_an_empty_out_is_refused_and_nothing_lands_in_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*SHORT, "--out", ""]) == 1
    assert "--out is empty" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    for extra in ([], ["--resume"]):
        assert main([*SHORT, "--out", str(target), *extra]) == 1
        err = capsys.readouterr().err
        assert f"--out {target} is a file" in err and "None" not in err
    assert target.read_text() == "mine"


@pytest.mark.parametrize("damage", ["recipe missing", "recipe corrupt", "trainer missing", "trainer corrupt"])
def test_resume_names_a_missing_or_corrupt_run_file(damage, tmp_path, finished, cache, capsys):
    out = copy_run(finished, tmp_path)
    step = out / "checkpoints" / "step_00000010"
    target = {"recipe": out / "recipe.json", "trainer": step / "trainer.pt"}[damage.split()[0]]
    if damage.endswith("missing"):
        target.unlink()
    else:
        target.write_bytes(target.read_bytes()[:40])
    assert main([*SHORT, "--out", str(out), "--data-cache", str(cache), "--resume"]) == 1
    err = capsys.readouterr().err
    assert str(target) in err and err.count("\n") == 1 and "Traceback" not in err


def test_endless_or_huge_data_is_refused_with_bounded_memory(tmp_path, capsys):
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:  # sparse: no disk used
        f.truncate(MAX_TEXT_BYTES + 1)
    for data, words in (("/dev/zero", "not a regular file"), (str(huge), "over the limit")):
        assert main([*SHORT, "--out", str(tmp_path / "run"), "--data", data, "--tokenizer", "char"]) == 1
        err = capsys.readouterr().err
        assert data in err and words in err
        assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_ctrl_c_prints_one_line_naming_the_last_checkpoint(tmp_path, cache):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # a shell's background job (`cmd &` in a script) starts with SIGINT ignored, and Python keeps it ignored:
    # give the child the default disposition, as a terminal's Ctrl-C finds it
    proc = subprocess.Popen([sys.executable, "-m", "sprout.train", *SHORT, "--max-steps", "100000", "--out", str(out),
                             "--data-cache", str(cache)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not (out / "checkpoints" / "step_00000010").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("sprout train: interrupted; the last complete checkpoint is ")
    assert str(out / "checkpoints" / "step_") in lines[0] and "--resume" in lines[0]
    assert json.loads((out / "recipe.json").read_text())["max_steps"] == 100000
