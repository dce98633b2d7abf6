"""Every paradigm package has one shape (docs/writing-a-paradigm.md): the same modules hold the same parts."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil

import pytest

import carls_dask.paradigms
from carls_dask.runtime import Paradigm
from carls_dask.runtime.registry import ENTRY_POINT_GROUP

#: The modules every paradigm package has, and what each holds.
SHAPE = {
    "settings": "the settings dataclass",
    "paradigm": "the Paradigm subclass",
    "loops": "the trainers and makers",
    "models": "the torch modules",
    "data": "what the loops read",
    "tables": "the bank tables",
}
#: Subpackages of carls_dask.paradigms that are not paradigms.
NOT_PARADIGMS = {"data"}

PACKAGES = sorted(m.name for m in pkgutil.iter_modules(carls_dask.paradigms.__path__)
                  if m.ispkg and m.name not in NOT_PARADIGMS)


def test_the_three_paradigms_are_found() -> None:
    assert set(PACKAGES) >= {"semi_supervised", "curriculum", "multimodal"}


@pytest.mark.parametrize("name", PACKAGES)
def test_a_paradigm_package_has_the_shared_shape(name: str) -> None:
    package = importlib.import_module(f"carls_dask.paradigms.{name}")
    folder = pathlib.Path(package.__file__).parent
    missing = [f"{module}.py ({what})" for module, what in SHAPE.items() if not (folder / f"{module}.py").is_file()]
    assert not missing, f"carls_dask.paradigms.{name} lacks {missing}"
    module = importlib.import_module(f"carls_dask.paradigms.{name}.paradigm")
    classes = [c for _, c in inspect.getmembers(module, inspect.isclass)
               if issubclass(c, Paradigm) and c is not Paradigm and c.__module__ == module.__name__]
    assert len(classes) == 1, f"{module.__name__} defines {classes}; expected one Paradigm subclass"
    paradigm = classes[0]
    settings = paradigm.settings_type
    assert settings.__module__ == f"carls_dask.paradigms.{name}.settings", (
        f"{paradigm.__name__}'s settings {settings.__name__} live in {settings.__module__}")
    assert settings.__name__ == f"{paradigm.__name__}Settings"
    for cls in (paradigm, settings):  # the package exports both
        assert getattr(package, cls.__name__, None) is cls and cls.__name__ in package.__all__, (
            f"carls_dask.paradigms.{name} does not export {cls.__name__}")


def test_every_paradigm_is_registered_from_its_paradigm_module() -> None:
    import importlib.metadata

    targets = {ep.value.partition(":")[0] for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for name in PACKAGES:
        assert f"carls_dask.paradigms.{name}.paradigm" in targets, f"no {ENTRY_POINT_GROUP} entry point for {name}"
