"""Small image classification data sets read from local files: Fashion-MNIST, and scikit-learn's digits.

Fashion-MNIST (70,000 grey 28x28 images of 10 clothing classes) ships in Debian's
``dataset-fashion-mnist`` package as the four IDX files ``train-images-idx3-ubyte.gz``,
``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz``
under ``/usr/share/datasets/fashion-mnist/``. Nothing is downloaded: the folder is the ``data_dir``
argument, else the ``carls.data.fashion-mnist`` location (its environment variable ``CARLS_FASHION_MNIST``,
else the Debian path; see :mod:`carls_dask.locations`).

scikit-learn's bundled 8x8 digits (1,797 images) are the always-present fallback for quick runs and
unit tests (:func:`load_digits_images`).
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import os
import pathlib
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError, CorruptStoreError, StoreNotFoundError
from carls_dask.locations import locate, resolve

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR",
    "ImageData",
    "fashion_mnist_dir",
    "load_digits_images",
    "load_fashion_mnist",
    "load_images",
    "read_idx",
]

logger = logging.getLogger(__name__)

#: Where Debian's ``dataset-fashion-mnist`` installs the IDX files (the location's default).
FASHION_MNIST_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = ("t-shirt/top", "trouser", "pullover", "dress", "coat",
                         "sandal", "shirt", "sneaker", "bag", "ankle boot")
_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_DTYPES: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


@dataclasses.dataclass(frozen=True)
class ImageData:
    """A train/test split of a small image classification data set.

    Attributes
    ----------
    name
        ``"fashion-mnist"`` or ``"digits"``.
    x_train, x_test
        ``float32[n, 1, h, w]`` images scaled to [0, 1].
    y_train, y_test
        ``int64[n]`` class labels (clean: label noise is added by the caller, on the training set only).
    classes
        Class names, indexed by label.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: tuple[str, ...]

    @property
    def n_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, ...]:
        """``(channels, height, width)`` of one image."""
        return tuple(int(s) for s in self.x_train.shape[1:])


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a numpy array.

    Raises
    ------
    StoreNotFoundError
        If the file does not exist.
    CorruptStoreError
        If the header is not an IDX header or the payload has the wrong size.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise StoreNotFoundError(f"IDX file {p} does not exist")
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:
        raise CorruptStoreError(f"IDX file {p}: could not be read ({exc})") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise CorruptStoreError(f"IDX file {p}: header {raw[:4]!r}; expected 0x00 0x00 <type code> <ndim>")
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    ndim = raw[3]
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise CorruptStoreError(f"IDX file {p}: {len(raw)} bytes; the header alone needs {head}")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - head != expected:
        raise CorruptStoreError(f"IDX file {p}: payload of {len(raw) - head} bytes; shape {shape} of {dtype} "
                                f"needs {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=head).reshape(shape).astype(dtype.newbyteorder("="))


def fashion_mnist_dir(data_dir: str | os.PathLike[str] | None = None) -> pathlib.Path | None:
    """The folder holding the four Fashion-MNIST IDX files, or ``None`` when they are not there.

    Raises
    ------
    StoreNotFoundError
        If the folder was set (``data_dir``, ``carls.data.fashion-mnist`` or ``$CARLS_FASHION_MNIST``) and
        does not exist.
    """
    loc = locate("fashion-mnist", data_dir, given_as="the data_dir setting")
    if loc.explicit:
        resolve("fashion-mnist", data_dir, given_as="the data_dir setting")  # a folder that was set must exist
    folder = loc.path
    if folder is not None and all(_find(folder, stem) is not None for stem in _FILES.values()):
        return folder
    return None


def _find(folder: pathlib.Path, stem: str) -> pathlib.Path | None:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def _subset(n_total: int, n: int | None, rng: np.random.Generator, what: str) -> np.ndarray:
    if n is None:
        return np.arange(n_total)
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= n_total:
        raise ConfigError(f"{what}: got {n!r}; expected an int in [1, {n_total}] or None for all")
    return np.sort(rng.permutation(n_total)[:n])


def load_fashion_mnist(data_dir: str | os.PathLike[str] | None = None, *, n_train: int | None = None,
                       n_test: int | None = None, seed: int = 0) -> ImageData:
    """Load Fashion-MNIST from its IDX files, optionally a random subset of each split.

    Parameters
    ----------
    data_dir
        Folder of the IDX files; default the ``carls.data.fashion-mnist`` location.
    n_train, n_test
        Images to keep from the 60,000 training and 10,000 test images (a seeded random subset, in
        file order); ``None`` keeps all.
    seed
        Seed of the subset choice.

    Raises
    ------
    StoreNotFoundError
        If no folder with the four files is found (install Debian's ``dataset-fashion-mnist``).
    CorruptStoreError
        If a file is damaged or the images and labels disagree in number.
    """
    folder = fashion_mnist_dir(data_dir)
    if folder is None:
        loc = locate("fashion-mnist", data_dir, given_as="the data_dir setting")
        raise StoreNotFoundError(f"Fashion-MNIST: {loc} holds no {sorted(_FILES.values())} (optionally .gz); "
                                 f"install the Debian package dataset-fashion-mnist or set {loc.how_to_set()}")
    arrays = {}
    for key, stem in _FILES.items():
        found = _find(folder, stem)
        assert found is not None
        arrays[key] = read_idx(found)
    rng = np.random.default_rng(seed)
    out = {}
    for part, n in (("train", n_train), ("test", n_test)):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise CorruptStoreError(f"Fashion-MNIST in {folder}: {part} images {images.shape} and labels "
                                    f"{labels.shape}; expected [n, 28, 28] and [n]")
        idx = _subset(labels.shape[0], n, rng, f"load_fashion_mnist n_{part}")
        out[f"x_{part}"] = (images[idx, None, :, :].astype(np.float32) / 255.0)
        out[f"y_{part}"] = labels[idx].astype(np.int64)
    logger.info("Fashion-MNIST from %s: %d train, %d test images", folder, len(out["y_train"]), len(out["y_test"]))
    return ImageData("fashion-mnist", out["x_train"], out["y_train"], out["x_test"], out["y_test"],
                     FASHION_MNIST_CLASSES)


def _cap(n: int | None, total: int) -> int | None:
    return n if n is None or isinstance(n, bool) or not isinstance(n, int) else min(n, total)


def load_digits_images(*, test_fraction: float = 0.25, seed: int = 0) -> ImageData:
    """scikit-learn's 8x8 digits as ``[n, 1, 8, 8]`` images in [0, 1], split at random into train and test."""
    from sklearn.datasets import load_digits

    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"load_digits_images: test_fraction={test_fraction!r}; expected a value in (0, 1)")
    data = load_digits()
    x = (data.images[:, None, :, :] / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = round(len(y) * test_fraction)
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    return ImageData("digits", x[train], y[train], x[test], y[test], tuple(str(i) for i in range(10)))


def load_images(name: str, *, n_train: int | None = None, n_test: int | None = None, seed: int = 0,
                data_dir: str | os.PathLike[str] | None = None) -> ImageData:
    """Load ``"fashion-mnist"`` or ``"digits"`` (for digits, ``n_train``/``n_test`` cap the split sizes)."""
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir, n_train=n_train, n_test=n_test, seed=seed)
    if name == "digits":
        d = load_digits_images(seed=seed)
        rng = np.random.default_rng(seed)
        tr = _subset(len(d.y_train), _cap(n_train, len(d.y_train)), rng, "load_images('digits') n_train")
        te = _subset(len(d.y_test), _cap(n_test, len(d.y_test)), rng, "load_images('digits') n_test")
        return dataclasses.replace(d, x_train=d.x_train[tr], y_train=d.y_train[tr], x_test=d.x_test[te],
                                   y_test=d.y_test[te])
    raise ConfigError(f"load_images: unknown data set {name!r}; expected 'fashion-mnist' or 'digits'")
