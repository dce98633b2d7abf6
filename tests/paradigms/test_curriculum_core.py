"""Curriculum pure parts: noise, scorers, pacing, sampler, cleaning, settings; and the in-process run on digits."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from carls_dask.errors import ConfigError, InvalidShapeError
from carls_dask.paradigms.curriculum import (
    CleaningRule,
    CurriculumSampler,
    CurriculumSettings,
    FractionPacing,
    SelfPacedPacing,
    clean_targets,
    detection_quality,
    get_scorer,
    make_pacing,
    register_scorer,
    run_inline,
    symmetric_noise,
)
from carls_dask.paradigms.curriculum.scoring import SCORERS

# -- noise ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.5])
def test_symmetric_noise_flips_exactly_the_rate_to_other_classes(rate: float) -> None:
    y = np.repeat(np.arange(10), 100)
    out = symmetric_noise(y, rate, 10, seed=3)
    assert out.flipped.sum() == round(rate * 1000)
    assert np.array_equal(out.flipped, out.labels != y)
    assert np.array_equal(out.clean, y)
    assert out.labels.min() >= 0 and out.labels.max() <= 9
    again = symmetric_noise(y, rate, 10, seed=3)
    assert np.array_equal(out.labels, again.labels)
    if rate:
        # symmetric: the wrong classes are spread over all nine others
        moved = (out.labels[out.flipped] - y[out.flipped]) % 10
        assert set(np.unique(moved)) == set(range(1, 10))
        assert not np.array_equal(out.labels, symmetric_noise(y, rate, 10, seed=4).labels)


def test_symmetric_noise_rejects_bad_input_naming_it() -> None:
    y = np.array([0, 1, 2])
    with pytest.raises(ConfigError, match=r"rate=1\.0"):
        symmetric_noise(y, 1.0, 3)
    with pytest.raises(ConfigError, match=r"labels span \[0, 2\]; expected \[0, 2\)"):
        symmetric_noise(y, 0.3, 2)
    with pytest.raises(ConfigError, match="n_classes=1"):
        symmetric_noise(y, 0.3, 1)


# -- scorers -------------------------------------------------------------------------------------


def test_scorers_rank_confident_right_below_unsure_below_confident_wrong() -> None:
    logits = np.array([[5.0, 0.0, 0.0], [0.5, 0.0, 0.0], [0.0, 5.0, 0.0]])
    labels = np.array([0, 0, 0])
    p_right = math.exp(5) / (math.exp(5) + 2)
    assert get_scorer("loss")(logits, labels)[0] == pytest.approx(-math.log(p_right), rel=1e-5)
    assert get_scorer("confidence")(logits, labels)[0] == pytest.approx(1 - p_right, rel=1e-5)
    margin = get_scorer("margin")(logits, labels)
    assert margin[0] == pytest.approx((1 - (p_right - 1 / (math.exp(5) + 2))) / 2, rel=1e-5)
    assert margin[2] == pytest.approx((1 + (p_right - 1 / (math.exp(5) + 2))) / 2, rel=1e-5)
    for name in ("loss", "margin", "confidence"):
        s = SCORERS[name](logits, labels)
        assert s.dtype == np.float32 and s[0] < s[1] < s[2], name


def test_scorer_registry_and_shape_errors() -> None:
    with pytest.raises(ConfigError, match="unknown difficulty scorer 'entropy'"):
        get_scorer("entropy")
    with pytest.raises(ConfigError, match="already registered"):
        register_scorer("loss", SCORERS["loss"])
    register_scorer("always-one", lambda z, y: np.ones(len(y), np.float32))
    try:
        assert get_scorer("always-one")(np.zeros((2, 3)), np.array([0, 1])).tolist() == [1.0, 1.0]
    finally:
        del SCORERS["always-one"]
    with pytest.raises(InvalidShapeError, match=r"logits \[2, 3\] and labels \[3\]"):
        get_scorer("loss")(np.zeros((2, 3)), np.zeros(3, np.int64))
    with pytest.raises(InvalidShapeError, match="labels span"):
        get_scorer("loss")(np.zeros((2, 3)), np.array([0, 3]))


# -- pacing --------------------------------------------------------------------------------------


def test_fraction_schedules_follow_their_formulas() -> None:
    lin = FractionPacing("linear", 0.2, 1.0, ramp_steps=100, warmup_steps=10)
    root = FractionPacing("root", 0.2, 1.0, ramp_steps=100, warmup_steps=10)
    step = FractionPacing("step", 0.2, 1.0, ramp_steps=100, warmup_steps=10, stages=4)
    assert lin.planned(0) == root.planned(5) == step.planned(9) == 1.0  # warm-up: everything
    assert lin.planned(10) == pytest.approx(0.2)
    assert lin.planned(35) == pytest.approx(0.2 + 0.8 * 0.25)
    assert root.planned(35) == pytest.approx(0.2 + 0.8 * 0.5)
    assert step.planned(34) == pytest.approx(0.2)
    assert step.planned(35) == pytest.approx(0.4)
    assert lin.planned(110) == lin.planned(10_000) == pytest.approx(1.0)
    assert FractionPacing("uniform").planned(0) == 1.0


def test_fraction_pacing_admits_the_easiest_share_and_unscored_last() -> None:
    pacing = FractionPacing("linear", 0.3, 1.0, ramp_steps=100)
    d = np.array([0.9, 0.1, np.nan, 0.5, 0.2, 0.8, 0.3, 0.7, 0.4, 0.6])
    assert np.flatnonzero(pacing.admit(d, 0)).tolist() == [1, 4, 6]
    assert pacing.admit(d, 100).all()
    assert pacing.admit(np.full(10, np.nan), 0).all()  # no scores yet: everything


def test_self_paced_threshold_and_floor() -> None:
    sp = SelfPacedPacing(start=0.2, end=1.0, ramp_steps=10, min_fraction=0.2)
    d = np.linspace(0.0, 1.0, 11)
    assert sp.threshold(5) == pytest.approx(0.6)
    assert sp.admit(d, 5).sum() == 7  # 0.0 ... 0.6
    assert math.isnan(sp.planned(5))
    floor = SelfPacedPacing(start=-1.0, end=-1.0, ramp_steps=10, min_fraction=0.2)
    assert np.flatnonzero(floor.admit(d, 3)).tolist() == [0, 1, 2]


def test_pacing_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="schedule='cosine'"):
        FractionPacing("cosine")
    with pytest.raises(ConfigError, match=r"start=0\.8, end=0\.5"):
        FractionPacing("linear", 0.8, 0.5)
    with pytest.raises(ConfigError, match="unknown pacing schedule 'exp'"):
        make_pacing("exp")
    with pytest.raises(ConfigError, match="ramp_steps"):
        FractionPacing("linear", ramp_steps=-1)


# -- sampler -------------------------------------------------------------------------------------


def test_sampler_draws_only_admitted_examples_and_records_realised_sampling() -> None:
    n = 100
    s = CurriculumSampler(n, 10, FractionPacing("linear", 0.2, 1.0, ramp_steps=100), seed=1)
    d = np.arange(n, dtype=np.float64)[::-1].copy()  # example 99 is the easiest
    s.set_difficulty(d)
    s.set_step(0)
    batch = s.next_batch()
    assert len(set(batch.tolist())) == 10 and batch.min() >= 80
    assert s.last["pacing"] == pytest.approx(0.2)
    assert s.last["admitted_fraction"] == pytest.approx(0.2)
    assert s.last["batch_rank"] < 0.2
    s.set_excluded(np.arange(n) >= 90)
    assert s.admitted().sum() == 10 and not s.admitted()[90:].any()
    s.set_step(100)
    for _ in range(50):
        s.next_batch()
    assert s.last["admitted_fraction"] == pytest.approx(0.9)
    # every admitted example was drawn, plus the excluded ones the first batch drew before exclusion
    assert s.seen[:90].all()
    assert s.last["sampled_fraction"] == pytest.approx(0.9 + (batch >= 90).sum() / n)


def test_sampler_is_reproducible_resumable_and_feeds_a_dataloader() -> None:
    def make() -> CurriculumSampler:
        s = CurriculumSampler(50, 8, FractionPacing("root", 0.25, 1.0, ramp_steps=20), seed=7)
        s.set_difficulty(np.random.default_rng(0).random(50))
        return s

    a, b = make(), make()
    first = [a.next_batch().tolist() for _ in range(3)]
    assert first == [b.next_batch().tolist() for _ in range(3)]
    state = a.state_dict()
    c = make()
    c.load_state_dict(state)
    for step in range(3, 8):
        a.set_step(step)
        c.set_step(step)
        assert a.next_batch().tolist() == c.next_batch().tolist()
    data = TensorDataset(torch.arange(50))
    loader = iter(DataLoader(data, batch_sampler=make(), num_workers=0))
    (got,) = next(loader)
    assert got.tolist() == first[0]


def test_sampler_rejects_wrong_shapes() -> None:
    s = CurriculumSampler(10, 4, FractionPacing())
    with pytest.raises(InvalidShapeError, match=r"got shape \(9,\); expected \(10,\)"):
        s.set_difficulty(np.zeros(9))
    with pytest.raises(ConfigError, match="batch_size=0"):
        CurriculumSampler(10, 0, FractionPacing())


# -- cleaning ------------------------------------------------------------------------------------


def test_cleaning_rule_counts_consecutive_confident_disagreement() -> None:
    rule = CleaningRule(confidence=0.8, rounds=2)
    given = np.array([0, 0, 0, 0])
    pred = np.array([1, 1, 0, 1])
    conf = np.array([0.9, 0.5, 0.99, 0.95])
    r1 = rule.disagree_rounds(given, pred, conf, np.zeros(4, np.int64))
    assert r1.tolist() == [1, 0, 0, 1]
    r2 = rule.disagree_rounds(given, np.array([1, 1, 0, 0]), conf, r1)
    assert r2.tolist() == [2, 0, 0, 0]
    assert rule.flagged(r2).tolist() == [True, False, False, False]
    with pytest.raises(ConfigError, match="rounds=0"):
        CleaningRule(rounds=0)


def test_clean_targets_and_detection_quality() -> None:
    given = np.array([0, 1, 2, 3])
    pred = np.array([0, 2, 2, 0])
    flagged = np.array([False, True, False, True])
    labels, w = clean_targets(given, pred, flagged, "relabel")
    assert labels.tolist() == [0, 2, 2, 0] and w.tolist() == [1, 1, 1, 1]
    labels, w = clean_targets(given, pred, flagged, "downweight", 0.25)
    assert labels.tolist() == [0, 1, 2, 3] and w.tolist() == [1, 0.25, 1, 0.25]
    with pytest.raises(ConfigError, match="mode='drop'"):
        clean_targets(given, pred, flagged, "drop")
    q = detection_quality(flagged, np.array([False, True, True, False]))
    assert q == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "flagged_fraction": 0.5}
    assert math.isnan(detection_quality(np.zeros(3, bool), np.ones(3, bool))["precision"])


# -- settings ------------------------------------------------------------------------------------


def test_settings_from_options_parse_and_reject() -> None:
    s = CurriculumSettings.from_options({"noise": "0.5", "pacing": "root", "n-train": "none", "clean-rounds": "3"},
                                        steps=10)
    assert (s.noise, s.pacing, s.n_train, s.clean_rounds, s.steps) == (0.5, "root", None, 3, 10)
    with pytest.raises(ConfigError, match="option 'colour'"):
        CurriculumSettings.from_options({"colour": "red"})
    with pytest.raises(ConfigError, match=r"noise='lots'"):
        CurriculumSettings.from_options({"noise": "lots"})
    with pytest.raises(ConfigError, match="clean='maybe'"):
        CurriculumSettings(clean="maybe")


# -- in-process run on digits --------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """The runs below set one torch thread for speed; give the next tests torch's setting back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _digits(**kw: object) -> CurriculumSettings:
    base: dict[str, object] = dict(dataset="digits", n_train=None, n_test=None, noise=0.3, steps=240, batch_size=64,
                                   threads=1,
                                   hidden=64, lr=3e-3, publish_every=40, refresh_every=20, warmup=0.25, ramp=0.5,
                                   clean_confidence=0.6, clean_rounds=2)
    base.update(kw)
    return CurriculumSettings(**base)  # type: ignore[arg-type]


def test_inline_curriculum_scores_every_example_and_detects_noise(tmp_path: object) -> None:
    import pathlib

    from carls_dask.storage import open_bank

    root = pathlib.Path(str(tmp_path)) / "bank"
    res = run_inline(_digits(), snapshot_dir=str(root))
    assert res.rounds == 6
    t = res.trainer
    assert t["scored_fraction"] == 1.0
    assert 0.0 < t["flagged_fraction"] < 0.5
    # flagged examples are mostly the ones whose label was flipped (30% of all)
    assert t["flag_precision"] > 0.8
    assert res.maker["pl_precision"] > 0.8
    assert t["test_accuracy"] > 0.8
    ds = open_bank(root, table="nodes").load()
    assert ds.sizes["key"] == 1348
    assert int(ds["model_step"].max()) == 240 and set(np.unique(ds["maker"].values)) == {"maker"}
    assert np.isfinite(ds["difficulty"].values).all()


def test_inline_runs_are_reproducible() -> None:
    a = run_inline(_digits(steps=60, publish_every=30))
    b = run_inline(_digits(steps=60, publish_every=30))
    assert a.trainer["test_accuracy"] == b.trainer["test_accuracy"]
    assert a.maker.keys() == b.maker.keys()
    np.testing.assert_array_equal(list(a.maker.values()), list(b.maker.values()))  # NaN == NaN here


def test_a_trainer_resumed_from_its_state_continues_identically() -> None:
    from carls_dask.bank import KnowledgeBank
    from carls_dask.paradigms.curriculum import (
        CurriculumTrainer,
        DifficultyMaker,
        difficulty_table,
    )
    from carls_dask.runtime import LocalModelChannel, LoopContext, ThreadStop

    s = _digits(steps=80, warmup=0.0, refresh_every=5)
    bank = KnowledgeBank.local([difficulty_table()], n_shards=1, buckets=64)
    ctx = LoopContext("t", "trainer", "cpu", LocalModelChannel("t"), ThreadStop(), bank=bank)
    first = CurriculumTrainer(s)
    first.ctx = ctx
    first.setup(ctx)
    for step in range(20):
        first.step(step)
    maker = DifficultyMaker(s)
    maker.ctx = ctx
    maker.setup(ctx)
    maker.load_model(first.publish_state(), None)  # type: ignore[arg-type]
    maker.make(type("V", (), {"step": 20})())  # type: ignore[arg-type]
    first.start_step = 20
    state = copy.deepcopy(first.state())  # as a checkpoint on disk or pickled to a worker would be
    second = CurriculumTrainer(s)
    second.ctx = ctx
    second.setup(ctx)
    second.load_state(state)
    assert second.start_step == 20
    a = [first.step(step)["loss"] for step in range(20, 30)]
    b = [second.step(step)["loss"] for step in range(20, 30)]
    assert a == b
    assert first.sampler.last["admitted_fraction"] < 1.0  # the scores were in use
