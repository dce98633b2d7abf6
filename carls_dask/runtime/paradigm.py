"""The paradigm contract: what a learning paradigm gives the runner, and nothing about how it is run.

A paradigm is a subclass of :class:`Paradigm` that names:

- ``settings_type``: a typed, documented settings dataclass, validated on construction;
- ``variants``: named settings overrides (a baseline and the variants compared against it);
- :meth:`Paradigm.tables`: the bank tables it needs (none: no bank);
- :meth:`Paradigm.loops`: its trainers (the first is the primary one: its step is the run's step)
  and knowledge makers;
- :meth:`Paradigm.summarize`: the figures of a finished run, from the loops' results;
- optionally :meth:`Paradigm.prepare` (checks and resolves data on the client before a cluster
  starts), :meth:`Paradigm.initialise` (fills the bank before the loops start) and
  :meth:`Paradigm.write_artifacts` (extra files of the run folder, such as held-out truth).

:func:`carls_dask.runtime.runner.run_paradigm` runs it on a Workbench and
:func:`carls_dask.runtime.runner.run_inline` in this process in lock step; ``carls-dask run NAME``
finds it through the ``carls_dask.paradigms`` entry-point group. ``docs/writing-a-paradigm.md``
builds one.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from carls_dask.errors import ConfigError, HookNotImplementedError
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.settings import describe_settings, get_setting, settings_from_options, settings_values
from carls_dask.runtime.trainer import Trainer

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["Paradigm"]


#: The settings class of a paradigm (a dataclass; :attr:`Paradigm.settings_class`).
SettingsT = TypeVar("SettingsT")


class Paradigm(Generic[SettingsT]):
    """Base class of a learning paradigm; subclass it and set the class attributes.

    Attributes
    ----------
    name
        The name ``carls-dask run`` knows it by.
    description
        One line on what it learns.
    settings_type
        The settings dataclass. It must have ``steps`` (the primary trainer's steps) and ``seed``
        fields, and validate itself in ``__post_init__``.
    variants
        Named overrides of the settings' defaults; the first is the default variant unless
        ``default_variant`` says otherwise.
    default_variant
        The variant a run uses when none is named.
    headline
        Names of the figures printed when a run ends.
    unprefixed
        Series the metric store also gets without the loop's name, by loop kind (the names
        dashboards read): ``{"trainer": ("pacing", ...), "maker": ("pl_precision", ...)}``.
    cumulative
        Figures that count over the whole run (rounds, steps, lookups), as ``fnmatch`` patterns: a
        run extended with ``carls-dask run --resume RUN --steps N`` adds them up over its segments,
        where every other figure is the newest segment's.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    settings_type: ClassVar[type] = object
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {"default": {}}
    default_variant: ClassVar[str | None] = None
    headline: ClassVar[tuple[str, ...]] = ()
    unprefixed: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    cumulative: ClassVar[tuple[str, ...]] = ()

    # -- settings ----------------------------------------------------------------------------
    def variant_name(self, variant: str | None) -> str:
        """``variant``, or the default one; raises :class:`ConfigError` for an unknown name."""
        if variant is None:
            return self.default_variant or next(iter(self.variants))
        if variant not in self.variants:
            raise ConfigError(f"paradigm {self.name!r}: unknown variant {variant!r}; expected one of {list(self.variants)}")
        return variant

    def settings(self, variant: str | None = None, options: Mapping[str, str] | None = None,
                 **overrides: Any) -> Any:
        """The settings of ``variant`` with ``overrides`` (typed values) and ``options`` (``key=value`` strings).

        Settings are named as on the command line: ``group.field`` inside a group (as an override,
        ``**{"pseudo.weight": 2}`` or the group whole, ``pseudo={"weight": 2}``), and the old names the
        settings class keeps in ``renamed`` still work.

        Raises
        ------
        ConfigError
            For an unknown variant or setting, or a value the settings reject.
        """
        name = self.variant_name(variant)
        owner = f"paradigm {self.name!r}"
        base = {**settings_values(self.settings_type, self.variants[name], owner=owner),
                **settings_values(self.settings_type, overrides, owner=owner)}
        return settings_from_options(self.settings_type, options or {}, base=base, owner=owner)

    def variant_of(self, settings: SettingsT) -> str:
        """The variant ``settings`` are closest to: most of its overrides matched, fewest contradicted.

        Settings built from a variant and then changed (a smaller batch, another ``k``) still name
        that variant; ties go to the default variant.
        """
        default = self.variant_name(None)

        def score(name: str) -> tuple[int, int]:
            over = self.variants[name]
            same = sum(_value(settings, k) == v for k, v in over.items())
            return same - (len(over) - same), int(name == default)

        return max(self.variants, key=score)

    def describe(self, variant: str | None = None, options: Mapping[str, str] | None = None) -> list[Any]:
        """Every setting with its type, default and meaning: the default is the value a run of ``variant``
        with ``options`` (``key=value`` strings, such as ``{"dataset": "citeseer"}``) really uses, presets
        of the data set included."""
        return describe_settings(self.settings_type, self.settings(variant, options))

    # -- what a run is made of --------------------------------------------------------------
    def prepare(self, settings: SettingsT) -> Any:
        """Check and resolve what the loops need (data folders...) on the client; returns the settings to run.

        Runs before any cluster starts, so a missing data set fails fast. Default: unchanged.
        """
        return settings

    def tables(self, settings: SettingsT) -> Sequence[Any]:
        """The :class:`~carls_dask.bank.TableSpec` of every bank table; empty runs without a bank."""
        return []

    def loops(self, settings: SettingsT) -> Sequence[Trainer | KnowledgeMaker]:
        """The trainers, then the knowledge makers. The first trainer is the primary one."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement loops()")

    def initialise(self, bank: KnowledgeBank, settings: SettingsT) -> None:
        """Fill the bank before the loops start (runs as a task on the cluster, or in-process). Default: nothing."""

    def write_artifacts(self, settings: SettingsT, run_dir: pathlib.Path) -> None:
        """Write extra files of the run folder (e.g. ``truth.npz``) before the loops start. Default: none."""

    def summarize(self, settings: SettingsT, results: Mapping[str, LoopResult]) -> dict[str, Any]:
        """The figures of a finished run. Default: the primary trainer's ``finish()`` value when it is a mapping."""
        for result in results.values():
            if result.kind == "trainer" and isinstance(result.value, Mapping):
                return dict(result.value)
        return {}

    def missing_reasons(self, settings: SettingsT, results: Mapping[str, LoopResult],
                        missing: Sequence[str]) -> dict[str, str]:
        """Why each figure named in ``missing`` has no value, in the words of the settings a user can change.

        ``result.json`` holds these beside the figures (``null``) and ``carls-dask run`` prints them for
        the headline figures. The default names the makers that made no round in the run's steps
        (their figures need at least one); a paradigm overrides it for figures with their own needs.
        """
        trainer = next((r for r in results.values() if r.kind == "trainer"), None)
        idle = sorted(n for n, r in results.items() if r.kind == "maker" and not r.rounds)
        steps = f"{trainer.steps} trainer steps" if trainer is not None else "this run"
        if idle:
            why = (f"not measured: {', '.join(repr(n) for n in idle)} made no round in {steps} (a maker works on "
                   "each model version the trainer publishes; run more steps or publish more often)")
        else:
            why = f"not measured in {steps}"
        return {name: why for name in missing}

    def __repr__(self) -> str:
        return f"<Paradigm {self.name!r} variants {list(self.variants)}>"


def _value(settings: Any, name: str) -> Any:
    """Setting ``name`` of ``settings`` (an old name read as its new one), ``None`` when it has none."""
    try:
        key = dict(getattr(type(settings), "renamed", {})).get(name, name)
        return get_setting(settings, key)
    except AttributeError:
        return None
