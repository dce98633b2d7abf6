"""The curriculum's augmentation and shared loading: the same images and the same run as separate loading."""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import numpy as np
import pytest

from carls_dask.errors import ConfigError
from carls_dask.paradigms.curriculum import Curriculum, CurriculumSettings
from carls_dask.paradigms.curriculum.augment import augment_images, augmentation_draws
from carls_dask.paradigms.curriculum.feed import CurriculumFeed, LoadingOptions, loader_name
from carls_dask.runtime import run_inline
from tests.processes import wait_for

SHM = pathlib.Path("/dev/shm")


def _settings(**kw: Any) -> CurriculumSettings:
    base: dict[str, Any] = dict(dataset="digits", noise=0.3, steps=120, batch_size=64, hidden=32, lr=3e-3,
                                publish_every=20, refresh_every=10, warmup=0.2, clean_confidence=0.6,
                                clean_rounds=2, pacing_start=0.25, threads=1, makers=2, augment=True)
    base.update(kw)
    settings: CurriculumSettings = Curriculum().settings("curriculum+clean", **base)
    return settings


def _leftovers(settings: CurriculumSettings) -> list[str]:
    name = loader_name(settings)
    return sorted(p.name for p in SHM.iterdir() if p.name.startswith(name))


def _cleaned_up(settings: CurriculumSettings | None = None) -> None:
    """The loader of ``settings`` (default: the tests' shared settings) closes once its last reader left:
    wait for that (bounded)."""
    s = settings or _settings(shared_loading="on")
    wait_for(lambda: not _leftovers(s), "the curriculum's shared loader removed from /dev/shm", 20)


def test_augmenting_a_subset_gives_the_rows_of_augmenting_all() -> None:
    x = np.random.default_rng(0).random((400, 1, 8, 8)).astype(np.float32)
    full = augment_images(x, seed=3, epoch=2)
    rows = slice(1, None, 3)
    assert np.array_equal(augment_images(x[rows], seed=3, epoch=2, rows=rows, n=400), full[rows])
    idx = np.array([4, 0, 33])
    assert np.array_equal(augment_images(x[idx], seed=3, epoch=2, rows=idx, n=400), full[idx])
    assert not np.array_equal(full, augment_images(x, seed=3, epoch=3))  # each epoch differs
    assert not np.array_equal(full, x)
    dy, dx, flip = augmentation_draws(400, 3, 2)
    i = int(np.flatnonzero((dy == 0) & (dx == 0) & ~flip)[0])
    assert np.array_equal(full[i], x[i])  # no shift, no flip: the image itself
    j = int(np.flatnonzero((dy == 0) & (dx == 0) & flip)[0])
    assert np.array_equal(full[j], x[j, :, :, ::-1])


def test_augmentation_refuses_bad_input() -> None:
    x = np.zeros((4, 1, 8, 8), np.float32)
    with pytest.raises(ConfigError, match=r"augment_images: images of shape \[4, 8, 8\]"):
        augment_images(x[:, 0], seed=0, epoch=0)
    with pytest.raises(ConfigError, match="epoch=-1; expected an int >= 0"):
        augment_images(x, seed=0, epoch=-1)
    with pytest.raises(ConfigError, match="rows given without n"):
        augment_images(x, seed=0, epoch=0, rows=slice(0, 4))
    with pytest.raises(ConfigError, match=r"out is float64\[4, 1, 8, 8\]"):
        augment_images(x, seed=0, epoch=0, out=np.zeros((4, 1, 8, 8)))


@pytest.mark.timeout(60)
def test_a_shared_feed_reads_the_images_a_separate_feed_makes() -> None:
    s_sep, s_shared = _settings(shared_loading="off"), _settings(shared_loading="on")
    separate = CurriculumFeed(s_sep, "maker-1")
    owner = CurriculumFeed(s_shared, "maker-0", LoadingOptions(slots=2))
    other = CurriculumFeed(s_shared, "trainer", LoadingOptions(slots=2))
    try:
        assert owner.producer is not None and other.producer is None and other.shared
        assert (SHM / loader_name(s_shared)).exists()
        rows = slice(1, None, 2)
        for e in (0, 1, 2):
            got = other.images(e)
            assert np.shares_memory(got, other.images(e))  # a view of the segment
            assert np.array_equal(got, augment_images(separate.data.images.x_train, seed=0, epoch=e))
            assert np.array_equal(owner.images(e, rows), separate.images(e, rows))
            assert other.intact()
        assert np.array_equal(other.data.labels.labels, separate.data.labels.labels)
        assert np.array_equal(other.data.images.x_test, separate.data.images.x_test)
    finally:
        other.close()
        owner.close()
    _cleaned_up()


@pytest.mark.timeout(60)
def test_a_detached_feed_goes_on_with_the_same_images() -> None:
    s = _settings(shared_loading=True)
    owner = CurriculumFeed(s, "trainer", LoadingOptions(slots=2))
    slow = CurriculumFeed(s, "maker", LoadingOptions(slots=2))
    try:
        before = slow.images(0).copy()
        owner.images(2)  # two epochs ahead of the slow feed's: its slot is overwritten
        assert not slow.intact() and not slow.shared  # detached: it loads separately from now on
        assert np.array_equal(slow.images(0), before)
        assert np.array_equal(slow.images(1), owner.images(1))
    finally:
        slow.close()
        owner.close()
    _cleaned_up()


def _figures(shared: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    res = run_inline(Curriculum(), _settings(shared_loading=shared))
    trainer = res.results["trainer"].value
    return res.figures, trainer


@pytest.mark.timeout(120)
def test_shared_loading_gives_the_same_run_as_separate_loading() -> None:
    sep, sep_trainer = _figures(False)
    shared, shared_trainer = _figures(True)
    timing = {"trainer_seconds", "maker_staleness_s_mean"}
    for k in sep.keys() - timing:
        a, b = sep[k], shared[k]
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), k
    assert sep_trainer["history"] == shared_trainer["history"]
    assert sep["maker_rounds"] > 2 and sep["scored_fraction"] == 1.0
    _cleaned_up()


def test_bad_loading_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="shared_loading='sometimes'; expected 'auto', 'on' or 'off'"):
        _settings(shared_loading="sometimes")
    with pytest.raises(ConfigError, match="shared_loading=1; expected 'auto', 'on' or 'off'"):
        _settings(shared_loading=1)
    with pytest.raises(ConfigError, match="augment=1; expected True or False"):
        _settings(augment=1)
    with pytest.raises(ConfigError, match=r"carls\.loading"):
        LoadingOptions.from_config({"loading": {"slots": 2}})


@pytest.mark.timeout(240)
def test_loops_in_worker_processes_share_one_loader(client: object) -> None:
    """On a real LocalCluster (two worker processes on this node) one loop creates the loader, the others read it."""
    from carls_dask.runtime import run_paradigm

    result = run_paradigm(Curriculum(), _settings(shared_loading=True), cluster=client, progress=False, timeout=200)
    modes = {name: r.value["loading"] for name, r in result.results.items()}
    assert sorted(modes) == ["maker-0", "maker-1", "trainer"]
    assert list(modes.values()).count("produced") == 1, modes
    # a loop reads the loader, or loads by itself after falling behind it: never a second producer
    assert set(modes.values()) <= {"produced", "shared", "separate"}
    assert result.figures["maker_rounds"] >= 2, result.figures
    _cleaned_up()


def test_shared_loading_is_auto_by_default_and_spellings_name_the_three_modes() -> None:
    assert CurriculumSettings().shared_loading == "auto"
    assert _settings().shared_loading == "auto"
    for given, mode in ((True, "on"), (False, "off"), ("true", "on"), ("No", "off"), (" AUTO ", "auto")):
        assert _settings(shared_loading=given).shared_loading == mode


@pytest.mark.timeout(120)
def test_auto_shares_the_data_of_a_run_with_makers_and_not_of_one_without() -> None:
    """The default: a run whose makers read the augmented images shares one loader; a uniform run (the trainer
    alone) and a run without augmentation do not."""
    res = run_inline(Curriculum(), _settings())
    modes = {name: r.value["loading"] for name, r in res.results.items()}
    assert sorted(modes.values()) == ["produced", "shared", "shared"], modes
    _cleaned_up(_settings())
    alone = dataclasses.replace(_settings(), pacing="uniform", clean="none")
    plain = dataclasses.replace(_settings(), augment=False)
    for settings in (alone, plain):
        feed = CurriculumFeed(settings, "trainer")
        try:
            assert feed.mode == "separate" and not _leftovers(settings)
        finally:
            feed.close()


def test_auto_loads_separately_without_shared_memory_and_on_is_an_error(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: pathlib.Path) -> None:
    """A node without a writable /dev/shm (macOS, say): "auto" loads by itself, "on" says what is missing."""
    import carls_dask.loading.shared as shared

    monkeypatch.setattr(shared, "SHM_DIR", tmp_path / "no-shm")
    feed = CurriculumFeed(_settings(), "trainer")
    try:
        assert feed.mode == "separate"
        assert np.array_equal(feed.images(1), augment_images(feed.data.images.x_train, seed=0, epoch=1))
    finally:
        feed.close()
    with pytest.raises(ConfigError, match=r"trainer: shared_loading='on', but this node has no writable /dev/shm"):
        CurriculumFeed(_settings(shared_loading="on"), "trainer")


@pytest.mark.timeout(90)
def test_a_feed_whose_producer_died_goes_on_with_the_same_images() -> None:
    """The loop owning the loader is SIGKILLed (its worker died): a reader warns and computes the images itself."""
    import multiprocessing

    from tests.paradigms import curriculum_workers

    ctx = multiprocessing.get_context("spawn")
    kw = dataclasses.asdict(_settings(shared_loading="on"))
    ready, stop = ctx.Event(), ctx.Event()
    owner = ctx.Process(target=curriculum_workers.own_feed, args=(kw, ready, stop))
    owner.start()
    try:
        assert ready.wait(60), "the owning process did not create the loader"
        s = _settings(shared_loading="on")
        reader = CurriculumFeed(s, "maker", LoadingOptions(slots=2, producer_timeout=5))
        try:
            assert reader.mode == "shared"
            first = reader.images(0).copy()
            owner.kill()
            owner.join(20)
            again = reader.images(1)
            assert reader.mode == "separate"
            assert np.array_equal(again, augment_images(reader.data.images.x_train, seed=0, epoch=1))
            assert np.array_equal(reader.images(0), first)
        finally:
            reader.close()
    finally:
        if owner.is_alive():
            owner.kill()
        owner.join(20)
    _cleaned_up(s)
