"""The exception hierarchy: one root, subclasses that also refine the builtins."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import types
import typing

import pytest

from carls_dask import errors
from tests.sources import ROOT, package_modules


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
        assert cls.__module__ == "carls_dask.errors", cls
        if cls is errors.RunInterrupted:  # a Ctrl-C: no `except Exception` may swallow it
            assert issubclass(cls, KeyboardInterrupt) and not issubclass(cls, Exception)
        else:
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


# -- every raise of the library raises a class of carls_dask.errors ---------------------------------------------
#: Functions whose result a ``raise`` may take although not every result is of the tree: each hands back the
#: caught exception it was given when it has nothing better to say about it.
PASS_THROUGH = {
    "carls_dask.bank.actor_internals.shard_error":
        "distributed's lost-actor and timeout errors become ShardLostError / DeadlineExceeded; any other error "
        "is the caught one, returned to be re-raised",
}


def _of_the_tree(cls: object) -> bool:
    """Whether ``cls`` is a class defined in :mod:`carls_dask.errors` (a loader's or a store's error class
    defined elsewhere, even one derived from :class:`~carls_dask.errors.CarlsError`, is not)."""
    return inspect.isclass(cls) and cls.__module__ == "carls_dask.errors" and cls.__name__ in errors.__all__


def _tree_classes(value: object) -> bool:
    """Whether ``value`` (a class or a ``X | Y`` of classes) names only classes of the errors tree."""
    members = typing.get_args(value) if isinstance(value, types.UnionType) else (value,)
    return all(_of_the_tree(m) for m in members)


def _lookup(expr: ast.expr, namespace: dict[str, object]) -> object:
    """The object a dotted name (``X``, ``errors.X``) names in ``namespace`` or the builtins; KeyError if none."""
    if isinstance(expr, ast.Name):
        if expr.id in namespace:
            return namespace[expr.id]
        if hasattr(builtins, expr.id):
            return getattr(builtins, expr.id)
        raise KeyError(expr.id)
    if isinstance(expr, ast.Attribute):
        try:
            return getattr(_lookup(expr.value, namespace), expr.attr)
        except AttributeError:
            raise KeyError(ast.unparse(expr)) from None
    raise KeyError(ast.unparse(expr))


def _bound_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names a function binds: its parameters, ``except ... as`` names, assignment and loop targets."""
    names = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    names |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def bad_raises(tree: ast.Module, namespace: dict[str, object], module: str) -> list[tuple[int, str]]:
    """``(line, why)`` for each ``raise`` in ``tree`` of an exception not from the errors tree.

    ``raise X(...)`` / ``raise X``: ``X`` must be a class of :mod:`carls_dask.errors`. ``raise f(...)``
    with ``f`` a function (module-level, nested or a method of the enclosing class): ``f``'s return
    annotation must name such classes. ``raise exc`` with ``exc`` a name the function binds, or
    ``raise self.exc`` / ``raise result["exception"]``: the re-raise of an exception caught or handed
    over, allowed. A bare ``raise`` re-raises too.
    """
    out: list[tuple[int, str]] = []

    def annotation_ok(fn: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> str | None:
        if f"{module}.{qualname}" in PASS_THROUGH:
            return None
        if fn.returns is None:
            return f"{qualname}() has no return annotation naming an error class"
        try:
            value = eval(ast.unparse(fn.returns), dict(namespace))  # a name or a union of names of the module
        except NameError as exc:
            return f"{qualname}() returns {ast.unparse(fn.returns)}, which does not resolve ({exc})"
        return None if _tree_classes(value) else f"{qualname}() returns {ast.unparse(fn.returns)}, not a carls_dask.errors class"

    def check(node: ast.Raise, scopes: list[ast.AST]) -> str | None:
        exc = node.exc
        if exc is None:
            return None
        functions = [s for s in scopes if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
        classes = [s for s in scopes if isinstance(s, ast.ClassDef)]
        target = exc.func if isinstance(exc, ast.Call) else exc
        # a helper that builds the error: a function of an enclosing scope, or a method of the enclosing class
        if isinstance(exc, ast.Call) and isinstance(target, ast.Name):
            for scope in [*reversed(functions), tree]:
                for fn in ast.iter_child_nodes(scope):
                    if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name == target.id:
                        return annotation_ok(fn, fn.name)
        if (isinstance(exc, ast.Call) and isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id in ("self", "cls") and classes):
            for fn in classes[-1].body:
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name == target.attr:
                    return annotation_ok(fn, f"{classes[-1].name}.{fn.name}")
        if isinstance(target, ast.Name) and not isinstance(exc, ast.Call) and functions \
                and target.id in _bound_names(functions[-1]):
            return None  # raise exc: an exception the function caught or was handed
        try:
            value = _lookup(target, namespace)
        except KeyError:
            if isinstance(exc, ast.Call):
                return f"raise of {ast.unparse(target)}(...), which does not resolve"
            return None  # raise self.exc, raise result["exception"]: an exception object handed over
        if inspect.isclass(value):
            return None if _of_the_tree(value) else f"raises {value.__name__}, not a carls_dask.errors class"
        if callable(value) and isinstance(exc, ast.Call):
            qualname = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
            if qualname in PASS_THROUGH:
                return None
            try:
                hint = typing.get_type_hints(value).get("return")
            except Exception as err:
                return f"{qualname}() has a return annotation that does not resolve ({err})"
            return None if hint is not None and _tree_classes(hint) else f"{qualname}() does not return a carls_dask.errors class"
        return f"raise of {ast.unparse(exc)}, which is neither an error class nor a caught exception"

    def walk(node: ast.AST, scopes: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Raise) and (why := check(child, scopes)) is not None:
                out.append((child.lineno, why))
            inner = [*scopes, child] if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else scopes
            walk(child, inner)

    walk(tree, [])
    return out


def test_every_raise_of_the_library_raises_a_class_of_the_errors_tree() -> None:
    found, bad = 0, []
    for name, path in package_modules().items():
        tree = ast.parse(path.read_text(), str(path))
        raises = sum(isinstance(n, ast.Raise) for n in ast.walk(tree))
        if not raises:
            continue
        found += raises
        namespace = vars(importlib.import_module(name))
        bad += [f"{path.relative_to(ROOT)}:{line}: {why}" for line, why in bad_raises(tree, namespace, name)]
    assert found > 500, f"only {found} raise statements found; is the source walk broken?"
    assert not bad, "raises outside carls_dask.errors:\n" + "\n".join(bad)


def test_the_raise_walk_tells_errors_of_the_tree_from_others() -> None:
    """The walk flags what it must flag and lets through the tree's classes, its builders and re-raises."""
    source = '''
from carls_dask.errors import ConfigError
from carls_dask import errors

def built(x) -> ConfigError:
    return ConfigError(x)

def untyped(x):
    return ConfigError(x)

def f(x):
    if x == 0:
        raise ConfigError("ok")
    if x == 1:
        raise errors.StoreNotFoundError("ok")
    if x == 2:
        raise ValueError("builtin")
    if x == 3:
        raise NotImplementedError
    if x == 4:
        raise built("ok")
    if x == 5:
        raise untyped("no annotation")
    if x == 6:
        raise ElsewhereError("a separate tree")
    try:
        pass
    except OSError as exc:
        raise exc
    except KeyError:
        raise

class C:
    def _bad(self) -> KeyError:
        return KeyError("x")

    def g(self):
        raise self._bad()

    def h(self):
        raise self.stored
'''
    class ElsewhereError(errors.CarlsError, ValueError):
        """Derived from the root, but defined outside carls_dask.errors."""

    namespace: dict[str, object] = {"ConfigError": errors.ConfigError, "errors": errors, "ElsewhereError": ElsewhereError}
    tree = ast.parse(source)
    lines = source.splitlines()
    flagged = {lines[line - 1].strip(): why for line, why in bad_raises(tree, namespace, "m")}
    assert set(flagged) == {'raise ValueError("builtin")', "raise NotImplementedError",
                            'raise untyped("no annotation")', "raise self._bad()",
                            'raise ElsewhereError("a separate tree")'}
    assert flagged["raise self._bad()"] == "C._bad() returns KeyError, not a carls_dask.errors class"


def test_the_loader_errors_are_of_the_tree() -> None:
    from carls_dask import loading

    for cls in (loading.LoaderError, loading.ProducerLost, loading.ConsumerDetached, loading.LoaderClosed):
        assert cls is getattr(errors, cls.__name__)
        assert issubclass(cls, errors.CarlsError) and issubclass(cls, RuntimeError)
