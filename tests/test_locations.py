"""One rule for data locations (``carls_dask.locations``): argument, then the ``carls.data.*`` key, then its
environment variable, then the default; a location that was set and does not exist is an error naming it."""

from __future__ import annotations

import pathlib

import dask
import pytest

from carls_dask import locations
from carls_dask.errors import StoreNotFoundError
from carls_dask.locations import LOCATIONS, cache_dir, checkout_root, locate, resolve
from carls_dask.paradigms.data.fashion_mnist import fashion_mnist_dir
from carls_dask.paradigms.data.planetoid import find_data_dir
from carls_dask.paradigms.data.sentences import sentence_model_path
from carls_dask.paradigms.data.wordnet import find_wordnet_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_location_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in locations.ENVIRONMENT.values():
        monkeypatch.delenv(env, raising=False)


def test_the_argument_then_the_key_then_the_variable_then_the_default(tmp_path: pathlib.Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for part in ("arg", "key", "env"):
        (tmp_path / part / "planetoid").mkdir(parents=True)
    assert locate("dir").source == "the default" and not locate("dir").explicit
    monkeypatch.setenv("CARLS_DATA_DIR", str(tmp_path / "env"))
    assert find_data_dir() == tmp_path / "env" and str(locate("dir")) == f"{tmp_path / 'env'} ($CARLS_DATA_DIR)"
    with dask.config.set({"carls.data.dir": str(tmp_path / "key")}):
        assert find_data_dir() == tmp_path / "key" and locate("dir").source == "carls.data.dir"
        assert find_data_dir(tmp_path / "arg") == tmp_path / "arg"


@pytest.mark.parametrize("name", sorted(LOCATIONS))
def test_a_location_that_was_set_and_does_not_exist_is_an_error_naming_it(name: str, tmp_path: pathlib.Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "typo"
    with dask.config.set({f"carls.data.{name}": str(missing)}):
        with pytest.raises(StoreNotFoundError, match=rf"^{missing}, set by carls\.data\.{name}, does not exist"):
            resolve(name)
    env = locations.ENVIRONMENT.get(name)
    if env:  # never silently the default instead
        monkeypatch.setenv(env, str(missing))
        with pytest.raises(StoreNotFoundError, match=rf"^{missing}, set by \${env}, does not exist"):
            resolve(name)


def test_each_reader_refuses_a_missing_folder_that_was_set(tmp_path: pathlib.Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    missing = str(tmp_path / "nowhere")
    monkeypatch.setenv("CARLS_DATA_DIR", missing)
    with pytest.raises(StoreNotFoundError, match=r"set by \$CARLS_DATA_DIR, does not exist"):
        find_data_dir()
    monkeypatch.setenv("CARLS_FASHION_MNIST", missing)
    with pytest.raises(StoreNotFoundError, match=r"set by \$CARLS_FASHION_MNIST, does not exist"):
        fashion_mnist_dir()
    assert fashion_mnist_dir(tmp_path) is None  # there, but without the files: the loader names them
    monkeypatch.setenv("WNSEARCHDIR", missing)
    with pytest.raises(StoreNotFoundError, match=r"set by \$WNSEARCHDIR, does not exist"):
        find_wordnet_dir()
    with pytest.raises(StoreNotFoundError, match=rf"WordNet folder {tmp_path} \(the wordnet_dir argument\): holds no "
                                                 r"data.noun"):
        find_wordnet_dir(tmp_path)
    monkeypatch.setenv("CARLS_CACHE_DIR", missing)
    with pytest.raises(StoreNotFoundError, match=r"set by \$CARLS_CACHE_DIR, does not exist"):
        cache_dir("multimodal")
    with dask.config.set({"carls.data.sentence-encoder": missing}):
        with pytest.raises(StoreNotFoundError, match=r"set by carls\.data\.sentence-encoder, does not exist"):
            sentence_model_path()


def test_the_defaults_beside_a_checkout_and_in_an_installed_package(tmp_path: pathlib.Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert checkout_root() == ROOT
    assert locate("dir").path == ROOT.parent / "shared" / "data"
    monkeypatch.setattr(locations, "checkout_root", lambda: None)  # as in a wheel: site-packages, no pyproject.toml
    with pytest.raises(StoreNotFoundError, match=r"no folder of the data sets \(planetoid/cora.npz, .*\) is configured "
                                                 r".*: set carls\.data\.dir \(or the environment variable "
                                                 r"CARLS_DATA_DIR\) to it"):
        find_data_dir()
    # the cache's default is made on first use, under the home folder
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir("multimodal") == tmp_path / ".cache" / "carls-dask" / "multimodal"
    assert (tmp_path / ".cache" / "carls-dask" / "multimodal").is_dir()


def test_wordnet_defaults_to_the_data_folders_copy(tmp_path: pathlib.Path) -> None:
    (tmp_path / "wordnet").mkdir()
    (tmp_path / "wordnet" / "data.noun").write_text("")
    assert locate("wordnet", data_dir=tmp_path).path == tmp_path / "wordnet"
    with dask.config.set({"carls.data.dir": str(tmp_path)}):
        assert locate("wordnet").path == tmp_path / "wordnet"
    assert locate("wordnet", data_dir=tmp_path / "other").path == pathlib.Path("/usr/share/wordnet")


def test_the_multimodal_cache_follows_the_cache_key(tmp_path: pathlib.Path) -> None:
    from carls_dask.paradigms.multimodal.paradigm import MULTIMODAL_CACHE

    with dask.config.set({"carls.data.cache": str(tmp_path)}):
        assert cache_dir(MULTIMODAL_CACHE) == tmp_path / "multimodal"
        assert cache_dir(MULTIMODAL_CACHE, tmp_path) == tmp_path  # a cache_dir setting is used as it is
