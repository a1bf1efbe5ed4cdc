"""circuit-tracer's own `attribute`, run on our exported model and transcoders, gives the graph
`interp.attribute` gives: the same nodes (active features by (layer, position, feature id), errors,
tokens, logit targets) and the same adjacency, entry by entry (the interop venv: `.ci/run` builds it).

circuit-tracer runs on what a user would hand it from our files: the Hugging Face export read by
TransformerLens' own Qwen3 conversion, the folder `save_circuit_tracer` writes read by its own
`load_transcoder_set` (`benchmarks.graphs_peer.their_model`, the one place that glue lives: the
benchmark times the same two runs). Conventions, and how they are matched rather than worked around:

- Position 0: circuit-tracer holds it constant (features and errors zeroed there; its token node stays)
  and wants a special token there; ours does the same with `prefix=1` (the default). Every prompt here
  starts with `<|endoftext|>`, id 0, which circuit-tracer keeps as it is (it would prepend one otherwise,
  choosing it with `filter(None, ...)`, which skips id 0).
- Logit targets: both take the most probable tokens to 0.95 probability, at most `max_n_logits`, each
  demeaned (its unembedding column minus the mean column there, the logit minus the mean logit here:
  the same with no unembedding bias).
- Errors: the true MLP output minus the reconstruction with b_dec and the skip term, in both; the skip
  term is the one path backwards through an MLP, in both.
- Node order: circuit-tracer sorts its selected features by index, ours lists them as visited; both are
  compared in one order (`benchmarks.graphs_peer.aligned`). The whole adjacency is compared, no sub-block.

Tolerance: float32 on both sides (their default); per target row, max |difference| <= 1e-4 x the row's
largest entry (measured: gpt-4 3.0e-6 and 9.7e-7, the tiny model 4.1e-6; their model is TransformerLens'
float32 Qwen3, whose logits differ from ours by ~1e-5). In float64 on both sides (their rows are stored in
float32) the bound is 1e-6 (measured 3.7e-7). Zero entries are zero in both.
"""
import pytest
import torch

import interp
import sprout
from sprout import Sprout, SproutConfig
from sprout.tokenizer import train_bpe
from tests.conftest import randomize_gains

pytest.importorskip("circuit_tracer")

from benchmarks.graphs_peer import agreement, import_circuit_tracer, their_model  # noqa: E402
from tests.interp.saes.test_transcoder_sets import _set  # noqa: E402

ct_attribute = import_circuit_tracer()[0]
EOT = 0
F32_ROW_REL, F64_ROW_REL = 1e-4, 1e-6


@pytest.fixture(scope="module")
def gpt4():
    return sprout.load("gpt-4").eval()


@pytest.fixture(scope="module")
def gpt4_transcoders(gpt4):
    return [interp.load_transcoder(gpt4, layer) for layer in range(gpt4.cfg.n_layers)]


@pytest.fixture(scope="module")
def gpt4_theirs(gpt4, gpt4_transcoders, tmp_path_factory):
    return their_model(gpt4, gpt4_transcoders, tmp_path_factory.mktemp("gpt4-export"))


def ids(model, text):
    return torch.tensor([EOT] + model.tokenizer.encode(text).ids)


def check_same_graph(ours, theirs, row_rel):
    assert torch.equal(theirs.input_tokens.cpu(), ours.input_tokens)
    assert [int(t.vocab_idx) for t in theirs.logit_targets] == [i for _, i in ours.logit_targets]
    torch.testing.assert_close(theirs.logit_probabilities.double(), ours.logit_probabilities.double(), rtol=1e-4, atol=1e-6)
    assert torch.equal(theirs.active_features.cpu(), ours.active_features)  # the same features fire, in one order
    torch.testing.assert_close(theirs.activation_values.double(), ours.activation_values.double(), rtol=1e-4, atol=1e-5)
    got = agreement(ours, theirs)  # raises if the nodes differ
    assert got["same_support"] and got["max_row_rel"] <= row_rel, got
    return got


def test_gpt4_graph_equals_circuit_tracers(gpt4, gpt4_transcoders, gpt4_theirs):
    prompt = ids(gpt4, "The king said to his son that he would give him the")
    ours = interp.attribute(gpt4, prompt, gpt4_transcoders, batch_size=256)
    theirs = ct_attribute(prompt, gpt4_theirs, batch_size=256)
    got = check_same_graph(ours, theirs, F32_ROW_REL)
    assert got["features"] == ours.n_features > 500 and len(ours.logit_targets) == 10


def test_gpt4_capped_graph_keeps_the_features_circuit_tracer_keeps(gpt4, gpt4_transcoders, gpt4_theirs):
    """With a cap, both visit features by influence on the logits, re-ranked every 4 batches of 32 rows:
    the same 200 features are kept and their rows and columns agree."""
    prompt = ids(gpt4, "Once upon a time, Zorbin Plax met a girl. Later that day, Zorbin")
    ours = interp.attribute(gpt4, prompt, gpt4_transcoders, max_feature_nodes=200, batch_size=32)
    theirs = ct_attribute(prompt, gpt4_theirs, max_feature_nodes=200, batch_size=32)
    assert len(ours.active_features) > 400 and ours.n_features == 200
    assert sorted(ours.selected_features.tolist()) == theirs.selected_features.tolist()
    check_same_graph(ours, theirs, F32_ROW_REL)


@pytest.mark.parametrize("dtype, row_rel", [(torch.float32, F32_ROW_REL), (torch.float64, F64_ROW_REL)])
def test_a_tiny_random_sprout_graph_equals_circuit_tracers(tmp_path, dtype, row_rel):
    """Random weights and norm gains, a JumpReLU layer with a skip term and a BatchTopK one without (so
    circuit-tracer's set gets a zero W_skip there), two widths (the narrower padded in its files)."""
    tok = train_bpe("the cat sat on the mat. " * 20, vocab_size=300)
    torch.manual_seed(0)
    model = randomize_gains(Sprout(SproutConfig(vocab_size=tok.get_vocab_size(), context=64, n_layer=2, n_head=4,
                                                d_model=64, d_ff=128)).eval())
    model.tokenizer = tok
    tcs = _set(["jumprelu", "batchtopk"], [96, 128])
    prompt = torch.cat([torch.tensor([EOT]), torch.randint(1, tok.get_vocab_size(), (11,),
                                                           generator=torch.Generator().manual_seed(3))])
    theirs = ct_attribute(prompt, their_model(model, tcs, tmp_path, dtype=dtype), batch_size=64)
    ours = interp.attribute(model, prompt, tcs, batch_size=64, dtype=dtype)
    got = check_same_graph(ours, theirs, row_rel)
    assert got["features"] > 50
