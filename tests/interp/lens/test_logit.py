"""Logit lens: the last layer is the output, every layer matches a plain re-computation, summaries agree."""
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import interp


def test_last_layer_is_the_models_output(tiny_model):
    ids = torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(0))
    df = interp.logit_lens(tiny_model, ids, k=4, batch_size=2, stats=True)
    with torch.no_grad():
        probs = F.softmax(tiny_model(ids, return_type="logits").float(), dim=-1)
    last = df[df.layer == tiny_model.cfg.n_layers]
    top_p, top_i = probs.topk(4, dim=-1)
    got_p = torch.tensor(last.top_probs.tolist()).view(3, 20, 4)
    assert (got_p - top_p).abs().max() <= 1e-5
    assert torch.equal(torch.tensor(last.top_ids.tolist()).view(3, 20, 4), top_i)
    p_next = probs[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    has_next = last[last.rank_next >= 0]
    assert (torch.tensor(has_next.p_next.tolist()).view(3, 19) - p_next).abs().max() <= 1e-5
    assert last.kl_to_final.abs().max() <= 1e-5


def test_every_layer_matches_a_plain_computation(tiny_model):
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    df = interp.logit_lens(tiny_model, ids, k=3, include_mid=True, stats=True)
    _, cache = tiny_model.run_with_cache(ids)
    final = F.log_softmax(tiny_model(ids, return_type="logits")[0].float(), -1)
    sites = {0: "blocks.0.hook_resid_pre", 0.5: "blocks.0.hook_resid_mid", 1: "blocks.0.hook_resid_post",
             1.5: "blocks.1.hook_resid_mid", 2: "blocks.1.hook_resid_post"}
    assert sorted(df.layer.unique()) == sorted(sites)
    for layer, name in sites.items():
        x = cache[name][0]
        # RMSNorm with the final gain, then the (tied) embedding matrix, written out by hand
        normed = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * tiny_model.norm.weight
        lp = F.log_softmax(normed @ tiny_model.embed.weight.T, -1)
        rows = df[df.layer == layer].sort_values("pos")
        assert rows.site.iloc[0] == name
        nxt = ids[0, 1:]
        lp_next = lp[:-1].gather(-1, nxt[:, None])[:, 0]
        assert torch.allclose(torch.tensor(rows.p_next.tolist()[:-1]), lp_next.exp(), atol=1e-5)
        rank = (lp[:-1] > lp_next[:, None]).sum(-1)
        assert rows.rank_next.tolist()[:-1] == rank.tolist()
        assert rows.rank_next.tolist()[-1] == -1 and math.isnan(rows.p_next.tolist()[-1])
        assert torch.allclose(torch.tensor(rows.entropy.tolist()), -(lp.exp() * lp).sum(-1), atol=1e-4)
        kl = (final.exp() * (final - lp)).sum(-1)
        assert torch.allclose(torch.tensor(rows.kl_to_final.tolist()), kl, atol=1e-4)
        assert rows.token.tolist() == [f"#{i}" for i in ids[0].tolist()]


def test_streamed_summary_equals_the_summary_of_the_table(tiny_model):
    ids = torch.randint(0, 256, (1, 150), generator=torch.Generator().manual_seed(2))  # 3 windows of <= 64
    table = interp.logit_lens(tiny_model, ids, k=2, batch_size=1, stats=True)
    assert sorted(table.seq.unique()) == [0, 1, 2]
    a = interp.lens_summary(table)
    b = interp.lens_dataset_summary(tiny_model, ids, batch_size=2)
    assert a.layer.tolist() == b.layer.tolist() == [0, 1, 2]
    assert a.n_positions.tolist() == b.n_positions.tolist() == [150] * 3
    for col in ("mean_top1_prob", "frac_next_top1", "mean_p_next", "mean_entropy", "mean_kl_to_final"):
        assert a[col].tolist() == pytest.approx(b[col].tolist(), rel=1e-5, abs=1e-7), col


def test_stats_only_add_columns(tiny_model):
    ids = torch.randint(0, 256, (5, 70), generator=torch.Generator().manual_seed(4))  # windows of 64 and 6
    plain = interp.logit_lens(tiny_model, ids, k=3, batch_size=3)
    full = interp.logit_lens(tiny_model, ids, k=3, batch_size=3, stats=True)
    assert "entropy" not in plain and "kl_to_final" not in plain and "rank_next" not in plain
    assert (full.is_top1 == (full.rank_next == 0)).all()
    assert plain.seq.tolist() == sorted(plain.seq.tolist()) and plain.seq.nunique() == 10
    pd.testing.assert_frame_equal(plain, full[plain.columns])
    assert "mean_entropy" not in interp.lens_summary(plain) and "mean_entropy" in interp.lens_summary(full)


def test_first_top1_layer_known_answers():
    rows = []
    # pos 0: top-1 from layer 1 on; pos 1: only at layer 0 and 2; pos 2: never; pos 3: last position
    hits = {0: [False, True, True], 1: [True, False, True], 2: [False, False, False], 3: [False] * 3}
    for pos, flags in hits.items():
        for layer, hit in enumerate(flags):
            rows.append(dict(seq=0, layer=layer, pos=pos, token=f"t{pos}", next_token=None if pos == 3 else f"t{pos + 1}",
                             is_top1=hit, rank_next=-1 if pos == 3 else (0 if hit else 3)))
    out = interp.first_top1_layer(pd.DataFrame(rows))
    assert out.pos.tolist() == [0, 1, 2]
    assert out.first_top1_layer.tolist()[:2] == [1, 0] and math.isnan(out.first_top1_layer.tolist()[2])
    assert out.top1_at_output.tolist() == [True, True, False]


def test_walkthrough_gpt_runs_unchanged_and_missing_hooks_are_named():
    from sprout.walkthrough import build_step

    torch.manual_seed(0)
    model = build_step("4.10").eval()
    ids = torch.randint(0, 65, (2, 8))
    df = interp.logit_lens(model, ids)
    probs = F.softmax(model(ids, return_type="logits").float(), -1)
    last = df[df.layer == 3]
    assert (torch.tensor(last.top_probs.str[0].tolist()) - probs.max(-1).values.reshape(-1)).abs().max() <= 1e-5
    with pytest.raises(ValueError, match=r"WalkthroughGPT has no hook point 'blocks.0.hook_resid_pre'"):
        interp.logit_lens(build_step("4.2"), ids)


def test_bad_input_is_named(tiny_model):
    with pytest.raises(ValueError, match="k must be"):
        interp.logit_lens(tiny_model, torch.arange(5), k=0)
    with pytest.raises(ValueError, match="tokenizer"):
        interp.logit_lens(tiny_model, "some text")
    with pytest.raises(ValueError, match="out of range"):
        interp.logit_lens(tiny_model, torch.tensor([1, 2, 999]))


def test_each_analysis_caches_only_the_hooks_it_reads(tiny_model):
    seen = []
    run_with_cache = tiny_model.run_with_cache

    def spy(*args, **kwargs):
        assert kwargs.get("names_filter") is not None
        out = run_with_cache(*args, **kwargs)
        seen.append(set(out[1].keys()))
        return out

    tiny_model.run_with_cache = spy
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    resid = {"blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    interp.logit_lens(tiny_model, ids)
    assert seen.pop() == resid - {"blocks.1.hook_resid_post"}  # the last stream's lens is the output itself
    interp.residual_rms(tiny_model, ids, include_mid=False, include_writes=False)
    assert seen.pop() == resid
    interp.head_scores(tiny_model, "previous_token", ids)
    assert seen.pop() == {"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}
    interp.heads.pattern_tensor(tiny_model, ids[0], layer=1)
    assert seen.pop() == {"blocks.1.attn.hook_pattern"}
    interp.ablate_heads(tiny_model, [(1, 0)], ids, method="mean")
    assert seen.pop() == {"blocks.1.attn.hook_z"}
