"""Synthetic text that both training and the analyses use: generated stories and repeated random tokens.

The stories are simple English about characters, places and things with invented names (random
syllables, drawn fresh for every story), so the later pieces of a name can only be predicted by
copying them from earlier in the context. A corpus whose only repetition is names teaches a lookup
bound to the sentence templates rather than real induction, so most stories also repeat arbitrary
material: codes, lists of random words read back in order, echoed sentences, chants, random strings
and nonsense songs (see `MIX`). About 45% of the characters lie in a span of 20 or more characters
that occurs twice in its story (`repeated_fraction`).

Training draws its corpus from `generate_corpus` (`sprout.training.corpus`); the analyses draw
held-out stories from `generate_story` and the induction probe from `repeated_random_tokens`.
"""
from __future__ import annotations

import random

import torch

# ----------------------------------------------------------------------------- vocabulary

NOUNS = """apple basket bell blanket boat book bottle box bread bridge brush bucket button cake candle
cap car carpet chair chest clock cloud coat comb cup curtain desk door drum egg fence flag flower fork
garden gate glove hammer hat hill horn jar kettle key kite ladder lamp leaf letter map mirror mitten
moon nail necklace needle net nest note paper pebble pen pencil pillow pipe plate pocket pot ribbon
ring river road rock roof rope sack saddle scarf shell shoe shovel sign sock spoon stair star stick
stone stool string table tent ticket tower towel toy tree trumpet tunnel umbrella wagon wall wheel
whistle window wire yard bench barrel cart chimney cloak compass crown feather fountain glass
harp helmet island jug lantern locket mask meadow mill orchard paddle parcel puddle puzzle quilt
rainbow shelf sled spade statue stream sword teapot thread torch trunk valley vase well""".split()
ADJECTIVES = """big small old new tall short happy sad quiet loud soft hard warm cold bright dark
brave shy kind clever silly funny strange busy lazy tiny huge round flat heavy light quick slow
shiny dusty muddy clean sleepy hungry gentle proud calm wild noisy smooth rough sweet sour broken
golden silver wooden secret hidden lucky curious careful friendly grumpy fancy plain empty full wet
dry early late fresh rusty crooked striped spotted fuzzy narrow wide deep thin thick lonely cheerful
tired sticky shaky wobbly sparkly""".split()
VERBS = """found lost carried dropped painted washed opened closed fixed broke built cleaned
counted drew filled hid held kicked lifted moved pulled pushed shared shook sold bought threw
tied wrapped borrowed buried chased climbed collected cooked cut dug fed folded followed grabbed
hugged kept mended packed picked polished rolled saved sent spilled stacked swept touched traded
turned visited warmed watched weighed wiped mixed tested measured checked covered""".split()
COLORS = "red blue green yellow orange purple pink brown black white grey gold silver".split()
ANIMALS = """cat dog fox owl rabbit mouse horse goat sheep cow duck goose frog bear wolf deer
hedgehog squirrel pig hen crow parrot turtle badger beaver otter lizard donkey""".split()
FOODS = """bread soup cheese apples pears plums honey rice beans porridge carrots pie cake
biscuits jam eggs milk tea berries nuts grapes lemons noodles pancakes""".split()
JOBS = """baker farmer sailor painter teacher tailor miller builder fisher doctor gardener
potter singer guard cook shepherd smith weaver clerk carpenter""".split()
PLACES = """the market|the river|the forest|the school|the harbour|the bakery|the station|the old mill|
the square|the library|the beach|the farm|the bridge|the hill|the lake|the castle|the shop|the park|
the garden|the tower""".replace("\n", "").split("|")
TIMES = """One morning|That night|In the spring|After lunch|The next day|At sunset|Before dawn|
Every Sunday|Later that week|On a rainy day|In the winter|At noon|Soon after|Many years later""".replace(
    "\n", "").split("|")


def _frames(block: str) -> list[str]:
    return [f.strip() for f in block.replace("\n", " ").split("|")]


INTROS = _frames("""
Once upon a time, in a {adj} town called {p}, there lived a {job} named {a}. |
{a} was a {adj} {job} who lived near {p}. | {a} had a {adj} friend called {b}. |
Everyone in {p} knew {b}, the {job} with the {color} {n}. | {a} owned a {adj} {n} called {t}. |
Long ago, {a} and {b} came to {p} with a {animal} named {t}. |
This is the story of {a}, {b} and a {color} {n} known as {t}. | {c} was the oldest {job} in {p}.
""")
NARRATIVE = _frames("""
{a} walked to {p} with {b}. | {b} gave {a} a {adj} {n}. | In {p}, {c} {v} the {n}. |
{a} looked at {t} and smiled. | "Where is {t}?" asked {b}. | {time}, {a} and {c} went to {place}. |
{b} said that {t} was {adj}. | {c} {v} a {color} {n} near {p}. |
{a} was {adj} because {t} was gone. | The {animal} of {c} ran across {p}. |
{b} put {t} next to the {n}. | {a} told {c} a story about {p}. | {time}, it rained over {p}. |
{c} found {t} under the {n}. | {b} and {a} ate {food} by the {n}. |
Nobody in {p} had seen a {n} so {adj}. | {a} {v} the {n} for {b}. |
"{b}, look!" said {a}. "{t} is {adj}!" | {c} wanted to visit {p} again. |
{a} asked {b} about {t}. | The road to {p} was long and {adj}. |
{b} laughed at the {adj} {animal}. | {c} carried {t} all the way to {place}. |
{a} thought about {p} and {t}. | {time}, {b} {v} a {n} and a {n2}. | {c} met {a} at {place}. |
{t} was {color} and {adj}. | {b} hid {t} behind the {n}. | "I like {p}," said {c}. |
{a} and {b} became good friends. | {c} sold {food} to the people of {p}. |
{a} dreamed of a {adj} {n} in {p}. | {b} waved goodbye to {c}. |
{a} wrote a letter to {b} about the {n}. | The {job} from {p} helped {a}. |
{c} painted {t} {color}. | Then {b} {v} the {adj} {n}. | {a} could not find {t} anywhere. |
{b} knocked on the door of {c}. | A {adj} {animal} followed {a} home to {p}. |
{c} and {t} waited at {place}. | {a} gave {t} to {c}. | Later, {b} {v} the {n} again. |
{c} was happy to be back in {p}. | {time}, {a} heard a {adj} sound. |
{b} and {c} talked about {t} all evening. | "Is {t} yours?" {c} asked {a}. |
{a} sat by the {n} and waited for {b}.
""")
# Each kind of episode: frames that bring in the material {x}, and frames that repeat it.
CODE_FIRST = _frames("""
{a} found a note that said {x}. | The lock on the {n} opened only with the code {x}. |
{a} told {b} the secret code: {x}. | A sign at {p} showed the number {x}. |
"Remember {x}," whispered {c}. | The ticket for {t} was marked {x}.
""")
CODE_AGAIN = _frames("""
{b} typed {x} and the {n} opened. | "The code is {x}," {a} reminded {b}. |
{b} wrote {x} on the {n}. | Later {a} said the code again: {x}. | {c} checked the number: {x}. |
At {p} the code {x} still worked.
""")
STRING_FIRST = _frames("""
On the {n} someone had written {x}. | {a} carved {x} into the {color} {n}. |
The old map of {p} said {x}. | {b} spelled it out: {x}. | {c} counted out loud: {x}.
""")
STRING_AGAIN = _frames("""
{b} copied it out: {x}. | {a} read it again: {x}. | "{x}," {c} said slowly. |
The same marks were on {t}: {x}. | {b} still remembered it: {x}.
""")
LIST_FIRST = _frames("""
{a} read out a list: {x}. | On the board at {p}, {a} wrote: {x}. | {b} packed these things: {x}. |
The {job} asked {c} for {x}. | {a} named the things in the box: {x}.
""")
LIST_AGAIN = _frames("""
{b} read it back: {x}. | Then {c} said the list again: {x}. | "{x}," {b} repeated. |
{a} checked the list once more: {x}. | In the same order, {c} said: {x}.
""")
ECHO_FIRST = _frames("""
{a} said: "{x}" | {b} shouted, "{x}" | A voice from {p} called: "{x}" |
{c} whispered to {t}: "{x}"
""")
ECHO_AGAIN = _frames("""
{b} repeated: "{x}" | {a} said it too: "{x}" | The {animal} at {p} squawked: "{x}" |
"{x}" {c} echoed. | Word for word, {b} answered: "{x}"
""")
SONG_FIRST = _frames("""
{a} sang a strange song: {x}. | The children of {p} hummed: {x}. | {t} made a noise like {x}. |
{c} knew an old rhyme: {x}.
""")
SONG_AGAIN = _frames("""
{b} sang it back: {x}. | Some days later, {a} still hummed: {x}. | "{x}," sang {c}. |
Everyone in {p} joined in: {x}.
""")
CHANT_FRAMES = _frames("""
The crowd at {p} chanted: "{x}" | {a} and {b} shouted together: "{x}" |
Again and again {c} called: "{x}" | The children chanted: "{x}"
""")


# The story kinds and the fraction of stories of each kind. Every story opens by introducing its
# invented names and keeps mentioning them in narrative sentences; a story of a repeating kind
# also holds 2-4 episodes (each of its own kind with probability 0.7, else of a random repeating
# kind) in which a new piece of arbitrary material appears and is later repeated verbatim 1-3
# times, after a gap of 0-3 other sentences.
MIX = {
    "plain": 0.10,  # names only: characters, a place and a thing mentioned again and again
    "code": 0.15,  # door codes like "K7-QX-42", told and typed again
    "list": 0.15,  # random words read out, then read back in the same order
    "echo": 0.15,  # a random sentence said, then repeated word for word
    "chant": 0.15,  # a short line of random or nonsense words chanted several times
    "string": 0.15,  # random letter and digit strings written down and copied later
    "nonsense": 0.15,  # songs of invented words sung and sung back
}
_REPEATING = [k for k in MIX if k != "plain"]
_KINDS, _WEIGHTS = list(MIX), list(MIX.values())

_ONSETS = ("b c d f g h j k l m n p r s t v w z b d g k l m n p r s t v z br dr gl kl pl pr st tr "
           "th sh ch qu").split() + [""] * 3
_VOWELS = "a e i o u a e i o u a e i o u ai ee oo ou y".split()
_CODAS = [""] * 12 + "n r l x m s k n r l x th".split()
_UPPER, _LOWER, _DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", "0123456789"
_WORDS = NOUNS + ADJECTIVES + VERBS + COLORS + ANIMALS + FOODS


def _syllables(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n))


def random_name(rng: random.Random) -> str:
    """An invented, capitalised name of 2-4 random syllables (mostly 2), 30% of the time with a
    second word of 1-2 syllables, like "Zorbin Plax"."""
    name = ""
    while len(name) < 4:  # no "Ai" or "Oe": too short to need copying
        name = _syllables(rng, rng.choice((2, 2, 2, 3, 3, 4))).capitalize()
    if rng.random() < 0.3:
        second = ""
        while len(second) < 3:
            second = _syllables(rng, rng.choice((1, 1, 2))).capitalize()
        name += " " + second
    return name


def _nonsense_words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(_syllables(rng, rng.randint(1, 3)) for _ in range(rng.randint(lo, hi)))


def _random_words(rng: random.Random, lo: int, hi: int) -> list[str]:
    return [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]


def _code(rng: random.Random) -> str:
    groups = []
    for _ in range(rng.randint(2, 4)):
        alphabet = rng.choice((_UPPER, _DIGITS, _UPPER + _DIGITS))
        groups.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))))
    return rng.choice("--/.").join(groups)


def _string(rng: random.Random) -> str:
    form = rng.random()
    if form < 0.3:  # one run of letters and digits
        alphabet = rng.choice((_LOWER + _DIGITS, _UPPER + _DIGITS, _LOWER))
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 14)))
    if form < 0.55:  # spaced digits
        return " ".join(rng.choice(_DIGITS) for _ in range(rng.randint(4, 10)))
    if form < 0.8:  # spaced letters
        alphabet = rng.choice((_LOWER, _UPPER))
        return " ".join(rng.choice(alphabet) for _ in range(rng.randint(4, 10)))
    return " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(3, 7)))  # numbers


class _Slots(dict):
    """Fills a sentence frame: the cast's names are fixed, every other slot is drawn on first use
    (and then kept, so a slot used twice in one frame reads the same)."""

    def __init__(self, rng: random.Random, cast: dict):
        super().__init__(cast)
        self.rng = rng

    def __missing__(self, key: str) -> str:
        choice = self.rng.choice
        pool = {"n": NOUNS, "n2": NOUNS, "adj": ADJECTIVES, "adj2": ADJECTIVES, "v": VERBS,
                "color": COLORS, "time": TIMES, "job": JOBS, "animal": ANIMALS, "food": FOODS,
                "place": PLACES}[key]
        self[key] = value = choice(pool)
        return value


def _say(rng: random.Random, cast: dict, frame: str, **extra) -> str:
    slots = _Slots(rng, cast)
    slots.update(extra)
    return frame.format_map(slots)


def _random_sentence(rng: random.Random, cast: dict) -> str:
    # An echoed sentence: a narrative sentence, or a string of random words, either way arbitrary.
    if rng.random() < 0.5:
        return _say(rng, cast, rng.choice(NARRATIVE)).replace('"', "'")  # it goes inside quotes
    return " ".join(_random_words(rng, 4, 10)).capitalize() + rng.choice(".!?")


def _episode(rng: random.Random, cast: dict, kind: str) -> tuple[str, str, list[str]]:
    """One piece of arbitrary material x: (x, the sentence that brings it in, 1-3 that repeat it)."""
    n_again = rng.randint(1, 3)
    if kind == "code":
        x = _code(rng)
        first, again = CODE_FIRST, CODE_AGAIN
    elif kind == "string":
        x = _string(rng)
        first, again = STRING_FIRST, STRING_AGAIN
    elif kind == "list":
        x = rng.choice((", ", ", ", " ", "; ")).join(_random_words(rng, 4, 10))
        first, again = LIST_FIRST, LIST_AGAIN
    elif kind == "echo":
        x = _random_sentence(rng, cast)
        first, again = ECHO_FIRST, ECHO_AGAIN
    elif kind == "nonsense":
        x = _nonsense_words(rng, 3, 9)
        first, again = SONG_FIRST, SONG_AGAIN
    else:  # chant: the line itself repeats inside one sentence, and the sentence comes back
        line = (" ".join(_random_words(rng, 2, 5)) if rng.random() < 0.5
                else _nonsense_words(rng, 2, 5)).capitalize()
        x = " ".join([line + "!"] * rng.randint(2, 3))
        first, again = CHANT_FRAMES, CHANT_FRAMES
        n_again = rng.randint(1, 2)
    return (x, _say(rng, cast, rng.choice(first), x=x),
            [_say(rng, cast, rng.choice(again), x=x) for _ in range(n_again)])


def generate_story(rng: random.Random) -> str:
    """One story: invented names introduced, then narrative sentences that keep mentioning them,
    interleaved with repetition episodes of the story's kind (drawn from `MIX`).

    Args:
        rng: a `random.Random`; the story is a deterministic function of its state.

    Returns:
        The story, with "\\n" between paragraphs and no blank line inside.
    """
    kind = rng.choices(_KINDS, _WEIGHTS)[0]
    names: list[str] = []
    while len(names) < 5:
        name = random_name(rng)
        names += [name] if name not in names else []
    cast = dict(zip("abcpt", names))  # three characters, a place and a thing
    sents = [_say(rng, cast, frame) for frame in rng.sample(INTROS, 2)]
    sents += [_say(rng, cast, rng.choice(NARRATIVE)) for _ in range(rng.randint(4, 8))]
    if kind != "plain":
        for _ in range(rng.randint(2, 4)):
            ep_kind = kind if rng.random() < 0.7 else rng.choice(_REPEATING)
            _, first, again = _episode(rng, cast, ep_kind)
            i = rng.randint(2, len(sents))  # after the introduction
            sents.insert(i, first)
            for s in again:
                i = rng.randint(i + 1, min(len(sents), i + 4))
                sents.insert(i, s)
    paragraphs, i = [], 0
    while i < len(sents):
        n = rng.randint(3, 6)
        paragraphs.append(" ".join(sents[i:i + n]))
        i += n
    return "\n".join(paragraphs)


def generate_corpus(n_chars: int, seed: int = 0) -> str:
    """Generates stories separated by "\\n\\n" until there are at least `n_chars` characters.

    Args:
        n_chars: the minimum length; the text ends at a story boundary, so it is at most one
            story (about 1-2K characters) longer.
        seed: the same seed gives the same text.

    Returns:
        The corpus as one str.
    """
    rng = random.Random(seed)
    stories, total = [], 0
    while total < n_chars:
        s = generate_story(rng)
        stories.append(s)
        total += len(s) + 2
    return "\n\n".join(stories)


def repeated_fraction(text: str, min_len: int = 20) -> float:
    """The fraction of characters covered by a span of `min_len` characters that occurs at least
    twice in the same story (stories split at "\\n\\n"); both occurrences count."""
    covered = total = 0
    for story in text.split("\n\n"):
        total += len(story)
        first: dict[str, int] = {}
        starts: set[int] = set()
        for i in range(len(story) - min_len + 1):
            j = first.setdefault(story[i:i + min_len], i)
            if j != i:
                starts.add(i)
                starts.add(j)
        end = 0
        for s in sorted(starts):
            covered += min_len - max(0, end - s) if end < s + min_len else 0
            end = max(end, s + min_len)
    return covered / max(total, 1)


def repeated_random_tokens(batch: int, half_len: int, vocab_size: int, generator: torch.Generator,
                           low: int = 1) -> torch.Tensor:
    """Random tokens followed by the same tokens again, the induction setting of Olsson et al.

    Args:
        batch: B, the number of sequences.
        half_len: H, the length of the random half.
        vocab_size: ids are drawn from [low, vocab_size).
        generator: the source of randomness.
        low: the smallest id drawn; the default 1 skips `<|endoftext|>`, id 0 of `train_bpe`.

    Returns:
        int64 tensor [B, 2H] with x[:, H:] == x[:, :H].
    """
    if not 0 <= low < vocab_size:
        raise ValueError(f"need 0 <= low < vocab_size, got low={low}, vocab_size={vocab_size}")
    half = torch.randint(low, vocab_size, (batch, half_len), generator=generator)
    return torch.cat([half, half], dim=1)
