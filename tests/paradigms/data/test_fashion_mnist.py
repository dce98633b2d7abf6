"""Image loaders: IDX reading (good and damaged files), Fashion-MNIST when installed, the digits fallback."""

from __future__ import annotations

import gzip
import pathlib
import struct

import numpy as np
import pytest

from carls_dask.errors import ConfigError, CorruptStoreError, StoreNotFoundError
from carls_dask.paradigms.data.fashion_mnist import (
    fashion_mnist_dir,
    load_digits_images,
    load_fashion_mnist,
    load_images,
    read_idx,
)


def _write_idx(path: pathlib.Path, arr: np.ndarray, *, gz: bool = True) -> pathlib.Path:
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    raw = header + arr.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def test_read_idx_round_trip_plain_and_gzip(tmp_path: pathlib.Path) -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(_write_idx(tmp_path / "a.gz", arr)), arr)
    assert np.array_equal(read_idx(_write_idx(tmp_path / "a", arr, gz=False)), arr)


def test_read_idx_names_the_damaged_file(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(CorruptStoreError, match=r"IDX file .*bad: header"):
        read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(CorruptStoreError, match=r"payload of 3 bytes; shape \(10,\) .*needs 10"):
        read_idx(short)
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        read_idx(tmp_path / "missing.gz")


def test_a_folder_of_idx_files_loads_as_fashion_mnist(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    for part, n in (("train", 12), ("t10k", 5)):
        _write_idx(tmp_path / f"{part}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{part}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    data = load_fashion_mnist(tmp_path, n_train=8)
    assert data.x_train.shape == (8, 1, 28, 28) and data.x_test.shape == (5, 1, 28, 28)
    assert data.x_train.dtype == np.float32 and 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    assert data.y_test.tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(load_fashion_mnist(tmp_path, n_train=8).y_train, data.y_train)
    with pytest.raises(ConfigError, match=r"n_train: got 13; expected an int in \[1, 12\]"):
        load_fashion_mnist(tmp_path, n_train=13)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    assert fashion_mnist_dir(tmp_path) is None
    with pytest.raises(StoreNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)


@pytest.mark.skipif(fashion_mnist_dir() is None, reason="Debian's dataset-fashion-mnist is not installed")
def test_installed_fashion_mnist() -> None:
    data = load_fashion_mnist(n_train=1000, n_test=500)
    assert data.x_train.shape == (1000, 1, 28, 28) and data.y_test.shape == (500,)
    assert data.n_classes == 10 and set(np.unique(data.y_train)) == set(range(10))
    # the full training set has 6,000 images per class
    full = load_fashion_mnist()
    assert np.bincount(full.y_train).tolist() == [6000] * 10 and full.y_test.shape == (10_000,)


def test_digits_fallback_and_dispatch() -> None:
    d = load_digits_images(seed=1)
    assert d.x_train.shape[1:] == (1, 8, 8) and len(d.y_train) + len(d.y_test) == 1797
    small = load_images("digits", n_train=100, n_test=50, seed=1)
    assert small.x_train.shape == (100, 1, 8, 8) and small.y_test.shape == (50,)
    with pytest.raises(ConfigError, match="unknown data set 'cifar'"):
        load_images("cifar")
