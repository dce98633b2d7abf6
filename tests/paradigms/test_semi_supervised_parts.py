"""The pure parts of the semi-supervised paradigm: loader, neighbour table, loss, pseudo labels, core."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import numpy as np
import pytest
import torch

from carls_dask.errors import ConfigError, CorruptStoreError, InvalidShapeError, StoreNotFoundError
from carls_dask.paradigms.data.planetoid import find_data_dir, load_planetoid
from carls_dask.paradigms.semi_supervised.core import NodeClassifierCore, expand_neighbour_rows
from carls_dask.paradigms.semi_supervised.loops import PseudoLabelMaker
from carls_dask.paradigms.semi_supervised.loss import (
    graph_regularization,
    pseudo_label_loss,
    soft_target_loss,
)
from carls_dask.paradigms.semi_supervised.neighbours import build_neighbour_table
from carls_dask.paradigms.semi_supervised.pseudo_labels import (
    correct_probabilities,
    normalized_adjacency,
    propagate_labels,
    pseudo_label_quality,
    select_balanced_pseudo_labels,
    select_pseudo_labels,
    sharpen,
    soft_pseudo_labels,
)
from carls_dask.paradigms.semi_supervised.settings import SemiSupervisedSettings
from carls_dask.runtime.settings import settings_from_options


def config(**values: Any) -> SemiSupervisedSettings:
    """Settings from keyword values, the flat names of before the groups included (as ``-o`` reads them)."""
    result: SemiSupervisedSettings = settings_from_options(SemiSupervisedSettings, {}, base=values)
    return result


def _data_dir() -> pathlib.Path:
    try:
        return find_data_dir()
    except StoreNotFoundError as exc:
        pytest.skip(f"the Planetoid files are not present: {exc}")


@pytest.fixture(scope="module")
def cora():  # type: ignore[no-untyped-def]
    return load_planetoid("cora", _data_dir())


# -- loader -----------------------------------------------------------------------------------------
def test_cora_has_the_planetoid_split(cora) -> None:  # type: ignore[no-untyped-def]
    assert (cora.n_nodes, cora.n_features, cora.n_classes) == (2708, 1433, 7)
    assert (len(cora.train), len(cora.val), len(cora.test)) == (140, 500, 1000)
    assert cora.edges.shape == (2, 5278)
    assert not set(cora.train) & set(cora.test) and not set(cora.val) & set(cora.test)
    assert np.allclose(cora.features.sum(1)[cora.features.sum(1) > 0], 1.0, atol=1e-5)  # row-normalised
    assert np.bincount(cora.labels[cora.train]).tolist() == [20] * 7  # 20 labels per class
    adj = cora.adjacency_lists()
    assert sum(len(a) for a in adj) == 2 * 5278  # each undirected edge seen from both ends
    a, b = cora.edges[:, 0]
    assert b in adj[a] and a in adj[b]
    assert len(cora.unlabelled()) == 2708 - 140


def test_citeseer_loads() -> None:
    g = load_planetoid("CiteSeer", _data_dir(), normalize=False)
    assert (g.n_nodes, g.n_features, g.n_classes) == (3327, 3703, 6)
    assert (len(g.train), len(g.val), len(g.test)) == (120, 500, 1000)
    assert set(np.unique(g.features)) <= {0.0, 1.0}


def test_loader_errors_name_what_was_given(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"'pubmed'.*cora, citeseer"):
        load_planetoid("pubmed", tmp_path)
    with pytest.raises(StoreNotFoundError, match=rf"data folder {tmp_path} \(the data_dir setting\): holds no "
                                                 r"'planetoid' folder"):
        load_planetoid("cora", tmp_path)
    with pytest.raises(StoreNotFoundError, match=rf"{tmp_path / 'gone'}, set by the data_dir setting, does not exist"):
        load_planetoid("cora", tmp_path / "gone")
    (tmp_path / "planetoid").mkdir()
    with pytest.raises(StoreNotFoundError, match=r"cora\.npz"):
        load_planetoid("cora", tmp_path)
    np.savez(tmp_path / "planetoid" / "cora.npz", y=np.zeros(3))
    with pytest.raises(CorruptStoreError, match=r"missing arrays.*x_data"):
        load_planetoid("cora", tmp_path)


# -- neighbours -------------------------------------------------------------------------------------
def test_neighbour_table_pads_and_samples_within_the_adjacency() -> None:
    adj = [np.array([1, 2, 3]), np.array([0]), np.array([0]), np.array([0])]
    t = build_neighbour_table(adj, 2, seed=3)
    assert t.keys.shape == (4, 2)
    assert set(t.keys[0]) < {1, 2, 3} and len(set(t.keys[0])) == 2  # without replacement
    assert t.keys[1].tolist() == [0, -1] and t.weights[1].tolist() == [1.0, 0.0]
    assert np.array_equal(t.keys, build_neighbour_table(adj, 2, seed=3).keys)  # reproducible
    with pytest.raises(ConfigError, match="k must be at least 1, got 0"):
        build_neighbour_table(adj, 0)


def test_expand_neighbour_rows_maps_unique_rows_back_to_slots() -> None:
    slots = np.array([[5, 9, -1], [9, 7, 5]])
    uniq = np.array([5, 7, 9])
    rows = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=np.float32)
    found = np.array([True, False, True])
    values, present = expand_neighbour_rows(slots, uniq, rows, found)
    assert present.tolist() == [[True, True, False], [True, False, True]]
    assert values[:, :, 0].tolist() == [[1.0, 3.0, 0.0], [3.0, 0.0, 1.0]]
    with pytest.raises(InvalidShapeError, match="2 rows"):
        expand_neighbour_rows(slots, uniq, rows[:2], found)


# -- loss -------------------------------------------------------------------------------------------
def test_graph_regularization_is_zero_for_equal_outputs_and_ignores_empty_slots() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    same = logits.unsqueeze(1).repeat(1, 3, 1)
    w = torch.ones(2, 3)
    assert float(graph_regularization(logits, same, w, "kl")) == pytest.approx(0.0, abs=1e-7)
    assert float(graph_regularization(logits, same, w, "l2")) == pytest.approx(0.0, abs=1e-7)
    other = same.clone()
    other[:, 2] = torch.tensor([-5.0, 5.0])  # a far-away neighbour in slot 2 ...
    assert float(graph_regularization(logits, other, w, "kl")) > 0.3  # one of three slots far away
    w0 = w.clone()
    w0[:, 2] = 0  # ... counts for nothing once its weight is 0
    assert float(graph_regularization(logits, other, w0, "kl")) == pytest.approx(0.0, abs=1e-7)
    # KL(q || p) by hand for one node with one neighbour
    p = torch.log_softmax(torch.tensor([1.0, 0.0]), 0)
    q = torch.log_softmax(torch.tensor([0.0, 1.0]), 0)
    expect = float((q.exp() * (q - p)).sum())
    got = graph_regularization(torch.tensor([[1.0, 0.0]]), torch.tensor([[[0.0, 1.0]]]), torch.ones(1, 1))
    assert float(got) == pytest.approx(expect, rel=1e-6)
    assert float(graph_regularization(logits, same, torch.zeros(2, 3))) == 0.0
    with pytest.raises(ConfigError, match="distance 'cos'"):
        graph_regularization(logits, same, w, "cos")
    with pytest.raises(ConfigError, match=r"weights \(2, 2\)"):
        graph_regularization(logits, same, torch.ones(2, 2))


def test_graph_regularization_matches_the_per_slot_distances_and_their_gradients() -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 3, generator=gen, requires_grad=True)
    nb = torch.randn(6, 4, 3, generator=gen, requires_grad=True)  # in-graph: neighbours carry gradient
    w = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [2, 0, 1, 0], [1, 0, 0, 0], [0.5, 0.5, 0.5, 0]])
    p = torch.softmax(logits, -1).unsqueeze(1)
    q = torch.softmax(nb, -1)
    per_slot = {"kl": (q * (q.log() - p.log())).sum(-1), "l2": (p - q).pow(2).sum(-1)}
    has = w.sum(1) > 0
    for distance, d in per_slot.items():
        expected = ((w * d).sum(1)[has] / w.sum(1)[has]).mean()
        got = graph_regularization(logits, nb, w, distance)
        assert float(got.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)
        g_expected = torch.autograd.grad(expected, (logits, nb), retain_graph=True)
        g_got = torch.autograd.grad(got, (logits, nb))
        for a, b in zip(g_got, g_expected, strict=True):
            assert torch.allclose(a, b, atol=1e-6)


def test_pseudo_label_loss_weights_by_confidence_and_skips_unlabelled() -> None:
    logits = torch.tensor([[3.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    labels = torch.tensor([0, 0, -1])
    conf = torch.tensor([1.0, 0.0, 1.0])
    ce0 = float(torch.nn.functional.cross_entropy(logits[:1], labels[:1]))
    assert float(pseudo_label_loss(logits, labels, conf)) == pytest.approx(ce0)
    assert float(pseudo_label_loss(logits, torch.full((3,), -1), conf)) == 0.0


# -- pseudo labels ----------------------------------------------------------------------------------
def test_select_pseudo_labels_and_quality() -> None:
    probs = np.array([[0.95, 0.05], [0.4, 0.6], [0.1, 0.9], [0.99, 0.01]], dtype=np.float32)
    chosen = select_pseudo_labels(probs, np.array([0, 1, 2]), threshold=0.9)
    assert chosen.keys.tolist() == [0, 2] and chosen.labels.tolist() == [0, 1]
    assert chosen.confidence.tolist() == pytest.approx([0.95, 0.9])
    q = pseudo_label_quality(chosen, truth=np.array([0, 1, 0, 0]))
    assert q == {"precision": 0.5, "coverage": pytest.approx(2 / 3), "count": 2.0}
    none = select_pseudo_labels(probs, np.array([1]), threshold=0.9)
    assert np.isnan(pseudo_label_quality(none, np.zeros(4, dtype=np.int64))["precision"])
    with pytest.raises(ConfigError, match="threshold must be in"):
        select_pseudo_labels(probs, np.array([0]), threshold=1.5)
    with pytest.raises(InvalidShapeError, match=r"\[0, 4\)"):
        select_pseudo_labels(probs, np.array([7]), threshold=0.5)


def test_normalized_adjacency_is_symmetric_and_counts_duplicate_edges_once() -> None:
    # path 0-1-2, the edge 0-1 listed in both directions, a self loop on 2, node 3 isolated
    a = normalized_adjacency(np.array([[0, 1, 1, 2], [1, 0, 2, 2]]), 4).toarray()
    s2 = 1 / np.sqrt(2)
    assert a == pytest.approx(np.array([[0, s2, 0, 0], [s2, 0, s2, 0], [0, s2, 0, 0], [0, 0, 0, 0]]))
    # with self loops: A + I normalised (degrees 2, 3, 2, 1), the listed self loop on 2 not counted twice
    b = normalized_adjacency(np.array([[0, 1, 1, 2], [1, 0, 2, 2]]), 4, self_loops=True).toarray()
    d = np.array([2.0, 3.0, 2.0, 1.0])
    expected = (np.eye(4) + np.array([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]])) / np.sqrt(np.outer(d, d))
    assert b == pytest.approx(expected)
    with pytest.raises(InvalidShapeError, match=r"\[0, 4\)"):
        normalized_adjacency(np.array([[0], [4]]), 4)
    with pytest.raises(InvalidShapeError, match=r"\[2, m\]"):
        normalized_adjacency(np.array([0, 1]), 4)


def test_propagate_labels_spreads_known_labels_to_neighbours() -> None:
    # edge 0-1, node 2 isolated; node 0's true label is 1 and is clamped
    adj = normalized_adjacency(np.array([[0], [1]]), 3)
    probs = np.array([[0.5, 0.5], [0.8, 0.2], [0.3, 0.7]], dtype=np.float32)
    votes = propagate_labels(probs, adj, np.array([0]), np.array([1]), alpha=0.5, iterations=3)
    # node 1: 0.5 * [0.8, 0.2] + 0.5 * [0, 1] = [0.4, 0.6]: its neighbour's label outvotes the model
    assert votes == pytest.approx(np.array([[0.0, 1.0], [0.4, 0.6], [0.3, 0.7]]), abs=1e-6)
    alone = propagate_labels(probs, adj, np.array([0]), np.array([1]), alpha=0.0)
    assert alone == pytest.approx(np.array([[0.0, 1.0], [0.8, 0.2], [0.3, 0.7]]))
    with pytest.raises(ConfigError, match=r"alpha must be in \[0, 1\), got 1\.0"):
        propagate_labels(probs, adj, np.array([0]), np.array([1]), alpha=1.0)
    with pytest.raises(InvalidShapeError, match=r"adjacency \(3, 3\)"):
        propagate_labels(probs[:2], adj, np.array([0]), np.array([1]), alpha=0.5)


def test_correct_step_spreads_known_errors_to_neighbours() -> None:
    # path 0-1-2; node 0's true label is 0 but the model says class 1 there and on its neighbour 1
    adj = normalized_adjacency(np.array([[0, 1], [1, 2]]), 3)
    probs = np.array([[0.2, 0.8], [0.3, 0.7], [0.5, 0.5]], dtype=np.float32)
    known, labels = np.array([0]), np.array([0])
    # residual of node 0: [0.8, -0.8]; one round with alpha 0.5 gives node 1 0.5 * (1 / sqrt 2) of it
    fixed = correct_probabilities(probs, adj, known, labels, alpha=0.5, iterations=1, scale=1.0)
    r = 0.5 * 0.8 / np.sqrt(2.0)
    assert fixed == pytest.approx(np.array([[1.0, 0.0], [0.3 + r, 0.7 - r], [0.5, 0.5]]), abs=1e-6)
    assert fixed[1].argmax() == 0  # the neighbour's wrong prediction is corrected; node 2 is two hops away
    # autoscale: node 1's error is scaled up to the known residual's L1 size (1.6), then clipped at 0
    auto = correct_probabilities(probs, adj, known, labels, alpha=0.5, iterations=1)
    assert auto == pytest.approx(np.array([[1.0, 0.0], [1.0, 0.0], [0.5, 0.5]]), abs=1e-6)
    assert np.allclose(auto.sum(1), 1.0)
    # alpha 0 changes nothing, and neither does a correct step whose known nodes are already right
    assert correct_probabilities(probs, adj, known, labels, alpha=0.0) == pytest.approx(probs)
    sure = np.array([[1.0, 0.0], [0.3, 0.7], [0.5, 0.5]], dtype=np.float32)
    assert correct_probabilities(sure, adj, known, labels, alpha=0.8, iterations=10) == pytest.approx(sure)
    with pytest.raises(ConfigError, match=r"alpha must be in \[0, 1\), got 1\.0"):
        correct_probabilities(probs, adj, known, labels, alpha=1.0)
    with pytest.raises(ConfigError, match=r"scale must be >= 0 \(0: autoscale\), got -1\.0"):
        correct_probabilities(probs, adj, known, labels, alpha=0.5, scale=-1.0)
    with pytest.raises(ConfigError, match=r"iterations must be >= 0, got -2"):
        correct_probabilities(probs, adj, known, labels, alpha=0.5, iterations=-2)
    with pytest.raises(InvalidShapeError, match=r"adjacency \(3, 3\)"):
        correct_probabilities(probs[:2], adj, known, labels, alpha=0.5)


def test_balanced_pseudo_labels_take_each_class_quota_where_model_and_votes_agree() -> None:
    # candidates 0..7: votes for class 0 on 0-4, class 1 on 5-7; the model disagrees on node 1 and node 5
    vote1 = np.array([0.1, 0.05, 0.2, 0.3, 0.4, 0.9, 0.8, 0.6], dtype=np.float32)
    votes = np.stack([1 - vote1, vote1], axis=1)
    model = votes.copy()
    model[[1, 5]] = model[[1, 5]][:, ::-1]
    chosen = select_balanced_pseudo_labels(model, votes, np.arange(8), fraction=0.5)
    # quota 0.5 * 8 / 2 = 2 per class: class 0 -> nodes 0, 2 (node 1 is more confident but disputed),
    # class 1 -> nodes 6, 7 (node 5 disputed)
    assert chosen.keys.tolist() == [0, 2, 6, 7] and chosen.labels.tolist() == [0, 0, 1, 1]
    assert chosen.confidence.tolist() == pytest.approx([0.9, 0.8, 0.8, 0.6])
    assert chosen.n_candidates == 8
    free = select_balanced_pseudo_labels(model, votes, np.arange(8), fraction=0.5, agreement=False)
    assert free.keys.tolist() == [0, 1, 5, 6]
    floor = select_balanced_pseudo_labels(model, votes, np.arange(8), fraction=1.0, min_confidence=0.75)
    assert floor.keys.tolist() == [0, 2, 6]  # node 3 (0.7) falls below the floor
    q = pseudo_label_quality(chosen, truth=np.array([0, 0, 1, 0, 0, 1, 1, 1]))
    assert q == {"precision": 0.75, "coverage": 0.5, "count": 4.0}
    assert len(select_balanced_pseudo_labels(model, votes, np.arange(8), fraction=0.0).keys) == 0
    with pytest.raises(ConfigError, match="fraction must be in"):
        select_balanced_pseudo_labels(model, votes, np.arange(8), fraction=1.5)
    with pytest.raises(InvalidShapeError, match="votes"):
        select_balanced_pseudo_labels(model, votes[:4], np.arange(8), fraction=0.5)


def test_soft_pseudo_labels_give_every_candidate_its_sharpened_vote() -> None:
    votes = np.array([[0.6, 0.4], [0.5, 0.5], [0.1, 0.9], [1.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(sharpen(votes, 1.0), votes, rtol=1e-6)
    sharp = sharpen(votes, 0.5)  # squares, renormalised
    np.testing.assert_allclose(sharp[0], [0.36 / 0.52, 0.16 / 0.52], rtol=1e-5)
    np.testing.assert_allclose(sharp[1], [0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(sharp[3], [1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(sharp.sum(1), 1.0, rtol=1e-6)
    soft = soft_pseudo_labels(votes, np.array([0, 2, 3]), temperature=0.5)
    assert soft.keys.tolist() == [0, 2, 3] and soft.labels.tolist() == [0, 1, 0] and soft.n_candidates == 3
    assert soft.targets is not None and soft.targets.shape == (3, 2)
    np.testing.assert_allclose(soft.confidence, soft.targets.max(1))
    np.testing.assert_allclose(soft.target_rows(2), soft.targets)
    hard = select_pseudo_labels(votes, np.arange(4), threshold=0.6)
    np.testing.assert_array_equal(hard.target_rows(2), np.eye(2, dtype=np.float32)[hard.labels])
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        sharpen(votes, 0.0)
    with pytest.raises(InvalidShapeError, match="candidate ids"):
        soft_pseudo_labels(votes, np.array([4]))


def test_soft_target_loss_is_the_weighted_cross_entropy_against_the_targets() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    targets = torch.tensor([[0.8, 0.2], [0.0, 1.0], [0.5, 0.5]])
    weights = torch.tensor([1.0, 3.0, 0.0])
    logp = torch.log_softmax(logits, -1)
    per_row = -(targets * logp).sum(-1)
    expected = (per_row[0] * 1.0 + per_row[1] * 3.0) / 4.0
    assert float(soft_target_loss(logits, targets, weights)) == pytest.approx(float(expected), rel=1e-6)
    assert float(soft_target_loss(logits, targets, torch.zeros(3))) == 0.0
    with pytest.raises(ConfigError, match="soft_target_loss"):
        soft_target_loss(logits, targets[:2], weights)


def test_pseudo_label_share_waits_for_the_warm_up_then_ramps() -> None:
    cfg = config(pseudo_labels=True, pseudo_selection="balanced", pseudo_fraction=0.4,
                               pseudo_warmup=20, pseudo_ramp=40)
    maker = PseudoLabelMaker(config=cfg)
    assert [maker.fraction_at(s) for s in (0, 19, 20, 40, 60, 100)] == pytest.approx([0, 0, 0, 0.2, 0.4, 0.4])
    maker.config = dataclasses.replace(cfg, pseudo=dataclasses.replace(cfg.pseudo, ramp=0))
    assert [maker.fraction_at(s) for s in (19, 20)] == pytest.approx([0, 0.4])


# -- core -------------------------------------------------------------------------------------------
def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="mode 'graph'"):
        config(mode="graph")
    with pytest.raises(ConfigError, match="k 0"):
        config(k=0)
    with pytest.raises(ConfigError, match="pseudo_labels need mode 'bank'"):
        config(mode="in-graph", pseudo_labels=True)
    with pytest.raises(ConfigError, match=r"neighbour_temperature 0\.0, expected > 0"):
        config(neighbour_temperature=0.0)
    with pytest.raises(ConfigError, match=r"pseudo.selection 'top', expected one of \('threshold', 'balanced', 'soft', 'auto'\)"):
        config(pseudo_selection="top")
    with pytest.raises(ConfigError, match=r"pseudo.fraction 1\.2"):
        config(pseudo_fraction=1.2)
    with pytest.raises(ConfigError, match=r"pseudo.alpha 1\.0"):
        config(pseudo_alpha=1.0)
    with pytest.raises(ConfigError, match=r"pseudo.warmup -1"):
        config(pseudo_warmup=-1)
    with pytest.raises(ConfigError, match=r"pseudo.temperature 0\.0, expected > 0"):
        config(pseudo_temperature=0.0)
    with pytest.raises(ConfigError, match=r"graph_warmup -5, expected an integer >= 0"):
        config(graph_warmup=-5)
    with pytest.raises(ConfigError, match=r"pseudo.propagation_steps -1"):
        config(propagation_steps=-1)
    with pytest.raises(ConfigError, match=r"pseudo.correct_alpha 1\.0, expected a value in \[0, 1\)"):
        config(pseudo_correct_alpha=1.0)
    with pytest.raises(ConfigError, match=r"pseudo.correct_scale -0\.5, expected >= 0"):
        config(pseudo_correct_scale=-0.5)


def test_core_variants_train_and_bank_mode_uses_the_given_neighbours(cora) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    cfg = config(mode="in-graph", k=2, steps=30, unlabelled_batch=128, eval_every=10)
    core = NodeClassifierCore(cora, cfg)
    batch = core.sample_batch()
    assert batch[:140].tolist() == cora.train.tolist() and len(set(batch)) == 140 + 128
    assert not set(batch[140:]) & set(cora.train)
    first = core.train_step(batch)
    assert set(first) >= {"ce", "graph", "loss"}
    for _ in range(29):
        core.train_step(core.sample_batch())
    core.evaluate()
    assert core.best_test_accuracy() > 0.4  # 7 classes: chance is about 0.14-0.3
    # bank mode: the graph term is exactly the loss against the neighbour logits passed in
    bank = NodeClassifierCore(cora, config(mode="bank", k=3, unlabelled_batch=16, lr=1e-9))
    b = bank.sample_batch()
    slots, _, uniq = bank.neighbour_keys(b)
    with torch.no_grad():
        bank.model.train(False)
        target = bank.model(bank.x[uniq]).numpy()
    nb, present = expand_neighbour_rows(slots, uniq, target, np.ones(len(uniq), dtype=bool))
    out = bank.train_step(b, neighbour_logits=nb, neighbour_present=np.zeros_like(present))
    assert out["graph"] == 0.0  # nothing found: no graph term
    with pytest.raises(ConfigError, match="bank mode needs neighbour_logits"):
        bank.train_step(b)
    with pytest.raises(InvalidShapeError, match="neighbour_logits"):
        bank.train_step(b, neighbour_logits=nb[:, :2], neighbour_present=present[:, :2])


def test_neighbour_temperature_sharpens_the_bank_targets(cora) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    terms = {}
    for temp in (1.0, 0.5):
        core = NodeClassifierCore(cora, config(mode="bank", k=3, unlabelled_batch=32, lr=1e-9,
                                                             dropout=0.0, neighbour_temperature=temp))
        b = core.sample_batch()
        slots, weights, uniq = core.neighbour_keys(b)
        rows = np.random.default_rng(1).normal(size=(len(uniq), cora.n_classes)).astype(np.float32)
        nb, present = expand_neighbour_rows(slots, uniq, rows, np.ones(len(uniq), dtype=bool))
        with torch.no_grad():
            logits = core.model(core.x[b])
        w = torch.from_numpy(weights) * torch.from_numpy(present.astype(np.float32))
        expected = graph_regularization(logits, torch.from_numpy(nb) / temp, w)
        terms[temp] = core.train_step(b, neighbour_logits=nb, neighbour_present=present)["graph"]
        assert terms[temp] == pytest.approx(float(expected), rel=1e-5)
    assert terms[0.5] != pytest.approx(terms[1.0], rel=1e-3)


def test_graph_warmup_leaves_the_graph_term_out_then_adds_it(cora) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    core = NodeClassifierCore(cora, config(mode="in-graph", k=2, unlabelled_batch=16, graph_warmup=2))
    outs = [core.train_step(core.sample_batch()) for _ in range(3)]
    assert ["graph" in o for o in outs] == [False, False, True]


def test_soft_targets_drive_the_pseudo_term(cora) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    cfg = config(mode="bank", k=2, unlabelled_batch=8, pseudo_labels=True, pseudo_selection="soft",
                               dropout=0.0, lr=1e-9)
    core = NodeClassifierCore(cora, cfg)
    b = core.sample_batch()
    slots, _, uniq = core.neighbour_keys(b)
    nb, present = expand_neighbour_rows(slots, uniq, np.zeros((len(uniq), 7), np.float32), np.ones(len(uniq), bool))
    targets = np.full((len(b), 7), 1 / 7, dtype=np.float32)
    targets[:, 3] += 0.5
    targets /= targets.sum(1, keepdims=True)
    conf = np.ones(len(b), dtype=np.float32)
    with torch.no_grad():
        logits = core.model(core.x[b])
    expected = soft_target_loss(logits[140:], torch.from_numpy(targets[140:]), torch.ones(len(b) - 140))
    out = core.train_step(b, neighbour_logits=nb, neighbour_present=present, pseudo_labels=targets.argmax(1),
                          pseudo_confidence=conf, pseudo_targets=targets)
    assert out["pseudo"] == pytest.approx(float(expected), rel=1e-5)  # labelled-train rows left out
