"""TransformerLens' surface of the hooked models (Sprout, the walkthrough GPT): the forward contract
(`forward`), the run_with_* entry points (`hooked`, `caching`), the hook flags and checks, the weight
properties (`weights` per module, `stacked_weights` per model), the activation cache, the materialised
attention pattern, generation, and text in and out (`text`, `text_io`). `HookedLM` holds the per-model
parts as components (`model.weights`, `model.hook_flags`, `model.codec`) and names them (`surface`).

The models themselves (`sprout.model`, `sprout.walkthrough`) import from here; nothing here imports them.
"""
