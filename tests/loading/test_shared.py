"""The node-local shared loader with real processes and real shared memory (small arrays)."""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import pathlib
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from carls_dask.errors import ConfigError, DeadlineExceeded
from carls_dask.loading import (
    ConsumerDetached,
    LoaderClosed,
    LoaderError,
    ProducerLost,
    SharedLoader,
    attach,
    loader_exists,
    shared_memory_available,
    shared_memory_free,
)
from tests.loading import workers
from tests.loading.workers import COLS, ROWS, epoch_data, static_labels
from tests.processes import wait_for

SHM = pathlib.Path("/dev/shm")
CTX = multiprocessing.get_context("spawn")


def segments(name: str) -> list[str]:
    """The files of loader ``name`` in /dev/shm (its segment and its lock file)."""
    return sorted(p.name for p in SHM.iterdir() if p.name.startswith(name))


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@pytest.fixture
def name() -> Iterator[str]:
    n = f"carls-test-{uuid.uuid4().hex[:12]}"
    yield n
    for leftover in segments(n):  # a failed test must not leave segments behind for the next
        (SHM / leftover).unlink(missing_ok=True)


def loader(name: str, slots: int = 2, **kw: Any) -> SharedLoader:
    return SharedLoader(name, static={"y": static_labels()}, epoch={"x": ((ROWS, COLS), "float32")},
                        transform=workers.transform, slots=slots, **kw)


class Producer:
    """A producer in a process of its own."""

    def __init__(self, name: str, slots: int = 2, slow_from: int = 10**9, epochs: int | None = None) -> None:
        self.ready, self.stop = CTX.Event(), CTX.Event()
        self.proc = CTX.Process(target=workers.produce, args=(name, slots, slow_from, epochs, self.ready, self.stop))
        self.proc.start()
        assert self.ready.wait(30), "the producer process did not start"

    def close(self) -> None:
        if self.proc.exitcode is None:  # setting the event of a killed waiter would hang
            self.stop.set()
            self.proc.join(20)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(20)


def consumer_process(name: str, epochs: list[int], order_seed: int | None) -> tuple[Any, Any]:
    results = CTX.Queue()
    proc = CTX.Process(target=workers.consume, args=(name, epochs, order_seed, results))
    proc.start()
    return proc, results


@pytest.mark.timeout(60)
def test_consumers_in_other_processes_read_the_bytes_the_producer_wrote_in_their_own_order(name: str) -> None:
    producer = Producer(name, slots=3, epochs=3)  # all three epochs stay in the ring, whenever a consumer comes
    try:
        runs = [consumer_process(name, [0, 1, 2], seed) for seed in (None, 5)]
        got = []
        for proc, results in runs:
            got.append(results.get(timeout=40))
            proc.join(20)
        expected = [digest(epoch_data(e)) for e in (0, 1, 2)] + [digest(static_labels())]
        assert got == [("ok", expected), ("ok", expected)]
    finally:
        producer.close()
    assert segments(name) == [], "the closed loader left files in /dev/shm"


@pytest.mark.timeout(60)
def test_views_are_zero_copy_and_identical_for_every_consumer(name: str) -> None:
    with loader(name) as prod, attach(name, "a") as a, attach(name, "b") as b:
        xa, xb = a.get(0)["x"], b.get(0)["x"]
        assert np.array_equal(xa, epoch_data(0)) and np.array_equal(xb, epoch_data(0))
        assert np.shares_memory(xa, a.get(0)["x"])  # a view of the segment, not a copy
        assert np.array_equal(a.static["y"], static_labels())
        order = np.random.default_rng(1).permutation(ROWS)
        assert np.array_equal(a.rows("x", order), epoch_data(0)[order])
        assert np.array_equal(b.rows("x", slice(None, None, -1)), epoch_data(0)[::-1])
        assert prod.produced >= 1
    assert segments(name) == []


@pytest.mark.timeout(60)
def test_a_slow_consumer_holds_back_a_fast_one_only_within_the_ring(name: str) -> None:
    with loader(name, slots=3), attach(name, "slow") as slow, attach(name, "fast") as fast:
        slow.get(0)
        for e in (1, 2):  # up to slots - 1 epochs ahead: the slow consumer's epoch stays intact
            assert np.array_equal(fast.get(e)["x"], epoch_data(e))
            assert slow.valid()
        assert np.array_equal(fast.get(3)["x"], epoch_data(3))  # slots ahead: the slow one is detached, not waited for
        assert np.array_equal(fast.get(5)["x"], epoch_data(5))
        assert not slow.valid()
        with pytest.raises(ConsumerDetached, match=r"'slow'.*detached"):
            slow.get(1)
        with pytest.raises(ConsumerDetached, match="'slow'"):
            slow.rows("x", [0])


@pytest.mark.timeout(60)
def test_a_consumer_that_released_its_epoch_is_not_detached(name: str) -> None:
    with loader(name, slots=2), attach(name, "maker") as maker, attach(name, "trainer") as trainer:
        maker.get(0)
        maker.release()
        for e in range(4):
            trainer.get(e)
        assert np.array_equal(maker.get(3)["x"], epoch_data(3))  # still attached, reads a held epoch
        with pytest.raises(ConsumerDetached, match="epoch 0 was overwritten"):
            maker.get(0)


@pytest.mark.timeout(60)
def test_killing_the_producer_is_an_error_on_every_consumer(name: str) -> None:
    producer = Producer(name, slots=2, slow_from=2)  # epochs 0 and 1 come, epoch 2 takes a minute
    local = attach(name, "local", wait_timeout=50, producer_timeout=50)
    assert np.array_equal(local.get(1)["x"], epoch_data(1))
    proc, results = consumer_process(name, [2], None)  # waits for epoch 2
    try:
        while not any(p["wanted"] == 2 and p["pid"] == proc.pid for p in local.peers()):
            time.sleep(0.05)  # until the other process waits (the test's timeout bounds this)
        assert producer.proc.pid is not None
        os.kill(producer.proc.pid, signal.SIGKILL)
        producer.proc.join(20)
        with pytest.raises(ProducerLost, match=f"{name}.*'local'.*gone"):
            local.get(2)
        kind, message = results.get(timeout=40)
        proc.join(20)
        assert kind == "ProducerLost" and "gone" in message
    finally:
        local.close()
        producer.close()
    assert segments(name) == [], "the segment of the dead producer was not unlinked"


@contextlib.contextmanager
def stopped_producer(name: str) -> Iterator[Any]:
    """A consumer (producer timeout 0.5 s) that read epoch 0 of a producer process now stopped by
    ``SIGSTOP``; the producer is resumed and killed afterwards."""
    producer = Producer(name, slots=2)
    try:
        with attach(name, "c", wait_timeout=50, producer_timeout=0.5) as c:
            c.get(0)
            assert producer.proc.pid is not None
            os.kill(producer.proc.pid, signal.SIGSTOP)
            try:
                yield c
            finally:
                os.kill(producer.proc.pid, signal.SIGCONT)
    finally:
        producer.proc.kill()
        producer.proc.join(20)


@pytest.mark.timeout(60)
def test_a_stopped_producer_is_lost_after_its_heartbeat_deadline(name: str) -> None:
    with stopped_producer(name) as c, pytest.raises(ProducerLost, match="no heartbeat"):
        c.get(1)
        c.get(2)


@pytest.mark.timeout(60)
def test_a_producer_stopped_while_holding_the_lock_is_lost_not_a_hang(name: str) -> None:
    """The lock is held (here by this process, as a stopped producer would hold it) and the producer is stopped:
    a consumer's next call waits on the lock, sees no heartbeat and raises instead of blocking."""
    import fcntl

    from carls_dask.loading.shared import _lock_path

    with stopped_producer(name) as c:
        fd = os.open(_lock_path(name), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # the producer was stopped while it held the lock itself: the same case
        try:
            t0 = time.monotonic()
            with pytest.raises(ProducerLost, match="no heartbeat"):
                c.get(1)
            assert time.monotonic() - t0 < 30
        finally:
            os.close(fd)


def test_a_loader_larger_than_the_free_shared_memory_is_refused_and_leaves_nothing(name: str) -> None:
    """The segment's memory is reserved when it is created: too little room is a clear error, not a
    SIGBUS at the producer's first write."""
    free = shared_memory_free()
    assert shared_memory_available() and free > 0
    rows = free // (4 * COLS) + 1024  # more float32 rows than fit
    with pytest.raises(LoaderError, match=rf"shared loader '{name}': needs .* MB in /dev/shm, which has .* MB free"):
        SharedLoader(name, static={"y": static_labels()}, epoch={"x": ((rows, COLS), "float32")},
                     transform=workers.transform)
    assert segments(name) == []
    assert not loader_exists(name)


@pytest.mark.timeout(60)
def test_a_failing_transform_is_an_error_naming_it_on_the_consumers(name: str) -> None:
    def bad(epoch: int, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"x": np.zeros((ROWS, COLS + 1), np.float32)}

    with SharedLoader(name, static={}, epoch={"x": ((ROWS, COLS), "float32")}, transform=bad, start=False) as prod, \
            attach(name) as c:
        prod.start()
        with pytest.raises(ProducerLost, match=r"'x' of float32\[64, 11\]; expected float32\[64, 10\]"):
            c.get(0)


@pytest.mark.timeout(60)
def test_closing_unlinks_and_consumers_see_it(name: str) -> None:
    prod = loader(name)
    c = attach(name, "c")
    c.get(0)
    assert loader_exists(name)
    prod.close()
    assert segments(name) == []
    with pytest.raises(LoaderClosed, match="closed"):
        c.get(1)
    c.close()
    prod.close()  # idempotent
    assert segments(name) == []


@pytest.mark.timeout(60)
def test_a_producer_closed_when_unused_serves_its_consumers_until_they_leave(name: str) -> None:
    prod = loader(name, slots=2)
    with attach(name, "reader") as c:
        c.get(0)
        prod.close_when_unused(linger=50)
        assert np.array_equal(c.get(3)["x"], epoch_data(3))  # still produced for the attached reader
        assert segments(name) != []
    wait_for(lambda: segments(name) == [], "the unused loader closed", 20)
    with pytest.raises(LoaderError, match="no segment"):
        attach(name)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"slots": -1}, r"slots=-1; expected an int >= 1"),
    ({"slots": 0}, r"slots=0; expected an int >= 1"),
    ({"consumers": 0}, r"consumers=0; expected an int >= 1"),
    ({"epoch": {"x": ((-4, 2), "float32")}}, r"epoch\['x'\]: shape \(-4, 2\); expected a tuple of ints >= 0"),
    ({"epoch": {"x": ((4, 2), object)}}, r"epoch\['x'\]: dtype object"),
    ({"epoch": {"x": "not a spec"}}, r"epoch\['x'\]: got 'not a spec'; expected an array or a \(shape, dtype\)"),
    ({"static": {"y": [1, 2]}}, r"static\['y'\] is list; expected a numpy array"),
    ({"transform": None}, r"transform=None; expected a callable"),
    ({"epochs": -2}, r"epochs=-2; expected an int >= 0"),
])
def test_bad_loader_arguments_name_the_object_and_create_nothing(name: str, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"static": {"y": static_labels()}, "epoch": {"x": ((ROWS, COLS), "float32")},
                            "transform": workers.transform, **kwargs}
    with pytest.raises(ConfigError, match=f"SharedLoader '{name}'.*{match}"):
        SharedLoader(name, **args)
    assert segments(name) == []


@pytest.mark.parametrize("bad", ["", "../etc", "has space", "x" * 300, 7])
def test_bad_loader_names_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="shared loader name"):
        SharedLoader(bad, static={}, epoch={}, transform=workers.transform)


@pytest.mark.timeout(60)
def test_attach_refuses_unknown_loaders_and_mismatched_arrays_without_registering(name: str) -> None:
    with pytest.raises(LoaderError, match=f"shared loader '{name}': no segment"):
        attach(name)
    with loader(name, consumers=1):
        with pytest.raises(LoaderError, match=r"array 'x' is float32\[64, 10\]; expected float64\[64, 10\]"):
            attach(name, expect={"x": ((ROWS, COLS), "float64")})
        with pytest.raises(LoaderError, match=r"array 'x' is float32\[64, 10\]; expected float32\[64, 9\]"):
            attach(name, expect={"x": ((ROWS, COLS - 1), "float32")})
        with pytest.raises(LoaderError, match=r"no array 'z'; it holds \['x', 'y'\]"):
            attach(name, expect={"z": ((1,), "int8")})
        with pytest.raises(ConfigError, match=r"wait_timeout=-1"):
            attach(name, wait_timeout=-1)
        # the refused attaches took no place: the one place is still free
        with attach(name, "only", expect={"x": ((ROWS, COLS), "float32"), "y": ((ROWS,), "int64")}) as c:
            with pytest.raises(LoaderError, match="all 1 consumer places are taken"):
                attach(name, "second")
            with pytest.raises(ConfigError, match=r"consumer 'only': epoch=-1; expected an int >= 0"):
                c.get(-1)
            with pytest.raises(ConfigError, match=r"no epoch array 'z'"):
                c.get(0)
                c.rows("z", [0])


@pytest.mark.timeout(60)
def test_a_producer_of_a_known_number_of_epochs_refuses_later_ones(name: str) -> None:
    with loader(name, epochs=2), attach(name) as c:
        assert np.array_equal(c.get(1)["x"], epoch_data(1))
        with pytest.raises(LoaderError, match="epoch 2 asked for; the loader produces epochs 0 to 1"):
            c.get(2)


@pytest.mark.timeout(60)
def test_a_second_producer_of_a_live_loader_is_refused(name: str) -> None:
    with loader(name):
        with pytest.raises(LoaderError, match=f"shared loader '{name}': a live producer"):
            loader(name)
        with attach(name) as c:  # the first one is untouched
            assert np.array_equal(c.get(0)["x"], epoch_data(0))


@pytest.mark.timeout(60)
def test_a_wait_has_a_deadline(name: str) -> None:
    with loader(name, slots=1, start=False), attach(name, "c", wait_timeout=0.2) as c:
        with pytest.raises(DeadlineExceeded, match=r"epoch 0 not produced within 0\.2 s"):
            c.get(0)
