"""The generator's tables: word lists, sentence frames and the syllables invented names are made of.

Every fixed word a story holds comes from here (`FIXED`); every other word is drawn from the syllable
tables (`ONSETS` + `VOWELS` + `CODAS`) or is a code or string of `UPPER`, `LOWER` and `DIGITS`.
"""
from __future__ import annotations

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

ONSETS = ("b c d f g h j k l m n p r s t v w z b d g k l m n p r s t v z br dr gl kl pl pr st tr "
          "th sh ch qu").split() + [""] * 3
VOWELS = "a e i o u a e i o u a e i o u ai ee oo ou y".split()
CODAS = [""] * 12 + "n r l x m s k n r l x th".split()
UPPER, LOWER, DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", "0123456789"
WORDS = NOUNS + ADJECTIVES + VERBS + COLORS + ANIMALS + FOODS

# Every frame and word list: the words a story can hold that are not drawn from syllables.
FIXED = (NOUNS, ADJECTIVES, VERBS, COLORS, ANIMALS, FOODS, JOBS, PLACES, TIMES, INTROS, NARRATIVE, CODE_FIRST,
         CODE_AGAIN, STRING_FIRST, STRING_AGAIN, LIST_FIRST, LIST_AGAIN, ECHO_FIRST, ECHO_AGAIN, SONG_FIRST,
         SONG_AGAIN, CHANT_FRAMES)
