"""The splice plan (issue 36, bad cases 1-3 and 8): a transcoder has both hooks and its output hook runs
after its input hook, no two dictionaries write one activation, a transcoder given only its input hook
writes the MLP's output and saves a folder both loaders read, and threads splicing one model never see
a half-built hook table."""
import sys
import threading

import pytest
import torch

import interp
from sprout import Sprout
from tests.conftest import TINY, randomize_gains

D = TINY.d_model


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def _ids(seed=0):
    return torch.randint(0, TINY.vocab_size, (2, 7), generator=torch.Generator().manual_seed(seed))


def test_a_transcoder_given_its_input_hook_only_writes_the_mlp_output(model):
    tc = interp.Transcoder(D, 32, D, kind="topk", k=4, hook_name="blocks.1.ln2.hook_normalized")
    assert tc.hook_name_out == "blocks.1.hook_mlp_out"
    clean_in = model.run_with_cache(_ids())[1]["blocks.1.ln2.hook_normalized"]
    _, cache = interp.run_with_saes(model, _ids(), [tc], names_filter=["blocks.1.ln2.hook_normalized",
                                                                      "blocks.1.hook_mlp_out"])
    assert torch.equal(cache["blocks.1.ln2.hook_normalized"], clean_in)  # its input is left alone
    assert torch.allclose(cache["blocks.1.hook_mlp_out"], tc(clean_in), atol=1e-5)


def test_a_transcoder_without_a_block_to_pair_its_hook_with_is_refused():
    with pytest.raises(ValueError, match="hook_name_out"):
        interp.Transcoder(D, 32, D, hook_name="hook_embed")


def test_a_transcoder_saved_without_hook_names_loads_back_as_a_transcoder(model, tmp_path):
    tc = interp.Transcoder(D, 16, D, kind="relu", skip=True, seed=1)
    tc.save(tmp_path / "tc")
    back = interp.Transcoder.load(tmp_path / "tc")
    x = torch.randn(3, D)
    assert isinstance(back, interp.Transcoder) and back.skip and torch.allclose(back(x), tc(x))
    with pytest.raises(ValueError, match="hook_name_out"):
        interp.run_with_saes(model, _ids(), [tc])


def test_an_output_hook_that_fires_before_the_input_hook_is_refused(model):
    tc = interp.Transcoder(D, 32, D, hook_name="blocks.1.ln2.hook_normalized", hook_name_out="blocks.0.hook_mlp_out")
    with pytest.raises(ValueError, match="runs 'blocks.0.hook_mlp_out' first"):
        interp.run_with_saes(model, _ids(), [tc])


@pytest.mark.parametrize("order", [0, 1])
def test_two_dictionaries_writing_one_activation_are_refused_in_either_order(model, order):
    sae = interp.SAE(D, 32, hook_name="blocks.1.hook_mlp_out")
    tc = interp.Transcoder(D, 32, D, layer=1)
    with pytest.raises(ValueError, match="two dictionaries write 'blocks.1.hook_mlp_out'"):
        interp.run_with_saes(model, _ids(), [sae, tc][::1 - 2 * order])


def test_threads_splicing_one_model_all_succeed(model):
    saes = [interp.SAE(D, 16, hook_name=f"blocks.{i % 2}.hook_resid_post", seed=i) for i in range(4)]
    want = [interp.run_with_saes(model, _ids(), [s], names_filter=["blocks.0.hook_resid_pre"])[0] for s in saes]
    errors, got = [], {}

    def work(i):
        try:
            for _ in range(8):
                got[i] = interp.run_with_saes(model, _ids(), [saes[i]], names_filter=["blocks.0.hook_resid_pre"])[0]
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so a read outside the lock would meet a rebuild
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:2]
    assert all(torch.allclose(got[i], want[i]) for i in range(4))
