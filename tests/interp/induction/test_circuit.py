"""The circuit tools on a hand-built model whose circuit is known, and on the shipped demos against an
independent key-only patch written with the model's own modules."""
import pytest

import interp
import sprout
from interp.induction.circuit import induction_metric, repeated_pair
from tests.interp.planted import PLANTED, permuted_pair, planted_model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


def test_the_planted_heads_do_what_they_were_built_for(planted):
    ids, _ = permuted_pair()
    prev = interp.head_scores(planted, "previous_token", ids).set_index(["layer", "head"])["score"]
    induction = interp.head_scores(planted, "induction", ids).set_index(["layer", "head"])["score"]
    assert min(prev[0, 0], prev[0, 1], prev[1, 2]) > 0.99  # the real previous-token head and both decoys
    assert min(induction[1, 0], induction[1, 1]) > 0.9  # the induction head and its decoy


def test_induction_circuit_recovers_exactly_the_planted_edges(planted):
    frame, summary = interp.induction_circuit(planted, data=permuted_pair(), stories=False)
    edges = {(r.sender, r.receiver, r.via) for r in frame[frame["feeds"]].itertuples()}
    assert edges == PLANTED
    assert set(frame["receiver"]) == {"L1H0", "L1H1"}  # the decoy induction head is found, and fed by nothing
    assert "keys: L0H0" in summary
    rows = frame[(frame.receiver == "L1H0") & (frame.via == "k")].set_index("sender")
    assert rows.loc["L0H0", "share_repeated"] > 0.5 and rows.loc["L0H0", "composition"] > 3 * rows.loc["L0H0", "baseline"]
    assert rows.loc["L0H1", "composition"] < 1e-6 and abs(rows.loc["L0H1", "share_repeated"]) < 1e-3
    assert rows.loc["L0H0", "ablation_delta"] > 0.05


def test_composition_sees_the_planted_key_edge_and_not_the_decoy(planted):
    k = interp.composition_scores(planted, "k").set_index(["sender", "receiver"])
    assert k.loc[("L0H0", "L1H0"), "z"] > 10
    assert k.loc[("L0H1", "L1H0"), "score"] < 1e-6  # the decoy writes where no key reads
    q = interp.composition_scores(planted, "q").set_index(["sender", "receiver"])
    assert q.loc[("L0H0", "L1H0"), "score"] < 1e-6


def test_positional_qk_finds_the_positional_heads(planted):
    pos = interp.positional_qk_scores(planted, permuted_pair()[0]).set_index("label")["positional_prev_token"]
    assert min(pos["L0H0"], pos["L0H1"], pos["L1H2"]) > 0.99
    assert pos["L1H0"] < 0.5  # the induction head attends by content


def reference_runs(model, clean, corrupted):
    """The clean and corrupted caches and metrics every receiver's `key_only_effects` starts from."""
    metric = induction_metric(clean)
    _, cc = model.run_with_cache(clean)
    _, rc = model.run_with_cache(corrupted)
    return metric, cc, rc, metric(model.run_with_hooks(clean)).item(), metric(model.run_with_hooks(corrupted)).item()


def key_only_effects(model, clean, corrupted, receiver, runs=None):
    """Independent check: for each earlier head s, the clean run with only the receiver's key computed from
    resid_pre + (s's corrupted write - its clean write), through the block's own norm1 and qkv."""
    rl, rh = receiver
    metric, cc, rc, base, full = runs or reference_runs(model, clean, corrupted)
    block, d = model.blocks[rl], model.cfg.d_model
    effects = {}
    for sl in range(rl):
        for sh in range(model.cfg.n_heads):
            W_O = model.blocks[sl].attn.proj.weight[:, sh * model.cfg.d_head:(sh + 1) * model.cfg.d_head]
            z = f"blocks.{sl}.attn.hook_z"
            delta = (rc[z][:, :, sh] - cc[z][:, :, sh]) @ W_O.T
            k = block.attn.qkv(block.norm1(cc[f"blocks.{rl}.hook_resid_pre"] + delta))[..., d:2 * d]
            k = k.view(*k.shape[:2], model.cfg.n_heads, model.cfg.d_head)

            def hook(act, hook, k=k):
                act = act.clone()
                act[:, :, rh] = k[:, :, rh]
                return act
            patched = metric(model.run_with_hooks(clean, fwd_hooks=[(f"blocks.{rl}.attn.hook_k", hook)])).item()
            effects[f"L{sl}H{sh}"] = (patched - base) / (full - base)
    return effects


@pytest.mark.parametrize("name", ["gpt-4", "sprout-mini"])
def test_induction_circuit_agrees_with_key_only_patching_on_the_demos(name):
    model = sprout.load(name).eval()
    pair = repeated_pair(model, half_len=20, n_seqs=2)  # 2 sequences: sprout-mini has 4 receivers x 24 senders
    frame, summary = interp.induction_circuit(model, data=pair, stories=False)
    assert not frame.empty, summary
    runs = reference_runs(model, *pair)
    for receiver, rows in frame[frame.via == "k"].groupby("receiver"):
        effects = key_only_effects(model, *pair, tuple(int(x) for x in receiver[1:].split("H")), runs)
        ours = rows.set_index("sender")["share_repeated"]
        for sender, share in effects.items():
            assert ours[sender] == pytest.approx(share, abs=1e-3), (receiver, sender)
        best = max(effects.values())
        theirs = {s for s, e in effects.items() if e >= 0.02 and e >= 0.25 * best}
        assert set(rows[rows.feeds].sender) == theirs
        assert max(effects, key=effects.get) == rows.loc[rows.share_repeated.idxmax(), "sender"]
