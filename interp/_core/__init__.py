"""The plumbing every room of `interp` shares; not part of the public API (import a room instead).

    model.py         what a hooked model must offer (HookedModel), its name, layers, heads, unembedding
    identity.py      a model's config and weight fingerprint, which saved lenses and dictionaries record
    inputs.py        text or ids -> one padded batch or unpadded rows; windows of a token stream
    batching.py      rows -> padded batches with their masks
    specs.py         heads and components (Head, Component) and their parsers
    metrics.py       metrics of logits: checked, hidden at padding, refused when NaN
    distributed.py   the world size and rank under torchrun, gradient averaging
    patch_engine.py  the batched runner that patching, path patching and attribution share
    arguments.py     argparse types shared by the command lines
    loss.py          the mean next-token loss of a run with forward hooks (ablations)
"""
