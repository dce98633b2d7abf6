"""What :mod:`carls_dask.bank.actor_internals` assumes about distributed's internals, one test per assumption.

A distributed upgrade that changes one of them fails the test named for it (the module's docstring
lists them, with the distributed version they were written against).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from carls_dask.bank import BankShard, Column, TableSpec
from carls_dask.bank.actor_internals import (
    _UNREACHABLE_TEXT,
    LOST_TEXT,
    actor_handle,
    execute,
    handle_address,
    handle_client,
    handle_lost,
    release_handle,
    run_on_loop,
    scheduler_holds,
    start_shard,
    worker_actors,
    worker_client,
)
from carls_dask.bank.core import LookupRows
from carls_dask.errors import UnknownTableError
from tests.processes import wait_for


def spec() -> TableSpec:
    return TableSpec("t", columns=(Column("embedding", shape=(2,)),), optimizer=None, learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)


@pytest.fixture
def actor(client: Any) -> Iterator[tuple[Any, Any, str]]:
    """A one-shard actor pinned to the first worker: ``(future, handle, worker address)``."""
    worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
    fut = start_shard(client, BankShard, ([spec().to_json()], 0, 1, 4), worker, f"assume-{id(client)}-shard-0")
    handle = fut.result(timeout=60)
    handle.lookup("t", np.arange(3), None, True).result(timeout=30)
    yield fut, handle, worker
    fut.release()


def test_a_handle_exposes_its_worker_address(actor: tuple[Any, Any, str]) -> None:
    _, handle, worker = actor
    assert handle_address(handle) == worker


def test_a_creators_handle_holds_the_actor_future_and_its_status(client: Any, actor: tuple[Any, Any, str]) -> None:
    fut, handle, _ = actor
    assert handle._future is not None and handle._future.status == "finished"
    assert not handle_lost(handle)
    client.cancel([fut])  # an actor whose task is gone: the handle's future leaves "finished"
    assert handle_lost(handle)


def test_a_handles_future_holds_the_actor_until_released(client: Any) -> None:
    worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
    key = f"assume-{id(client)}-held"
    fut = start_shard(client, BankShard, ([spec().to_json()], 0, 1, 4), worker, key)
    handle = fut.result(timeout=60)

    def held(dask_worker: Any) -> bool:
        return key in dask_worker.state.actors

    fut.release()
    time.sleep(0.5)
    assert client.run(held, workers=[worker])[worker]  # the handle's own future still holds it
    release_handle(handle)
    wait_for(lambda: not client.run(held, workers=[worker])[worker], "the worker dropping the released actor", 30)


def test_a_creators_handle_is_bound_to_its_client(client: Any, actor: tuple[Any, Any, str]) -> None:
    _, handle, _ = actor
    assert handle_client(handle) is client
    assert "_worker" in vars(handle)


def test_actor_execute_replies_with_a_status_and_the_result_or_exception(client: Any,
                                                                        actor: tuple[Any, Any, str]) -> None:
    from distributed.protocol import to_serialize

    _, handle, _ = actor

    async def raw(function: str, *args: Any) -> Any:
        return await handle._worker_rpc.actor_execute(function=function, actor=handle.key,
                                                       args=[to_serialize(a) for a in args], kwargs={})

    ok = client.sync(raw, "ping")
    assert ok["status"] == "OK" and ok["result"] == 0
    bad = client.sync(raw, "size", "nope")
    assert bad["status"] == "error" and isinstance(bad["exception"], UnknownTableError)


def test_execute_runs_a_call_and_raises_the_shards_error(actor: tuple[Any, Any, str]) -> None:
    _, handle, _ = actor

    async def both() -> tuple[Any, BaseException | None]:
        size = await execute(handle, "size", ("t",), {})
        try:
            await execute(handle, "size", ("nope",), {})
        except UnknownTableError as exc:
            return size, exc
        return size, None

    size, err = run_on_loop(handle, both)
    assert size == 3 and isinstance(err, UnknownTableError)


def test_a_coroutine_method_is_awaited_on_the_workers_event_loop(actor: tuple[Any, Any, str]) -> None:
    _, handle, _ = actor

    async def read() -> Any:
        return await execute(handle, "call_on_loop", ("lookup", "t", np.arange(4), None), {})

    rows = run_on_loop(handle, read)
    assert isinstance(rows, LookupRows)  # not a coroutine object: the worker awaited it
    assert rows.result().found.tolist() == [True, True, True, False]


def test_the_scheduler_rpc_answers_who_has(client: Any, actor: tuple[Any, Any, str]) -> None:
    _, handle, worker = actor

    async def holds() -> bool:
        return await scheduler_holds(handle)

    assert run_on_loop(handle, holds)
    who = client.sync(lambda: handle._scheduler_rpc.who_has(keys=[handle.key]))
    assert list(who[handle.key]) == [worker]


def test_a_handle_built_from_key_and_address_calls_the_actor(actor: tuple[Any, Any, str]) -> None:
    _, handle, worker = actor
    again = actor_handle(BankShard, handle.key, worker)
    assert again.size("t").result(timeout=30) == 3
    assert handle_address(again) == worker


def _actors_here(dask_worker: Any) -> dict[str, str]:
    return {str(k): type(v).__name__ for k, v in worker_actors(dask_worker).items()}


def test_worker_state_holds_the_actor_object(client: Any, actor: tuple[Any, Any, str]) -> None:
    _, handle, worker = actor
    held = client.run(_actors_here, workers=[worker])[worker]
    assert held[str(handle.key)] == "BankShard"


def _client_of_this_worker() -> str:
    from distributed import get_worker

    return type(worker_client(get_worker())).__name__


def test_a_worker_gives_a_client_to_its_threads(client: Any) -> None:
    assert client.submit(_client_of_this_worker, pure=False).result(timeout=60) == "Client"


def test_the_lost_actor_error_texts_are_distributeds() -> None:
    import distributed.actor

    source = inspect.getsource(distributed.actor)
    assert LOST_TEXT in source and _UNREACHABLE_TEXT in source


def _ping_through_the_worker_loop(key: str, address: str) -> int:
    """A handle bound to the worker only (as one deserialised outside a task is), run on the worker's loop."""
    handle = actor_handle(BankShard, key, address)
    vars(handle)["_client"] = None

    async def ping() -> Any:
        return await execute(handle, "ping", (), {})

    return int(run_on_loop(handle, ping))


def test_a_worker_thread_runs_a_coroutine_on_the_workers_loop(client: Any, actor: tuple[Any, Any, str]) -> None:
    _, handle, worker = actor
    got = client.submit(_ping_through_the_worker_loop, str(handle.key), worker, workers=[worker], pure=False)
    assert got.result(timeout=60) == 0
