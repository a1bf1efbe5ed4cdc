"""The shipped gpt-4 demo with its shipped transcoders (transcoders=None), in float32: the replacement
model's logits are the model's, every row of the graph plus its constant is its target's value, and the
scores are those of a dictionary set that explains most of the prediction; in float64 the identity holds to 1e-9."""
import copy

import pytest
import torch

import interp
import sprout
from interp.graphs.dictionaries import CrossLayerDictionaries
from tests.interp.graphs.tiny import assert_rows_are_exact


@pytest.fixture(scope="module")
def gpt4():
    return sprout.load("gpt-4").eval()


def test_gpt4_graph_with_the_shipped_transcoders_is_exact(gpt4):
    rm = interp.ReplacementModel(gpt4)
    prompt = "The king said to his"
    tokens = rm.tokens(prompt)
    with torch.no_grad():
        want = gpt4(tokens[None])[0]
    assert (rm.forward(prompt) - want).abs().max() <= 1e-5 * want.abs().max()
    graph = interp.attribute(gpt4, prompt)
    assert graph.scan == rm.dicts.scan and graph.input_string == prompt
    _, cache = gpt4.run_with_cache(tokens[None])  # every active latent after the first position, the one held constant
    active = sum(int((tc.encode(cache[tc.hook_name])[0, 1:] != 0).sum())
                 for tc in (interp.load_transcoder(gpt4, layer) for layer in range(4)))
    assert graph.n_features == active > 100
    assert_rows_are_exact(rm, graph, atol=1e-4, rtol=1e-4)
    scores = interp.graph_scores(graph).set_index("graph")
    assert 0.7 < scores.loc["full", "replacement"] < 1 and 0.9 < scores.loc["full", "completeness"] < 1
    assert scores.loc["pruned", "n_features"] < graph.n_features / 4


def test_gpt4_graph_in_float64_is_exact_to_1e9(gpt4):
    graph = interp.attribute(gpt4, "The king said", dtype=torch.float64)
    assert graph.adjacency_matrix.dtype == torch.float64
    rm = interp.ReplacementModel(copy.deepcopy(gpt4).double(), interp.graphs.Dictionaries(
        [interp.load_transcoder(gpt4, layer) for layer in range(4)], 4).to(torch.float64))
    assert_rows_are_exact(rm, graph)


def test_gpt4_graph_with_the_shipped_clt_is_exact(gpt4):
    """transcoders="clt" takes the demo's shipped cross-layer transcoder (interp.load_clt): its features write
    to every later MLP, and the float64 graph is still exact, row by row, against the frozen model's forwards."""
    graph = interp.attribute(gpt4, "The king said", transcoders="clt", dtype=torch.float64)
    clt = interp.load_clt(gpt4)
    assert graph.scan == CrossLayerDictionaries(clt, 4).scan
    rm = interp.ReplacementModel(copy.deepcopy(gpt4).double(), CrossLayerDictionaries(clt, 4).to(torch.float64))
    # the features it attributes are the shipped CLT's active ones, past the constant first position
    _, cache = gpt4.run_with_cache(graph.input_tokens[None])
    active = sum(int((clt.encode(l, cache[f"blocks.{l}.ln2.hook_normalized"])[0, 1:] != 0).sum()) for l in range(4))
    assert graph.n_features == active > 10
    assert_rows_are_exact(rm, graph)
    with pytest.raises(TypeError, match="'clt' \\(the shipped cross-layer one\\).*got 'cl'"):
        interp.attribute(gpt4, "The king said", transcoders="cl")
