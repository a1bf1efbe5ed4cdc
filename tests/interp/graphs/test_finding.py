"""The name-copying finding: where a prompt copies from, the groups of its graph (a partition whose parts and
constant make the logit, each member chosen by its rule), and on a planted induction model the answer
known by construction: the earlier token, moved by the induction head, carries the logit."""
import pytest
import torch

from interp.discovery.planted import induction_pair, planted_model
from interp.graphs import SUPERNODES, ReplacementModel, copy_interventions, copy_site, name_copy
from interp.graphs.finding import GROUPS
from interp.graphs.interventions import REGIMES
from tests.interp.graphs.tiny import random_transcoders, target_values, tiny_sprout, zero_sources


def test_copy_site_takes_the_longest_earlier_match_and_the_token_after_it():
    site = copy_site([9, 1, 2, 3, 7, 2, 3, 8, 1, 2, 3])
    assert (site.match_start, site.match_end, site.source, site.target, site.length) == (1, 3, 4, 7, 3)
    latest = copy_site(torch.tensor([5, 4, 6, 4, 8, 4]))  # two matches of length 1: the later one
    assert (latest.source, latest.target) == (4, 8)
    with pytest.raises(ValueError, match="occurs nowhere before"):
        copy_site([1, 2, 3])
    # the earlier stretch and its next token must end before the current tail begins: no overlap
    overlap = copy_site([1, 2, 3, 1, 2, 3, 1])
    assert (overlap.match_start, overlap.match_end, overlap.source, overlap.target) == (2, 3, 4, 2)
    with pytest.raises(ValueError, match="occurs nowhere before"):
        copy_site([5, 7, 7])  # the only earlier 7 is followed by the current token itself


@pytest.fixture(scope="module")
def tiny():
    model = tiny_sprout()
    rm = ReplacementModel(model, random_transcoders(model))
    tokens = torch.tensor([3, 40, 41, 42, 43, 7, 8, 9, 10, 40, 41])  # copies 42 from position 3
    return rm, name_copy(rm, tokens)


def test_groups_partition_the_nodes_and_with_the_constant_make_the_logit(tiny):
    rm, found = tiny
    graph, groups = found.graph, found.groups
    assert list(groups["group"]) == list(GROUPS) and found.site.target == 42
    members = [n for nodes in groups["nodes"] for n in nodes]
    assert sorted(members) == list(range(graph.slices()["logit"].start))  # every non-logit node, once
    frozen = rm.freeze(graph.input_tokens)
    with torch.no_grad():
        value = float(target_values(rm, rm.run(frozen), graph)[0, -1])
        constant = float(target_values(rm, rm.run(frozen, **dict(zip(("embed", "acts", "errors"), zero_sources(frozen)))),
                                       graph)[0, -1])
    assert found.value == pytest.approx(value, abs=1e-9)
    table = groups.set_index("group")
    assert table.loc["constant", "attribution"] == pytest.approx(constant, abs=1e-9)  # the zero-source run
    assert table["attribution"].sum() == pytest.approx(value, abs=1e-9)
    assert table["share"].sum() == pytest.approx(1.0, abs=1e-9)


def test_each_feature_falls_in_its_group_by_where_its_input_comes_from(tiny):
    """The rule recomputed from the edge table: a feature at the current position is a copy feature when its
    |input| from the earlier next piece's position exceeds that from its own."""
    _, found = tiny
    graph, site = found.graph, found.site
    nodes, edges = graph.nodes, graph.edges()
    edges = edges[edges["target"] < graph.n_features]
    pos_of = dict(zip(nodes["node"], nodes["pos"]))
    edges = edges.assign(src_pos=edges["source"].map(pos_of), w=edges["weight"].abs())
    inputs = edges.groupby(["target", "src_pos"])["w"].sum()
    group_of = {n: g for g, ns in zip(found.groups["group"], found.groups["nodes"]) for n in ns}
    checked = 0
    for f in range(graph.n_features):
        p = pos_of[f]
        own, src, before = (float(inputs.get((f, x), 0.0)) for x in (p, site.source, site.source - 1))
        if p == site.current:
            assert (group_of[f] == SUPERNODES[0]) == (src > own)
            checked += 1
        elif p == site.source:
            assert group_of[f] == ("previous-token features" if before > own else "features at the earlier next piece")
            checked += 1
        else:
            assert group_of[f] == "other features"
    assert checked > 0
    assert {group_of[graph.token_node(site.source)], group_of[graph.token_node(site.current)]} == {
        "the earlier next piece's token", "the current token"}


@pytest.fixture(scope="module")
def planted():
    model = planted_model("induction", dtype=torch.float64)
    rm = ReplacementModel(model, random_transcoders(model))
    clean, _ = induction_pair(n_seqs=1, half_len=8)
    return rm, name_copy(rm, clean[0, :12])  # [A A] cut inside the second copy


def test_on_the_planted_induction_model_the_earlier_token_through_the_induction_head_carries_the_logit(planted):
    _, found = planted
    assert found.top1 and found.site.length == 4
    shares = found.groups.set_index("group")["share"]
    assert shares.drop("constant").idxmax() == "the earlier next piece's token" and shares["the earlier next piece's token"] > 0.5
    logit = found.heads[(found.heads["into"] == "logit") & (found.heads["layer"] == 1)].set_index("head")
    assert logit["fraction"].idxmax() == 0 and logit.loc[0, "fraction"] == pytest.approx(1.0, abs=0.05)  # L1H0
    assert logit["fraction"].drop(0).abs().max() < 0.05  # the decoy L1H1 attends alike and writes nothing


def test_interventions_report_every_regime_of_every_non_empty_supernode_beside_random(planted):
    rm, found = planted
    frame = copy_interventions(rm, found, n_random=4)
    present = [s for s in SUPERNODES if found.supernode(s)]
    assert list(frame["supernode"].unique()) == present and len(frame) == 3 * len(present)
    assert set(frame["regime"]) == set(REGIMES)
    assert (frame["beats_random"] == (frame["measured"] < frame["random_p05"])).all()
    logit = found.graph.adjacency_matrix[found.graph.slices()["logit"].start]
    for r in frame.itertuples():  # ablating removes the group's direct edges: the graph's direct prediction
        assert r.predicted_direct == pytest.approx(-float(logit[found.supernode(r.supernode)].sum()), abs=1e-9)
    with pytest.raises(ValueError, match="supernode must be one of"):
        found.supernode("nope")
