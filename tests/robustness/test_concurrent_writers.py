"""Writers of one folder take turns (issue 36, bad case 7): two writers saving SAEs into one folder never
delete each other's temporary folders and leave a folder that loads; a second training run on a
checkpoint folder in use fails at once, naming the lock."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import interp
from interp.saes.files import CFG, WEIGHTS, is_ours
from sprout.files import FolderLocked, write_folder
from sprout.files.folders import folder_lock, lock_path, uninterrupted

D = 8


def test_two_writers_saving_into_one_folder_both_succeed_and_it_loads(tmp_path):
    saes = [interp.SAE(D, 16, kind="relu", hook_name="blocks.0.hook_resid_post", seed=i) for i in range(2)]
    errors = []

    def work(sae):
        try:
            for _ in range(12):
                sae.save(tmp_path / "sae")
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(repr(e))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in saes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:2]
    back = interp.SAE.load(tmp_path / "sae")
    assert any(torch.equal(back.W_dec, s.W_dec) for s in saes)
    assert sorted(os.listdir(tmp_path)) == ["sae"]  # no temporary or old folder left behind


def test_a_second_run_on_a_checkpoint_folder_in_use_fails_at_once(tmp_path):
    folder = tmp_path / "ckpt"
    holder = subprocess.Popen([sys.executable, "-c", (  # another process, as a second run would be
        "import time, filelock\n"
        f"with filelock.FileLock({str(lock_path(folder, 'run.lock'))!r}, timeout=0):\n"
        "    print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        acts = torch.randn(256, D)
        t0 = time.perf_counter()
        with pytest.raises(FolderLocked, match="is in use"):
            interp.train_sae(acts, kind="topk", d_sae=16, k=2, steps=3, batch_size=64, checkpoint=folder, progress=False)
        assert time.perf_counter() - t0 < 5 and not folder.exists()
    finally:
        holder.kill()
        holder.wait()
    sae = interp.train_sae(torch.randn(256, D), kind="topk", d_sae=16, k=2, steps=3, batch_size=64, checkpoint=folder,
                           progress=False)  # the lock died with its process
    assert sae.info["steps"] == 3 and lock_path(folder, "run.lock").exists()


def test_a_lock_held_on_a_file_names_a_file_as_the_way_out(tmp_path):
    """A page's writer locks the page (a file): the error says to use another file; a folder's, another folder."""
    page, folder = tmp_path / "page.md", tmp_path / "saes"
    page.write_text("# page\n")
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time, filelock\n"
        f"with filelock.FileLock({str(lock_path(page))!r}, timeout=0), "
        f"filelock.FileLock({str(lock_path(folder))!r}, timeout=0):\n"
        "    print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for target, way_out in ((page, "file"), (folder, "folder")):
            with pytest.raises(FolderLocked, match=rf"{target.name} is in use.*use another {way_out}$"):
                with folder_lock(target, wait=0):
                    pass
    finally:
        holder.kill()
        holder.wait()


def test_a_replace_swaps_in_one_step_and_a_killed_writers_old_copy_comes_back(tmp_path):
    """The old folder and the new one are exchanged atomically (the folder is never missing); where a writer
    was killed between two renames, the next write puts the old copy back before sweeping, even if that
    write then fails."""
    a = interp.SAE(D, 16, kind="relu", hook_name="blocks.0.hook_resid_post", seed=1)
    b = interp.SAE(D, 16, kind="relu", hook_name="blocks.0.hook_resid_post", seed=2)
    a.save(tmp_path / "sae")
    inode = (tmp_path / "sae").stat().st_ino
    b.save(tmp_path / "sae")
    assert (tmp_path / "sae").stat().st_ino != inode and sorted(os.listdir(tmp_path)) == ["sae"]
    (tmp_path / "sae").rename(tmp_path / ".sae.old-0123abcd")  # killed after moving the old copy aside

    def fail(tmp):
        raise OSError("disk full")

    with pytest.warns(UserWarning, match="previous copy is back"), pytest.raises(OSError, match="disk full"):
        write_folder(tmp_path / "sae", fail, frozenset({CFG, WEIGHTS}), is_ours, "an SAE folder")
    assert torch.equal(interp.SAE.load(tmp_path / "sae").W_dec, b.W_dec) and sorted(os.listdir(tmp_path)) == ["sae"]


@pytest.fixture
def sigint():
    """Set SIGINT's disposition for one test (whatever this run started with: a background job starts with it
    ignored), and put the old one back after."""
    before = signal.getsignal(signal.SIGINT)
    yield lambda handler: signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_a_group_of_writes_waits_for_the_group(tmp_path, sigint):
    """experiments.ship saves a demo's dictionaries under `uninterrupted`: a Ctrl-C arriving mid-group is
    raised once every dictionary is written, so the demo never holds a mix of new and old ones."""
    saes = [interp.SAE(D, 16, kind="relu", hook_name=f"blocks.{i}.hook_resid_post", seed=i) for i in range(3)]
    sigint(signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt, match="every write of the group finished"):
        with uninterrupted():
            for i, sae in enumerate(saes):
                if i == 1:
                    os.kill(os.getpid(), signal.SIGINT)
                sae.save(tmp_path / f"sae{i}")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert all(torch.equal(interp.SAE.load(tmp_path / f"sae{i}").W_dec, s.W_dec) for i, s in enumerate(saes))


def test_an_ignored_ctrl_c_stays_ignored_through_a_group_of_writes(tmp_path, sigint):
    """Where SIGINT is ignored (a script's background job, nohup), `uninterrupted` leaves it so: the group
    is written and nothing is raised."""
    sigint(signal.SIG_IGN)
    try:
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            interp.SAE(D, 16, kind="relu", hook_name="blocks.0.hook_resid_post").save(tmp_path / "sae")
    except KeyboardInterrupt:
        pytest.fail("an ignored Ctrl-C was raised after the group")
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert (tmp_path / "sae" / "cfg.json").exists()

