"""The exception hierarchy: one root, subclasses that also refine the builtins."""

from __future__ import annotations

import inspect

import pytest

from carls_dask import errors


def _classes() -> list[type[BaseException]]:
    return [
        obj
        for name, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BaseException) and name in errors.__all__
    ]


def test_every_error_derives_from_the_root() -> None:
    classes = _classes()
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, errors.CarlsError), cls


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (errors.ConfigError, ValueError),
        (errors.InvalidShapeError, ValueError),
        (errors.InvalidDTypeError, TypeError),
        (errors.UnknownTableError, KeyError),
        (errors.StoreNotFoundError, FileNotFoundError),
        (errors.StoreLockedError, PermissionError),
        (errors.DeadlineExceeded, TimeoutError),
        (errors.ShardLostError, RuntimeError),
    ],
)
def test_errors_refine_builtins(cls: type[BaseException], builtin: type[BaseException]) -> None:
    assert issubclass(cls, builtin)
    with pytest.raises(builtin):
        raise cls("x")


def test_key_errors_keep_a_readable_message() -> None:
    assert str(errors.UnknownTableError("table 'emb' not found")) == "table 'emb' not found"
