"""TransformerLens' surface of the hooked models (Sprout, the walkthrough GPT): the forward contract
(`forward`), the run_with_* entry points (`hooked`), the hook flags and checks, the weight properties
(`weights` per module, `stacked_weights` per model), the activation cache, the materialised attention
pattern, generation, and text in and out (`text`, `text_io`).

The models themselves (`sprout.model`, `sprout.walkthrough`) import from here; nothing here imports them.
"""
