"""experiments.gpu_train: the one command that trains the four demos on a GPU machine, and brings them back."""
import io
import subprocess
import sys
import tarfile
import time

import pytest
import torch

import sprout
from experiments import gpu_train
from sprout.files import latest_checkpoint
from sprout.training.loop import train
from sprout.training.recipes import get_recipe

TINY = get_recipe("tiny").override(max_steps=3, eval_every=3, ckpt_every=3, eval_batches=1, batch_size=4)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny run, named as a demo's run would be."""
    root = tmp_path_factory.mktemp("runs")
    train(TINY, root / "tiny-run", data_cache=root.parent / "cache", progress=False)
    (root / "tiny-run.stdout.log").write_text("step 3: train 6.2\n")
    return root / "tiny-run"


def test_fitted_steps_keep_the_recipes_when_they_fit_and_scale_them_together_when_not(monkeypatch):
    monkeypatch.setattr(gpu_train, "RUNS", {"a": "gpt-4-english-long", "b": "sprout-mini-english-long"})
    a, b = get_recipe("gpt-4-english-long"), get_recipe("sprout-mini-english-long")
    assert gpu_train.fitted_steps({"a": 0.01, "b": 0.02}, 1000) == {"a": a.max_steps, "b": b.max_steps}
    # alone: 4,000 x 0.05 = 200 s and 4,000 x 0.1 = 400 s; together max(400, 0.6 x 600) = 400 s for a 200 s
    # budget: half the steps, but never fewer than the pure curriculum and 1,000 more
    assert a.max_steps == b.max_steps == 4000
    assert gpu_train.fitted_steps({"a": 0.05, "b": 0.1}, 200) == {"a": max(2000, a.curriculum_steps + 1000),
                                                                  "b": max(2000, b.curriculum_steps + 1000)}
    # never below the pure curriculum plus 1,000 steps
    assert gpu_train.fitted_steps({"a": 1.0, "b": 1.0}, 10) == {"a": a.curriculum_steps + 1000,
                                                                  "b": b.curriculum_steps + 1000}


def test_a_packed_run_unpacks_into_a_run_that_loads_and_ships(run, tmp_path, monkeypatch):
    archive = gpu_train.pack(run, "tiny", tmp_path / "out")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    step = latest_checkpoint(run).name
    assert names == {f"tiny-run/{f}" for f in ("recipe.json", "train_log.csv", "run.json")} | \
        {f"tiny-run/checkpoints/{step}/{f}" for f in gpu_train.CHECKPOINT_FILES} | {"tiny-run.stdout.log"}
    assert gpu_train.unpack(tmp_path / "out", tmp_path / "back") == [tmp_path / "back" / "tiny-run"]
    back = tmp_path / "back" / "tiny-run"
    original, unpacked = sprout.load(latest_checkpoint(run)), sprout.load(latest_checkpoint(back))
    for (name, x), (_, y) in zip(original.state_dict().items(), unpacked.state_dict().items()):
        assert torch.equal(x, y), name
    from sprout.training import ship
    monkeypatch.setattr(ship, "demo_dir", lambda: tmp_path / "demo")
    shipped = ship.ship(back, "tiny")
    assert (shipped / "recipe.json").read_text() == (run / "recipe.json").read_text()
    assert (tmp_path / "back" / "tiny-run.stdout.log").read_text() == "step 3: train 6.2\n"


def test_unpack_refuses_an_archive_that_writes_outside_the_runs_folder(tmp_path):
    (tmp_path / "out").mkdir()
    with tarfile.open(tmp_path / "out" / "bad.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(tarfile.OutsideDestinationError):
        gpu_train.unpack(tmp_path / "out", tmp_path / "runs")
    assert not (tmp_path / "escaped.txt").exists()


def test_runs_still_going_at_the_deadline_are_interrupted_and_the_others_reported(tmp_path):
    # one child that ends at once, one that waits for Ctrl-C and exits 130 as `sprout train` does
    quick = subprocess.Popen([sys.executable, "-c", "print('ok')"], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    ready = tmp_path / "slow.ready"  # written once the slow child's handler is in place (a loaded machine is slow)
    # its own Ctrl-C handler: a child of a background job (pytest under nohup or `&`) starts with SIGINT ignored
    slow = subprocess.Popen([sys.executable, "-c", "import pathlib, signal, sys, time\n"
                             "signal.signal(signal.SIGINT, signal.default_int_handler)\ntry:\n    pathlib.Path(sys.argv[1]).touch()\n"
                             "    time.sleep(60)\nexcept KeyboardInterrupt:\n    raise SystemExit(130)", str(ready)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    done = []
    started = {}
    for name, proc in (("quick", quick), ("slow", slow)):
        relay = gpu_train.threading.Thread(target=gpu_train._relay, args=(name, proc, tmp_path / f"{name}.log"))
        relay.start()
        started[name] = (proc, relay)
    waited = time.monotonic()
    while not ready.exists() and time.monotonic() - waited < 30:
        time.sleep(0.05)
    t0 = time.monotonic()
    codes = gpu_train.wait_all(started, t0 + 1.0, lambda name, code: done.append((name, code)))
    assert codes == {"quick": 0, "slow": 130} and done[0] == ("quick", 0)
    assert time.monotonic() - t0 < 10
    assert (tmp_path / "quick.log").read_text() == "ok\n"
