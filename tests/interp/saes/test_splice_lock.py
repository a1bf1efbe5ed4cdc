"""A splice rebuilds the model's hook table under the model's public `hook_lock`, never a private name."""
import re
import threading
from pathlib import Path

import torch

import interp

RESID = "blocks.0.hook_resid_post"


class Identity(torch.nn.Module):
    """A dictionary with no check_model: splicing it runs no forward (which would take the lock anyway)."""

    def __init__(self, d):
        super().__init__()
        self.W_enc, self.hook_name = torch.nn.Parameter(torch.eye(d)), RESID

    def encode(self, x):
        return x

    def decode(self, f):
        return f


def test_a_splice_waits_for_the_thread_that_holds_the_hook_lock(tiny_model):
    sae = Identity(tiny_model.cfg.d_model)
    entered = threading.Event()

    def splice():
        with interp.spliced(tiny_model, [sae]):
            entered.set()

    with tiny_model.hook_lock:  # another user of the model, mid-change of its hook table
        worker = threading.Thread(target=splice)
        worker.start()
        assert not entered.wait(0.3)  # the splice waits for the lock
    worker.join(10)
    assert entered.is_set() and f"{RESID}.hook_sae_acts_post" not in tiny_model.hook_dict


def test_the_lock_is_reentrant_for_the_thread_that_holds_it(tiny_model):
    sae = interp.SAE(tiny_model.cfg.d_model, 16, kind="relu", hook_name=RESID)
    with tiny_model.hook_lock, interp.spliced(tiny_model, [sae]):
        assert f"{RESID}.hook_sae_acts_post" in tiny_model.hook_dict


def test_interp_reaches_no_private_attribute_of_a_model():
    root = Path(interp.__file__).parent
    private = re.compile(r"\bmodel\._[a-z]|getattr\(\s*model\s*,\s*[\"']_[a-z]")
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert hits == []
