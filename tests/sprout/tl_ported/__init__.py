"""TransformerLens' own tests (tests/unit, tests/integration of TransformerLensOrg/TransformerLens, late 2026),
ported to Sprout and the walkthrough GPT: each TL test's assertion kept, written against tiny models.

Ported (file here <- TL file):
- test_hooks.py <- integration/test_hooks.py (all 17, backward-hook return conventions, conditional hooks,
  prepending), integration/test_main_demo_pattern_hooks.py, unit/test_hook_introspection.py (list_hooks)
- test_stop_start_at_layer.py <- integration/test_stop_at_layer.py, integration/test_start_at_layer.py
- test_masks_and_cache.py <- integration/test_attention_mask.py, test_left_padding.py, test_cache_pos_slice.py,
  test_cache_hook_names.py, and acceptance/test_activation_cache.py's final-norm recomputation tests
- test_tools.py <- unit/test_patching.py, unit/test_svd_interpreter.py, unit/test_split_qkv.py,
  unit/test_use_attn_result.py, integration/test_cross_entropy_loss.py, integration/test_head_detector.py,
  and TL 4.3's tools.analysis.attribution_patching (edge granularity)
- test_differences.py: docs/reference/differences.md ("Where Sprout differs from TransformerLens"), and issues 21.4/21.5/23.3-23.8
Earlier ports: ../test_tl_bridge.py (the rest of the ActivationCache helpers), ../test_tl_forward.py, ../test_tl_weights.py.

Not ported, and why:
- grouped-query halves of test_split_qkv / test_use_attn_result, test_grouped_query_attention.py: Sprout has
  n_key_value_heads = n_heads (architectural).
- expected numbers of test_svd_interpreter / test_head_detector / test_match_huggingface: pretrained solu/gpt2
  weights; replaced by known answers (a dense SVD, pinned patterns; HF equality is tests/sprout/test_hf.py).
- generation, KV cache, BOS, tokenization (test_generation_compatibility, test_kv_cache, test_prepend_bos,
  test_tokenization_methods, test_utils_tokens): the generation work of issue 23.1/23.2/23.5.
- unit/test_hook_points.py, test_hooked_root_module.py, factored_matrix/*: TL's own HookPoint,
  HookedRootModule and FactoredMatrix classes with mocks; Sprout uses them unchanged.
- model_bridge/*, pretrained_weight_conversions/*, weight_conversion/*, loading_from_pretrained, hubert, lit,
  tracr, supported_models, make_docs, multi-gpu, mps: TL's adapters for other architectures and its tooling.
"""
