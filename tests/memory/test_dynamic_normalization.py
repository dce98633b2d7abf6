"""DynamicNormalization: batch-norm mode equals torch's BatchNorm1d in training; CARLS's formula; modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from carls_dask.errors import ConfigError
from carls_dask.memory import DynamicNormalization, GaussianMemory, LookupMode, MemoryConfig


def test_batch_norm_mode_matches_batchnorm1d_in_training() -> None:
    torch.manual_seed(0)
    batch, dim = 8, 5
    # one cluster whose buffer is the batch: its mean and (population) variance are the batch's
    cfg = MemoryConfig(dim=dim, per_cluster_buffer_size=batch, max_num_clusters=1, min_variance=1e-12)
    dn = DynamicNormalization(GaussianMemory(cfg), mode=LookupMode.UPDATE, epsilon=1e-5,
                              use_batch_normalization=True)
    bn = torch.nn.BatchNorm1d(dim, eps=1e-5, momentum=1.0)
    with torch.no_grad():
        for p in (dn.mean_scale, bn.weight):
            p.copy_(torch.linspace(0.5, 1.5, dim))
        for p in (dn.mean_offset, bn.bias):
            p.copy_(torch.linspace(-1, 1, dim))
    dn.train(), bn.train()
    for _ in range(3):
        x = torch.randn(batch, dim) * 3 + 2
        y_dn, y_bn = dn(x), bn(x)
        torch.testing.assert_close(y_dn, y_bn, rtol=1e-5, atol=1e-5)
        # the affine parameters get the same gradients (the statistics pass none in either layer's
        # parameters; only the input gradient differs, as BN back-propagates through the batch statistics)
        g = torch.randn(batch, dim)
        gd = torch.autograd.grad((y_dn * g).sum(), [dn.mean_scale, dn.mean_offset])
        gb = torch.autograd.grad((y_bn * g).sum(), [bn.weight, bn.bias])
        for a, b in zip(gd, gb, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # momentum 1 keeps the last batch's mean as BN's running mean: the memory holds the same
    assert dn.last_lookup is not None
    torch.testing.assert_close(torch.from_numpy(dn.last_lookup.mean[0]), bn.running_mean)


def test_carls_formula_on_known_numbers() -> None:
    cfg = MemoryConfig(dim=2, per_cluster_buffer_size=2, max_num_clusters=1, min_variance=1.0)
    mem = GaussianMemory(cfg)
    mem.lookup([[5.0, 2.0], [3.0, 4.0]], LookupMode.UPDATE)   # mean (4, 3), variance (1, 1)
    dn = DynamicNormalization(mem, epsilon=1e-3).eval()       # eval: lookup only
    x = torch.tensor([[1.0, 2.0]])
    out = dn(x)
    mu, var, eps = np.array([4.0, 3.0]), np.array([1.0, 1.0]), 1e-3
    s = ((mu ** 2).sum() + mu) / (5.0 + eps)                   # prior scale 1, offset 0; ||x||^2 = 5
    expected = ((1 + s) * np.array([1.0, 2.0]) - 2 * mu) / np.sqrt(var + eps)
    np.testing.assert_allclose(out.detach().numpy()[0], expected, rtol=1e-5)
    assert mem.state.steps == 1                                # eval did not update the memory


def test_grow_mode_stops_the_input_gradient_and_update_mode_keeps_it() -> None:
    cfg = MemoryConfig(dim=3, per_cluster_buffer_size=4, max_num_clusters=4, distance_to_cluster_threshold=0.2)
    for mode, flows in ((LookupMode.GROW, False), (LookupMode.UPDATE, True)):
        dn = DynamicNormalization(GaussianMemory(cfg), mode=mode).train()
        x = torch.randn(6, 3, requires_grad=True)
        dn(x).sum().backward()
        assert (x.grad is not None and bool(x.grad.abs().sum() > 0)) is flows
        assert dn.mean_scale.grad is not None


def test_layer_trains_in_a_model_and_works_at_batch_size_one() -> None:
    torch.manual_seed(1)
    cfg = MemoryConfig(dim=8, per_cluster_buffer_size=32, max_num_clusters=2, distance_to_cluster_threshold=0.05)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), DynamicNormalization(GaussianMemory(cfg), epsilon=1e-3,
                                use_batch_normalization=True), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 4)
    y = (x[:, 0] + x[:, 1] > 0).long()
    for step in range(150):
        idx = torch.randint(0, 256, (1 if step % 5 == 0 else 16,))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    acc = float((model(x).argmax(1) == y).float().mean())
    assert acc > 0.9, acc


@pytest.mark.parametrize("kw", [{"mode": 0}, {"eval_mode": 4}, {"mode": "grow"}, {"epsilon": 0.0}])
def test_bad_settings_are_refused(kw: dict) -> None:
    with pytest.raises(ConfigError, match="DynamicNormalization"):
        DynamicNormalization(GaussianMemory(MemoryConfig(dim=2)), **kw)
