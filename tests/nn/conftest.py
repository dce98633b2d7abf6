"""The layer tests run torch on one thread: the models are small, and on a shared machine a second intra-op
thread only waits (an index_add of 80 rows took 40 ms with two threads on two busy cores)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
