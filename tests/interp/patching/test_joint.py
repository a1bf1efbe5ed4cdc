"""Joint path patching and greedy feeder sets: a planted model with two redundant previous-token heads,
and the shipped demos against an independent patch written with the model's own modules."""
import pytest
import torch

import interp
import sprout
from interp.induction.circuit import induction_metric, repeated_pair
from interp.patching.joint import greedy_feeders, joint_path_patch
from tests.interp.planted import D_HEAD, PREV, permuted_pair, planted_model


@pytest.fixture(scope="module")
def redundant():
    """The planted circuit with its decoy L0H1 turned into a second real previous-token head: both write
    the previous token into the slot the induction head's key reads, so either alone still delivers it."""
    model = planted_model()
    with torch.no_grad():
        proj0 = model.blocks[0].attn.proj.weight
        proj0[:, D_HEAD:2 * D_HEAD] = 0
        proj0[PREV:PREV + 16, D_HEAD:D_HEAD + 16] = torch.eye(16)
    return model


def test_a_set_of_one_is_path_patch(redundant):
    clean, corrupted = permuted_pair()
    metric = induction_metric(clean)
    single = interp.path_patch(redundant, clean, corrupted, metric, ["L0H0", "L0H1", "L0H2"], ["L1H0"], via="k")
    joint = joint_path_patch(redundant, clean, corrupted, metric, [["L0H0"], ["L0H1"], ["L0H2"], []], "L1H0", "k")
    assert joint["share"].tolist()[:3] == pytest.approx(single["recovered"].tolist(), abs=1e-5)
    assert joint["share"].iloc[3] == pytest.approx(0.0, abs=1e-6)  # the empty set changes nothing


def test_greedy_names_both_redundant_heads_though_each_alone_carries_little(redundant):
    clean, corrupted = permuted_pair()
    metric = induction_metric(clean)
    chosen = greedy_feeders(redundant, clean, corrupted, metric, "L1H0", "k", threshold=0.8)
    assert set(chosen["sender"]) == {"L0H0", "L0H1"}
    assert chosen["reached"].all()
    # the heads as integers beside their labels, so nothing downstream parses a label
    assert [f"L{l}H{h}" for l, h in zip(chosen["sender_layer"], chosen["sender_head"])] == list(chosen["sender"])
    assert set(zip(chosen["receiver_layer"], chosen["receiver_head"])) == {(1, 0)}
    own = chosen.set_index("sender")["own_share"]
    joint = float(chosen["joint_share"].iloc[0])
    assert joint > 0.5 and joint > 2 * own.max()  # redundancy: the pair carries far more than either
    # each member's marginal share is the joint share lost without it, measured independently
    for r in chosen.itertuples():
        rest = [s for s in chosen["sender"] if s != r.sender]
        alone = joint_path_patch(redundant, clean, corrupted, metric, [rest], "L1H0", "k")["share"].iloc[0]
        assert r.marginal_share == pytest.approx(joint - alone, abs=1e-6)


def test_greedy_stops_at_the_one_planted_feeder(redundant):
    model = planted_model()
    clean, corrupted = permuted_pair()
    chosen = greedy_feeders(model, clean, corrupted, induction_metric(clean), "L1H0", "k")
    assert chosen["sender"].tolist() == ["L0H0"]
    with pytest.raises(ValueError, match="threshold"):
        greedy_feeders(model, clean, corrupted, induction_metric(clean), "L1H0", "k", threshold=0)
    with pytest.raises(ValueError, match="below the receiver"):
        joint_path_patch(model, clean, corrupted, induction_metric(clean), [["L1H2"]], "L1H0")


def summed_key_patch(model, clean, corrupted, senders, receiver):
    """Independent: the clean run with only the receiver's key computed from resid_pre + the senders'
    corrupted-minus-clean writes (through W_O by hand), through the block's own norm1 and qkv."""
    rl, rh = receiver
    metric = induction_metric(clean)
    _, cc = model.run_with_cache(clean)
    _, rc = model.run_with_cache(corrupted)
    block, d, dh = model.blocks[rl], model.cfg.d_model, model.cfg.d_head
    resid = cc[f"blocks.{rl}.hook_resid_pre"].clone()
    for s in senders:
        sl, sh = (int(x) for x in s[1:].split("H"))
        W_O = model.blocks[sl].attn.proj.weight[:, sh * dh:(sh + 1) * dh]
        z = f"blocks.{sl}.attn.hook_z"
        resid += (rc[z][:, :, sh] - cc[z][:, :, sh]) @ W_O.T
    k = block.attn.qkv(block.norm1(resid))[..., d:2 * d].view(*resid.shape[:2], model.cfg.n_heads, dh)

    def hook(act, hook):
        act = act.clone()
        act[:, :, rh] = k[:, :, rh]
        return act
    base = metric(model.run_with_hooks(clean)).item()
    full = metric(model.run_with_hooks(corrupted)).item()
    patched = metric(model.run_with_hooks(clean, fwd_hooks=[(f"blocks.{rl}.attn.hook_k", hook)])).item()
    return (patched - base) / (full - base)


@torch.no_grad()
def test_joint_shares_on_gpt4_match_an_independent_summed_patch():
    model = sprout.load("gpt-4").eval()
    clean, corrupted = repeated_pair(model, half_len=16, n_seqs=2)
    ind = interp.head_scores(model, "induction").iloc[0]
    receiver = (int(ind.layer), int(ind["head"]))
    earlier = [f"L{l}H{h}" for l in range(receiver[0]) for h in range(model.cfg.n_heads)]
    sets = [earlier[:2], earlier[-3:], earlier]
    ours = joint_path_patch(model, clean, corrupted, induction_metric(clean), sets, receiver, "k")["share"]
    for got, senders in zip(ours, sets):
        assert got == pytest.approx(summed_key_patch(model, clean, corrupted, senders, receiver), abs=1e-3)
