"""sprout.material: the synthetic probe material, apart from the model.

Invented-name stories (`generate_story`, the training corpus `generate_corpus`, the analyses'
`held_out_stories`), the syllables their names are made of (`random_name`, `generator_can_draw`), and
repeated random tokens (`repeated_random_tokens`), and held-out texts whose names the generator cannot
draw, in frames it never wrote (`unseen_texts`). Nothing here imports the model or its files: the
same seed gives the same text and tokens wherever they are drawn.
"""
from .names import generator_can_draw, nonsense_words, random_name, syllables
from .repeats import repeated_random_tokens
from .stories import HELD_OUT_SEED, MIX, generate_corpus, generate_story, held_out_stories, repeated_fraction
from .unseen import unseen_name, unseen_texts

__all__ = ["HELD_OUT_SEED", "MIX", "generate_corpus", "generate_story", "generator_can_draw", "held_out_stories",
           "nonsense_words", "random_name", "repeated_fraction", "repeated_random_tokens", "syllables"]
__all__ += ["unseen_name", "unseen_texts"]
