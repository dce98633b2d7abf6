"""WordNet 3.0 nouns as a node-classification graph, read from the WordNet database files.

Nodes are the 82,115 noun synsets of ``data.noun``; the class of a synset is its lexicographer file
(``lex_filenum`` 03-28: ``noun.Tops`` ... ``noun.time``, 26 classes); edges are the noun-to-noun
pointers between synsets; node features encode each synset's words and gloss. The split follows
Planetoid: 20 labelled nodes per class, 500 validation and 1,000 test nodes. The result is a
:class:`~carls_dask.paradigms.data.planetoid.PlanetoidGraph`, so everything that trains on Cora
trains on WordNet unchanged.

The database format (``man 5 wndb``)
------------------------------------
``data.noun`` starts with a licence header whose lines begin with two spaces; they are skipped.
Every other line is one synset::

    synset_offset lex_filenum ss_type w_cnt word lex_id [word lex_id...] p_cnt [ptr...] | gloss

``synset_offset`` is the line's byte offset in the file (8 decimal digits) and names the synset;
``lex_filenum`` is 2 decimal digits; ``ss_type`` is ``n`` in ``data.noun``; ``w_cnt`` is the number of
words in 2 **hexadecimal** digits, each word followed by a 1-hex-digit ``lex_id`` (collocations join
their words with ``_``); ``p_cnt`` is 3 decimal digits, and each pointer is four fields,
``pointer_symbol synset_offset pos source/target``, where ``pos`` is the part of speech of the target
(``n v a s r``) and ``source/target`` is 4 hex digits (``0000`` for a relation between synsets, else
the word numbers of a relation between two words). Verb files then list sentence frames; nouns have
none. After `` | `` the gloss runs to the end of the line (a definition, often with examples).

The graph's edges
-----------------
Every pointer whose target is a noun (``pos == "n"``) and whose symbol is in ``relations`` becomes
an undirected edge; the default keeps all noun-to-noun relations (:data:`NOUN_RELATIONS`): hypernym
``@`` / hyponym ``~``, instance hypernym ``@i`` / instance hyponym ``~i``, member/substance/part
holonyms ``#m #s #p`` and meronyms ``%m %s %p``, antonym ``!``, derivationally related form ``+`` (the
noun-to-noun ones), and the domain links ``;c ;r ;u`` (topic, region, usage) with their inverses
``-c -r -u``. Pointers to verbs and adjectives (``+`` to verbs, attribute ``=``) are left out. Each
relation is listed from both ends in the file, so an edge is kept once (``u < v``), without self loops.

Data location
-------------
The files come with the Debian package ``wordnet-base`` (``/usr/share/wordnet``); nothing is
downloaded. The folder is the ``wordnet_dir`` argument, else the ``carls.data.wordnet`` location (its
environment variable is WordNet's own ``WNSEARCHDIR``; default ``<data folder>/wordnet`` when it holds
``data.noun``, else ``/usr/share/wordnet``; see :mod:`carls_dask.locations`). The features are cached in
``carls.data.cache``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import time
from collections.abc import Collection, Iterable, Sequence

import numpy as np

from carls_dask import locations
from carls_dask.errors import ConfigError, CorruptStoreError, StoreNotFoundError
from carls_dask.paradigms.data.planetoid import PlanetoidGraph
from carls_dask.paradigms.data.sentences import (
    cached_array,
    encode_sentences,
    texts_digest,
)

__all__ = [
    "FEATURE_KINDS",
    "NOUN_LEXNAMES",
    "NOUN_RELATIONS",
    "SPLIT_SEED",
    "Synset",
    "find_wordnet_dir",
    "gloss_features",
    "load_wordnet",
    "planetoid_split",
    "read_data_file",
    "synset_texts",
    "wordnet_edges",
]

logger = logging.getLogger(__name__)

# lexnames(5WN): the noun lexicographer files, lex_filenum 03..28 -> class 0..25
NOUN_LEXNAMES: tuple[str, ...] = (
    "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute", "noun.body",
    "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant",
    "noun.possession", "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state",
    "noun.substance", "noun.time",
)
FIRST_NOUN_LEXFILE = 3

# wninput(5WN): the pointer symbols that can join two noun synsets
NOUN_RELATIONS: dict[str, str] = {
    "@": "hypernym", "~": "hyponym", "@i": "instance hypernym", "~i": "instance hyponym",
    "#m": "member holonym", "#s": "substance holonym", "#p": "part holonym",
    "%m": "member meronym", "%s": "substance meronym", "%p": "part meronym",
    "!": "antonym", "+": "derivationally related form",
    ";c": "domain of synset (topic)", "-c": "member of domain (topic)",
    ";r": "domain of synset (region)", "-r": "member of domain (region)",
    ";u": "domain of synset (usage)", "-u": "member of domain (usage)",
}

FEATURE_KINDS = ("auto", "minilm", "tfidf")
SPLIT_SEED = 0
_INSTALL_DATA = "install the Debian package 'wordnet-base' (apt-get install wordnet-base)"


@dataclasses.dataclass(frozen=True)
class Synset:
    """One line of a WordNet data file.

    Attributes
    ----------
    offset
        ``synset_offset``: the line's byte offset, which names the synset within its data file.
    lex_filenum
        Number of the lexicographer file (for nouns 3-28, see :data:`NOUN_LEXNAMES`).
    ss_type
        ``n``, ``v``, ``a``, ``s`` or ``r``.
    words
        The synset's words as written (collocations joined with ``_``).
    pointers
        ``(symbol, target_offset, target_pos, source_target)`` of every pointer.
    gloss
        The definition and examples.
    """

    offset: int
    lex_filenum: int
    ss_type: str
    words: tuple[str, ...]
    pointers: tuple[tuple[str, int, str, str], ...]
    gloss: str


def _parse_line(line: str, path: pathlib.Path, lineno: int) -> Synset:
    def bad(what: str) -> CorruptStoreError:
        return CorruptStoreError(f"WordNet data file {path}, line {lineno}: {what}; expected "
                                 "'offset lex_filenum ss_type w_cnt word lex_id ... p_cnt ptr... | gloss' (man 5 wndb)")

    head, sep, gloss = line.partition(" | ")
    if not sep:
        head, sep, gloss = line.rstrip().partition(" |")
        if not sep:
            raise bad("no ' | ' before the gloss")
    t = head.split(" ")
    try:
        offset, lex, ss_type = int(t[0]), int(t[1]), t[2]
        w_cnt = int(t[3], 16)
    except (IndexError, ValueError) as exc:
        raise bad(f"unreadable offset/lex_filenum/ss_type/w_cnt in {head[:40]!r}") from exc
    i = 4 + 2 * w_cnt
    if w_cnt < 1 or len(t) <= i:
        raise bad(f"w_cnt {t[3]!r} announces {w_cnt} words but the line ends first")
    words = tuple(t[4:i:2])
    try:
        p_cnt = int(t[i])
    except ValueError as exc:
        raise bad(f"p_cnt {t[i]!r} is not a number (is w_cnt {t[3]!r} right?)") from exc
    rest = t[i + 1:]
    if len(rest) < 4 * p_cnt:
        raise bad(f"p_cnt {p_cnt} announces {p_cnt} pointers but only {len(rest)} fields follow")
    pointers = []
    for k in range(p_cnt):
        sym, target, pos, st = rest[4 * k:4 * k + 4]
        if pos not in "nvasr" or len(pos) != 1 or not target.isdigit():
            raise bad(f"pointer {k + 1} is {' '.join(rest[4 * k:4 * k + 4])!r}")
        pointers.append((sym, int(target), pos, st))
    if ss_type != "v" and len(rest) != 4 * p_cnt:
        raise bad(f"{len(rest) - 4 * p_cnt} fields after the {p_cnt} pointers")
    return Synset(offset, lex, ss_type, words, tuple(pointers), gloss.strip())


def read_data_file(path: str | os.PathLike[str]) -> list[Synset]:
    """Parse a WordNet ``data.<pos>`` file (format in the module docstring and ``man 5 wndb``).

    Parameters
    ----------
    path
        The file, e.g. ``/usr/share/wordnet/data.noun``.

    Returns
    -------
    list of Synset
        In file order (by offset).

    Raises
    ------
    StoreNotFoundError
        If the file is not there.
    CorruptStoreError
        If a line breaks the format, or a synset's offset is not its byte offset in the file; the
        message names the file and the line.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise StoreNotFoundError(f"WordNet data file {p} not found; {_INSTALL_DATA}")
    out: list[Synset] = []
    position = 0
    with p.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            start, position = position, position + len(raw)
            if raw.startswith(b"  "):
                continue
            try:
                line = raw.decode("utf-8").rstrip("\n")
            except UnicodeDecodeError as exc:
                raise CorruptStoreError(f"WordNet data file {p}, line {lineno}: not UTF-8 ({exc})") from exc
            if not line.strip():
                continue
            syn = _parse_line(line, p, lineno)
            if syn.offset != start:
                raise CorruptStoreError(f"WordNet data file {p}, line {lineno}: synset_offset {syn.offset:08d} "
                                        f"but the line starts at byte {start}; expected them equal (man 5 wndb)")
            out.append(syn)
    if not out:
        raise CorruptStoreError(f"WordNet data file {p}: no synset lines (only header or blank lines)")
    return out


def find_wordnet_dir(wordnet_dir: str | os.PathLike[str] | None = None,
                     data_dir: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The folder holding ``data.noun``: ``wordnet_dir``, else the ``carls.data.wordnet`` location.

    ``data_dir`` is the data folder whose ``wordnet/`` the location's default looks at.

    Raises
    ------
    StoreNotFoundError
        If the folder that was set does not exist, or the folder holds no ``data.noun`` (naming it, where
        it was set and the setting to change).
    """
    loc = locations.resolve("wordnet", wordnet_dir, given_as="the wordnet_dir argument", data_dir=data_dir)
    assert loc.path is not None
    if not (loc.path / "data.noun").is_file():
        raise StoreNotFoundError(f"WordNet folder {loc}: holds no data.noun; {_INSTALL_DATA}, or set "
                                 f"{loc.how_to_set()} to a WordNet 3.0 dict folder")
    return loc.path


def wordnet_edges(synsets: Sequence[Synset], relations: Collection[str] | None = None) -> np.ndarray:
    """``int64[2, E]`` undirected edges between the synsets' indices, each once (``u < v``), no self loops.

    Parameters
    ----------
    synsets
        Noun synsets (pointers to synsets outside the list are ignored).
    relations
        Pointer symbols to keep (``None``: every key of :data:`NOUN_RELATIONS`).

    Raises
    ------
    ConfigError
        If ``relations`` names a symbol that is not a noun-to-noun relation.
    """
    keep = set(NOUN_RELATIONS) if relations is None else set(relations)
    unknown = sorted(keep - set(NOUN_RELATIONS))
    if unknown:
        raise ConfigError(f"WordNet relations {unknown}: expected pointer symbols among {list(NOUN_RELATIONS)}")
    index = {s.offset: i for i, s in enumerate(synsets)}
    src: list[int] = []
    dst: list[int] = []
    for i, s in enumerate(synsets):
        for sym, target, pos, _ in s.pointers:
            j = index.get(target) if pos == "n" and sym in keep else None
            if j is not None and j != i:
                src.append(min(i, j))
                dst.append(max(i, j))
    if not src:
        return np.zeros((2, 0), dtype=np.int64)
    pairs = np.unique(np.stack([np.asarray(src, np.int64), np.asarray(dst, np.int64)], axis=1), axis=0)
    return np.ascontiguousarray(pairs.T)


def synset_texts(synsets: Iterable[Synset]) -> list[str]:
    """The text encoded for each synset: its words, then its gloss (``"dog, domestic dog: a member of ..."``)."""
    return [f"{', '.join(w.replace('_', ' ') for w in s.words)}: {s.gloss}" for s in synsets]


def _tfidf(texts: Sequence[str], dim: int, seed: int, cache: pathlib.Path | None = None) -> np.ndarray:
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer
    from sklearn.preprocessing import normalize

    from carls_dask.runtime.progress import work_bar

    with work_bar(3, f"TF-IDF features of {len(texts)} texts: hashing, weighting, SVD", unit="stage",
                  cache=cache) as bar:
        counts = HashingVectorizer(n_features=2**18, alternate_sign=False, norm=None, stop_words="english",
                                   ngram_range=(1, 1)).transform(texts)
        bar.update(1)
        tfidf = TfidfTransformer(sublinear_tf=True).fit_transform(counts)
        bar.update(1)
        reduced = TruncatedSVD(n_components=dim, n_iter=4, random_state=seed).fit_transform(tfidf)
        bar.update(1)
    return np.asarray(normalize(reduced), dtype=np.float32)


def _encoder_problem() -> str | None:
    """Why the sentence encoder cannot be loaded here (``None`` when it can)."""
    from carls_dask.paradigms.data.sentences import check_sentence_encoder

    try:
        check_sentence_encoder()
    except ConfigError as exc:
        return str(exc)
    return None


def gloss_features(texts: Sequence[str], features: str = "auto", *,
                   cache_dir: str | os.PathLike[str] | None = None, tfidf_dim: int = 256) -> tuple[np.ndarray, str]:
    """Node features of ``texts`` and the kind used.

    Parameters
    ----------
    texts
        One text per node (:func:`synset_texts`).
    features
        ``"minilm"``: all-MiniLM-L6-v2 sentence embeddings (384 dims, needs the ``text`` extra);
        ``"tfidf"``: hashed TF-IDF of the words (2**18 buckets, English stop words removed, sublinear tf)
        reduced by TruncatedSVD to ``tfidf_dim`` dims and L2-normalised; ``"auto"``: ``minilm`` when its
        packages are installed, else ``tfidf``.
    cache_dir
        Folder of the ``.npz`` caches (``None``: no cache). Both kinds are cached by a hash of the texts.
    tfidf_dim
        Dimensions of the TF-IDF features.

    Returns
    -------
    features, kind
        ``float32[n, d]`` unit-norm rows and ``"minilm"`` or ``"tfidf"``.

    Raises
    ------
    ConfigError
        For an unknown ``features``, or ``"minilm"`` without its packages (the message names them and
        ``pip install -e '.[text]'``).
    """
    if features not in FEATURE_KINDS:
        raise ConfigError(f"WordNet features {features!r}: expected one of {FEATURE_KINDS}")
    kind = features
    if kind == "auto":
        problem = _encoder_problem()
        if problem:
            logger.warning("WordNet features: %s; using TF-IDF", problem)
        kind = "tfidf" if problem else "minilm"
    if kind == "minilm":
        problem = _encoder_problem()
        if problem:
            raise ConfigError(f"WordNet features 'minilm': {problem} (or use features='tfidf')")

        return encode_sentences(texts, cache_dir=cache_dir), kind
    if tfidf_dim < 2:
        raise ConfigError(f"WordNet tfidf_dim {tfidf_dim!r}: expected an integer >= 2")

    name = f"tfidf{tfidf_dim}-{texts_digest(texts, f'tfidf{tfidf_dim}')}.npz"

    def compute() -> np.ndarray:
        t0 = time.monotonic()
        out = _tfidf(texts, tfidf_dim, seed=0, cache=pathlib.Path(cache_dir) / name if cache_dir is not None else None)
        logger.info("TF-IDF features of %d texts (%d dims) in %.1f s", len(texts), tfidf_dim, time.monotonic() - t0)
        return out

    return cached_array(cache_dir, name, "features", (len(texts), tfidf_dim), compute), kind


def planetoid_split(labels: np.ndarray, *, per_class: int = 20, n_val: int = 500, n_test: int = 1000,
                    seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Planetoid-style split: ``per_class`` train nodes of every class, then validation and test nodes.

    The train nodes are drawn per class (in class order) with ``numpy.random.default_rng(seed)``;
    validation and test are one permutation of the remaining nodes, its first ``n_val`` and the next
    ``n_test``. Each returned array is sorted.

    Raises
    ------
    ConfigError
        If a class has fewer than ``per_class`` nodes or too few nodes remain for ``n_val + n_test``.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train = []
    for c in range(int(labels.max()) + 1):
        members = np.flatnonzero(labels == c)
        if len(members) < per_class:
            raise ConfigError(f"planetoid split: class {c} has {len(members)} nodes, expected >= {per_class}")
        train.append(rng.choice(members, size=per_class, replace=False))
    train_idx = np.sort(np.concatenate(train)).astype(np.int64)
    rest = np.setdiff1d(np.arange(len(labels)), train_idx)
    if len(rest) < n_val + n_test:
        raise ConfigError(f"planetoid split: {len(rest)} nodes outside train, expected >= {n_val + n_test}")
    perm = rng.permutation(rest)
    return train_idx, np.sort(perm[:n_val]).astype(np.int64), np.sort(perm[n_val:n_val + n_test]).astype(np.int64)


@functools.lru_cache(maxsize=4)
def _read_graph(path: str, stamp: tuple[int, int],
                relations: frozenset[str] | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(labels, edges, texts)`` of a ``data.noun``, parsed once per process for each version of the file.

    ``stamp`` (modification time and size) keys the cache, so a changed file is read again. The
    caller copies the arrays.
    """
    synsets = read_data_file(path)
    other = [s for s in synsets if s.ss_type != "n"]
    if other:
        raise CorruptStoreError(f"WordNet data file {path}: synset {other[0].offset:08d} has ss_type "
                                f"{other[0].ss_type!r}; expected only nouns ('n') in data.noun")
    lex = np.asarray([s.lex_filenum for s in synsets], dtype=np.int64)
    outside = lex[(lex < FIRST_NOUN_LEXFILE) | (lex >= FIRST_NOUN_LEXFILE + len(NOUN_LEXNAMES))]
    if len(outside):
        raise CorruptStoreError(f"WordNet data file {path}: lex_filenum {int(outside[0])}; expected noun files "
                                f"{FIRST_NOUN_LEXFILE}-{FIRST_NOUN_LEXFILE + len(NOUN_LEXNAMES) - 1}")
    return lex - FIRST_NOUN_LEXFILE, wordnet_edges(synsets, relations), synset_texts(synsets)


def load_wordnet(data_dir: str | os.PathLike[str] | None = None, *, features: str = "auto",
                 wordnet_dir: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 relations: Collection[str] | None = None, tfidf_dim: int = 256,
                 split_seed: int = SPLIT_SEED, per_class: int = 20, n_val: int = 500,
                 n_test: int = 1000) -> PlanetoidGraph:
    """WordNet 3.0 nouns as a :class:`PlanetoidGraph` (classes: the 26 noun lexicographer files).

    Parameters
    ----------
    data_dir
        The project's data folder; ``<data_dir>/wordnet`` is one place searched for ``data.noun``
        (see :func:`find_wordnet_dir`).
    features
        ``"auto"``, ``"minilm"`` or ``"tfidf"`` (see :func:`gloss_features`).
    wordnet_dir
        Folder of ``data.noun`` (overrides the search).
    cache_dir
        Folder of the feature caches (``None``: the ``carls.data.cache`` location).
    relations
        Pointer symbols that make edges (``None``: all of :data:`NOUN_RELATIONS`).
    tfidf_dim
        Dimensions of TF-IDF features.
    split_seed, per_class, n_val, n_test
        The split (:func:`planetoid_split`); the defaults give the documented fixed split.

    Returns
    -------
    PlanetoidGraph
        ``name`` is ``"wordnet"``; 82,115 nodes, 26 classes, 520 train / 500 validation / 1,000 test.

    Raises
    ------
    StoreNotFoundError, CorruptStoreError, ConfigError
        See :func:`read_data_file`, :func:`find_wordnet_dir` and :func:`gloss_features`.
    """

    path = find_wordnet_dir(wordnet_dir, data_dir) / "data.noun"
    st = path.stat()
    keep = None if relations is None else frozenset(relations)
    labels, edges, texts = _read_graph(str(path.resolve()), (st.st_mtime_ns, st.st_size), keep)
    labels, edges = labels.copy(), edges.copy()
    x, kind = gloss_features(texts, features,
                             cache_dir=locations.cache_dir(given=cache_dir), tfidf_dim=tfidf_dim)
    train, val, test = planetoid_split(labels, per_class=per_class, n_val=n_val, n_test=n_test, seed=split_seed)
    logger.info("loaded WordNet nouns from %s: %d synsets, %d edges, %s features (%d dims)",
                path, len(labels), edges.shape[1], kind, x.shape[1])
    return PlanetoidGraph(name="wordnet", features=x, labels=labels, edges=edges, train=train, val=val, test=test)
