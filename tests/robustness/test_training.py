"""Interrupted training: `sprout train` killed with SIGKILL at random moments (half way through writing
the weights, the optimizer state, a rename, a prune, the log, or at a random time) resumes from an intact
checkpoint and ends with the same weights, bit for bit, as a run that was never interrupted. A full disk
keeps the previous checkpoint; a corpus smaller than one window is refused up front with its numbers.

Each run is `sprout train`'s `main(argv)` in a child forked from a warmed-up fork server, so a run of
six steps takes a fraction of a second instead of a fresh interpreter's import time.
"""
import errno
import io
import multiprocessing
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sprout.files import checkpoint
from sprout.training import rundir
from sprout.training.cli import main as train_main
from sprout.training.cli import parse_args
from sprout.training.corpus import prepare_data

STEPS = 6
ARGS = ["--recipe", "tiny", "--max-steps", str(STEPS), "--ckpt-every", "1", "--eval-every", "3",
        "--eval-batches", "1", "--batch-size", "4", "--threads", "1", "--no-progress"]
TRIALS = 20


def argv(out, cache, *extra):
    return [*ARGS, "--out", str(out), "--data-cache", str(cache), *extra]


# --- kill points, installed in the forked child -------------------------------------------------------

def die():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_during_write(name, n):
    """SIGKILL half way through the n-th write of `name` (model.safetensors, config.json, tokenizer.json)."""
    real, seen = checkpoint.write_bytes, [0]

    def write(path, data):
        if Path(path).name == name:
            seen[0] += 1
            if seen[0] == n:
                with open(path, "wb") as f:
                    f.write(data[: len(data) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                die()
        real(path, data)

    checkpoint.write_bytes = write


def kill_during_trainer_state(n):
    """SIGKILL half way through the n-th trainer.pt (optimizer, step, RNG states)."""
    real, seen = torch.save, [0]

    def save(obj, f, *args, **kwargs):
        seen[0] += 1
        if seen[0] == n and hasattr(f, "write"):
            buf = io.BytesIO()
            real(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            die()
        return real(obj, f, *args, **kwargs)

    torch.save = save


def kill_at_call(module, name, n, when, target=None):
    """SIGKILL just before or just after the n-th call of module.name (os.rename, os.replace), counting
    only calls whose destination is named `target` if given."""
    real, seen = getattr(module, name), [0]

    def wrapped(*args, **kwargs):
        if target is not None and Path(args[1]).name != target:
            return real(*args, **kwargs)
        seen[0] += 1
        if seen[0] == n and when == "before":
            die()
        out = real(*args, **kwargs)
        if seen[0] == n:
            die()
        return out

    setattr(module, name, wrapped)


def kill_during_prune(n):
    """SIGKILL after deleting one file of the n-th old checkpoint being pruned."""
    real, seen = rundir.remove_checkpoint, [0]

    def remove_checkpoint(path):
        seen[0] += 1
        if seen[0] == n:
            os.remove(sorted(Path(path).iterdir())[0])
            die()
        return real(path)

    rundir.remove_checkpoint = remove_checkpoint


# Per uninterrupted run of STEPS steps with a checkpoint every step: STEPS weight files, trainer
# states and tokenizers, 2 renames per checkpoint, STEPS - 2 prunes, one log write per evaluation.
KILL_POINTS = {
    "writing model.safetensors": (STEPS, lambda n: kill_during_write("model.safetensors", n)),
    "writing tokenizer.json": (STEPS, lambda n: kill_during_write("tokenizer.json", n)),
    "writing trainer.pt": (STEPS, kill_during_trainer_state),
    "before a rename": (2 * STEPS, lambda n: kill_at_call(os, "rename", n, "before")),
    "after a rename": (2 * STEPS, lambda n: kill_at_call(os, "rename", n, "after")),
    "pruning an old checkpoint": (STEPS - 2, kill_during_prune),
    "replacing train_log.csv": (STEPS // 3, lambda n: kill_at_call(os, "replace", n, "before", "train_log.csv")),
}


def keep_every_checkpoint():
    rundir.prune = lambda root, keep: None


def disk_full(target, fail_at):
    """The fail_at-th write of `target` (model.safetensors or trainer.pt) writes a third, then ENOSPC."""
    real_write, real_save, seen = checkpoint.write_bytes, torch.save, [0]

    def write(path, data):
        if Path(path).name == target:
            seen[0] += 1
            if seen[0] == fail_at:
                real_write(path, data[: len(data) // 3])
                raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data)

    def save(obj, f, *args, **kwargs):
        if target == "trainer.pt" and hasattr(f, "write"):
            seen[0] += 1
            if seen[0] == fail_at:
                f.write(b"\0" * 100)
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    checkpoint.write_bytes, torch.save = write, save


SETUPS = {"keep every checkpoint": keep_every_checkpoint, "disk full": disk_full,
          **{kind: setup for kind, (_, setup) in KILL_POINTS.items()}}


def _child(args, log, setup, setup_args):
    code = 99
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1), os.dup2(fd, 2)
        if setup is not None:
            SETUPS[setup](*setup_args)
        code = train_main(args)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


# Children are forked from a fork server (imports done, kernels warmed up on one thread): a process that
# has run torch on several threads, as the test process has, cannot safely fork; its children can hang.
FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["torch", "torch._dynamo", "safetensors.torch", "tqdm", "sprout.training.cli", "sprout.material",
                              "sprout.files.checkpoint", "sprout.tokenizer", __name__, "tests.robustness._warm_fork_server"])


def run(args, log: Path, setup=None, setup_args=(), kill_after=None) -> int:
    """`sprout train ARGS` in a forked child; returns its exit code (-9 when killed)."""
    child = FORKS.Process(target=_child, args=(args, str(log), setup, setup_args))
    child.start()
    if kill_after is not None:
        child.join(kill_after)
        if child.exitcode is None:
            os.kill(child.pid, signal.SIGKILL)
    child.join()
    code = child.exitcode
    child.close()
    return code


def weights(step_dir: Path) -> dict:
    return load_file(str(step_dir / "model.safetensors"))


def assert_same_tensors(a: dict, b: dict, what: str):
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs"


def log_rows(run_dir: Path) -> list[str]:
    return [r.rsplit(",", 1)[0] for r in (run_dir / "train_log.csv").read_text().splitlines()]  # drop elapsed_s


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The data cache, and an uninterrupted run that keeps every checkpoint (its pruning is disabled)."""
    root = tmp_path_factory.mktemp("straight")
    _, recipe = parse_args(argv(root / "run", root / "cache"))
    prepare_data(recipe, root / "cache")

    run(["--help"], root / "warmup.txt")  # start the fork server outside the timing
    t0 = time.time()
    code = run(argv(root / "run", root / "cache"), root / "log.txt", setup="keep every checkpoint")
    assert code == 0, (root / "log.txt").read_text()
    steps = sorted(d.name for d in (root / "run" / "checkpoints").iterdir())
    assert steps == [f"step_{s:08d}" for s in range(1, STEPS + 1)]
    return root, time.time() - t0


def test_sigkill_at_random_moments_then_resume_gives_bit_identical_weights(straight, tmp_path):
    root, seconds = straight
    cache, reference = root / "cache", root / "run"
    rng = random.Random(20261129)
    kinds = list(KILL_POINTS) + ["at a random time"] * 3
    plan = []
    for trial in range(TRIALS):
        kind = kinds[trial] if trial < len(KILL_POINTS) else rng.choice(kinds)  # every kind at least once
        if kind == "at a random time":
            plan.append((kind, rng.uniform(0.05, 0.9) * seconds))
        else:
            plan.append((kind, rng.randint(1, KILL_POINTS[kind][0])))

    for trial, (kind, when) in enumerate(plan):
        out, log = tmp_path / f"trial{trial}", tmp_path / f"trial{trial}.txt"
        label = f"trial {trial} ({kind}, {when})"
        if kind == "at a random time":
            code = run(argv(out, cache), log, kill_after=when)
            assert code in (-signal.SIGKILL, 0), f"{label}: {log.read_text()}"
        else:
            code = run(argv(out, cache), log, setup=kind, setup_args=(when,))
            assert code == -signal.SIGKILL, f"{label} was not killed: {log.read_text()}"

        # What survived is either nothing or a complete checkpoint, identical to the straight run's.
        latest = checkpoint.latest_checkpoint(out)
        if latest is not None:
            assert_same_tensors(weights(latest), weights(reference / "checkpoints" / latest.name), label)
            state = torch.load(latest / "trainer.pt", weights_only=True)
            saved = torch.load(reference / "checkpoints" / latest.name / "trainer.pt", weights_only=True)
            assert state["step"] == int(latest.name[5:]), label
            assert_same_tensors({f"{i}.{k}": v for i, s in state["optimizer"]["state"].items() for k, v in s.items()},
                                {f"{i}.{k}": v for i, s in saved["optimizer"]["state"].items() for k, v in s.items()},
                                label)
            assert torch.equal(checkpoint.load(latest).embed.weight, weights(latest)["embed.weight"])
        resume = ["--resume"] if latest is not None else []  # killed before its first checkpoint: start over
        code = run(argv(out, cache, *resume), log)
        assert code == 0, f"{label}: resume failed: {log.read_text()}"

        final = out / "checkpoints" / f"step_{STEPS:08d}"
        assert_same_tensors(weights(final), weights(reference / "checkpoints" / final.name), label)
        assert log_rows(out) == log_rows(reference), label
        # the debris of the killed write is gone; the last two checkpoints are there (a run killed after
        # its final checkpoint but before pruning keeps one more: resuming a finished run prunes nothing)
        left = sorted(os.listdir(out / "checkpoints"))
        assert left[-2:] == [f"step_{STEPS - 1:08d}", final.name] and len(left) <= 3, f"{label}: {left}"


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(straight, tmp_path):
    root, _ = straight
    cache, reference, out = root / "cache", root / "run", tmp_path / "run"
    start = 0
    for target, fail_at in (("model.safetensors", 3), ("trainer.pt", 2)):  # the 3rd and the 2nd save
        log = tmp_path / f"{target}.txt"
        resume = ["--resume"] if start else []
        assert run(argv(out, cache, *resume), log, setup="disk full", setup_args=(target, fail_at)) != 0
        assert "[Errno 28] No space left on device" in log.read_text()
        latest = checkpoint.latest_checkpoint(out)
        assert latest.name == f"step_{start + fail_at - 1:08d}"  # the step before the failed save, complete
        assert_same_tensors(weights(latest), weights(reference / "checkpoints" / latest.name), target)
        assert torch.load(latest / "trainer.pt", weights_only=True)["step"] == start + fail_at - 1
        start += fail_at - 1
    assert run(argv(out, cache, "--resume"), tmp_path / "last.txt") == 0  # space freed: it carries on
    final = f"step_{STEPS:08d}"
    assert_same_tensors(weights(out / "checkpoints" / final), weights(reference / "checkpoints" / final), "end")


# --- a corpus too small ----------------------------------------------------------------------------------

def test_a_corpus_smaller_than_one_window_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "small.txt").write_text("a tiny corpus, far too small.")
    code = train_main(["--recipe", "tiny", "--out", str(tmp_path / "run"), "--data", str(tmp_path / "small.txt"),
                       "--tokenizer", "char", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("sprout train: error: corpus smaller than one batch: ")
    assert "/train.bin has 27 tokens, but a window needs context + 1 = 33; give it more text" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_validation_split_smaller_than_one_window_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "text.txt").write_text("word " * 100 + "\n\nend of it")  # 510 characters, the last 10 held out
    code = train_main(["--recipe", "tiny", "--out", str(tmp_path / "run"), "--data", str(tmp_path / "text.txt"),
                       "--tokenizer", "char", "--val-fraction", "0.02", "--eval-every", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "corpus smaller than one batch: " in err and "/val.bin has 9 tokens, but a window needs context + 1 = 33" in err


def test_a_corpus_too_small_for_the_bpe_vocabulary_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "small.txt").write_text("a tiny corpus, far too small.")
    code = train_main(["--recipe", "tiny", "--out", str(tmp_path / "run"), "--data", str(tmp_path / "small.txt"),
                       "--no-progress"])
    assert code == 1
    assert capsys.readouterr().err.startswith("sprout train: error: the BPE tokenizer learned only ")
