"""TLS clusters, JSON-only stores and localhost dashboards."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator
from typing import Any

import dask.config
import numpy as np
import pytest

from carls_dask.bank import Column, TableSpec
from carls_dask.errors import ConfigError
from carls_dask.runtime.clusters import make_security
from carls_dask.runtime.workbench import Workbench
from tests.processes import CARLS_DASK, console_env, free_port, stop_process, wait_for

CONNECT_DEADLINE = 5.0


def table() -> TableSpec:
    return TableSpec("nodes", columns=(Column("embedding", shape=(4,)), Column("label", "int64", (), ())),
                     optimizer="sgd", learning_rate=0.5, initializer="zeros")


@pytest.fixture(scope="module")
def tls_bench() -> Iterator[Workbench]:
    with Workbench(security="temporary", progress=False,
                   cluster_options={"n_workers": 2, "threads_per_worker": 1}) as wb:
        yield wb


def _refused(address: str, **kwargs: Any) -> BaseException:
    """Connect a client to ``address``; return the error it failed with (the test fails if it connects)."""
    from distributed import Client

    start = time.monotonic()
    try:
        client = Client(address, timeout=CONNECT_DEADLINE, **kwargs)
    except Exception as exc:
        assert time.monotonic() - start < 3 * CONNECT_DEADLINE
        return exc
    client.close()
    raise AssertionError(f"a client with {kwargs or 'no security'} connected to {address}")


def _no_certificate_refused(address: str, ca_pem: str) -> bool:
    """Open a raw TLS connection that trusts ``ca_pem`` but sends no client certificate."""
    import socket
    import ssl

    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.create_default_context(cadata=ca_pem)
    ctx.check_hostname = False
    with socket.create_connection((host, int(port)), timeout=CONNECT_DEADLINE) as raw:
        try:
            with ctx.wrap_socket(raw) as tls:
                tls.settimeout(CONNECT_DEADLINE)
                tls.sendall(b"\0" * 64)
                return tls.recv(64) == b""  # TLS 1.3 reports the refusal at the first read
        except (ssl.SSLError, ConnectionResetError):
            return True


def test_workbench_starts_a_tls_cluster_and_the_bank_works_over_it(tls_bench: Workbench,
                                                                    tmp_path: pathlib.Path) -> None:
    from carls_dask.storage.snapshots import read_snapshot

    wb = tls_bench
    assert wb.security is not None and wb.security.require_encryption
    info = wb.client.scheduler_info(n_workers=-1)
    assert info["address"].startswith("tls://")
    assert len(info["workers"]) == 2 and all(w.startswith("tls://") for w in info["workers"])
    bank = wb.bank or wb.create_bank([table()], n_shards=2, buckets=16)
    keys = np.arange(40, dtype=np.int64)
    assert bank.shard_of(keys).tolist().count(1) > 0  # both shards (both workers) take part
    r = bank.lookup("nodes", keys, insert=True)
    assert r.found.all() and not r.values["embedding"].any()
    emb = np.arange(160, dtype=np.float32).reshape(40, 4)
    assert bank.update("nodes", keys, {"embedding": emb, "label": keys * 2}, model_step=3, maker="m") == 40
    bank.apply_gradients("nodes", keys[:10], np.ones((10, 4), np.float32))
    want = emb.copy()
    want[:10] -= 0.5
    got = bank.lookup("nodes", keys)
    np.testing.assert_array_equal(got.values["embedding"], want)
    np.testing.assert_array_equal(got.values["label"], keys * 2)
    version = bank.snapshot(str(tmp_path / "bank"), step=7)
    rows = read_snapshot(tmp_path / "bank", version)["nodes"]
    order = np.argsort(rows["keys"])
    np.testing.assert_array_equal(rows["keys"][order], keys)
    np.testing.assert_array_equal(rows["col/embedding"][order], want)
    # a task on a worker reaches the bank over TLS too
    total = wb.client.submit(lambda b: float(b.lookup("nodes", np.arange(40)).values["embedding"].sum()), bank)
    assert total.result(timeout=60) == float(want.sum())


def test_a_client_without_the_certificate_cannot_connect(tls_bench: Workbench) -> None:
    from distributed import Client
    from distributed.security import Security

    address = tls_bench.client.scheduler.address
    ca = tls_bench.security.tls_ca_file
    # no TLS settings at all
    assert "ssl_context" in str(_refused(address))
    # plain TCP to the TLS port
    exc = _refused(address.replace("tls://", "tcp://"))
    assert isinstance(exc, OSError), repr(exc.__cause__ or exc.__context__)
    # trusts the cluster's CA but presents no certificate of its own: the scheduler ends the handshake
    assert _no_certificate_refused(address, ca)
    # a certificate from another authority
    assert "certificate" in str(_refused(address, security=Security.temporary())).lower()
    # TLS required: a client configured so refuses a plain TCP address before sending anything
    assert "encryption required" in str(_refused(address.replace("tls://", "tcp://"),
                                                 security=Security(require_encryption=True)))
    # the cluster's own certificate connects (the cases above fail for the reasons they test)
    with Client(address, security=tls_bench.security, timeout=CONNECT_DEADLINE) as c:
        assert len(c.scheduler_info(n_workers=-1)["workers"]) == 2


def test_security_settings(tmp_path: pathlib.Path) -> None:
    from distributed.security import Security

    assert make_security() is None  # the default: plain TCP
    assert make_security("none") is None and make_security(False) is None
    sec = Security.temporary()
    assert make_security(sec) is sec
    assert make_security(True).require_encryption
    with pytest.raises(ConfigError, match=r"carls.cluster.security: got 'ssl'; expected one of \['none', 'temporary'"):
        make_security("ssl")
    with dask.config.set({"carls.cluster.security": "files"}), \
            pytest.raises(ConfigError, match=r"carls.cluster.tls.ca-file: got None; expected the path of a PEM file"):
        make_security()
    pem = {}
    for name, text in (("ca.pem", sec.tls_ca_file), ("cert.pem", sec.tls_client_cert),
                       ("key.pem", sec.tls_client_key)):
        pem[name] = tmp_path / name
        pem[name].write_text(text)
    files = {"carls.cluster.tls.ca-file": str(pem["ca.pem"]), "carls.cluster.tls.cert": str(pem["cert.pem"]),
             "carls.cluster.tls.key": str(tmp_path / "missing.pem")}
    with dask.config.set(files), pytest.raises(ConfigError, match=r"carls.cluster.tls.key: got '.*missing.pem'"):
        make_security("files")
    files["carls.cluster.tls.key"] = str(pem["key.pem"])
    with dask.config.set(files):
        got = make_security("files")
    assert got.require_encryption and got.tls_ca_file == str(pem["ca.pem"])
    assert got.tls_worker_cert == got.tls_scheduler_cert == got.tls_client_cert == str(pem["cert.pem"])
    assert got.get_connection_args("client")["ssl_context"] is not None  # the files load as a TLS context


# -- listening interfaces --------------------------------------------------------------------------------
def _listening(pids: list[int]) -> dict[int, str]:
    """``{port: interface}`` of the TCP sockets the processes ``pids`` listen on."""
    import psutil

    out = {}
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        out.update({c.laddr.port: c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN})
    return out


def test_cluster_scheduler_workers_and_dask_dashboard_listen_on_localhost() -> None:
    import os

    import psutil

    with Workbench(progress=False, cluster_options={"n_workers": 1, "threads_per_worker": 1}) as wb:
        me = psutil.Process(os.getpid())
        ports = _listening([me.pid, *(p.pid for p in me.children(recursive=True))])
        dashboard = int(wb.cluster.dashboard_link.split(":")[2].split("/")[0])
        worker = int(next(iter(wb.client.scheduler_info(n_workers=-1)["workers"])).rsplit(":", 1)[1])
        scheduler = int(wb.client.scheduler.address.rsplit(":", 1)[1])
        assert {dashboard, worker, scheduler} <= set(ports)
        assert {ports[p] for p in (dashboard, worker, scheduler)} == {"127.0.0.1"}


def _serve_and_read_interface(tmp_path: pathlib.Path, *extra: str, env: dict[str, str] | None = None) -> str:
    import subprocess

    port = free_port()
    cmd = [CARLS_DASK, "dashboard", str(tmp_path / "run"), "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=console_env(**(env or {})), cwd=tmp_path)
    try:
        import psutil

        def listening() -> dict[int, str] | None:
            assert proc.poll() is None, f"the dashboard exited with {proc.returncode}"
            tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
            found = _listening(tree)
            return found if port in found else None

        found = wait_for(listening, f"the dashboard listening on port {port}", 90, interval=0.2)
        assert found is not None
        return found[port]
    finally:
        stop_process(proc)


def test_served_dashboard_binds_localhost_unless_told_otherwise(tmp_path: pathlib.Path) -> None:
    from carls_dask.dashboard_cli import panel_command

    cmd = panel_command(tmp_path)
    assert cmd[cmd.index("--address") + 1] == "127.0.0.1"
    assert f"localhost:{cmd[cmd.index('--port') + 1]}" in cmd  # websocket origins stay local too
    assert _serve_and_read_interface(tmp_path) == "127.0.0.1"
    # only an explicit option (or setting) binds elsewhere
    wide = panel_command(tmp_path, address="0.0.0.0")
    assert wide[wide.index("--address") + 1] == "0.0.0.0"
    with dask.config.set({"carls.dashboard.address": "0.0.0.0"}):
        cmd = panel_command(tmp_path)
    assert cmd[cmd.index("--address") + 1] == "0.0.0.0"


@pytest.mark.slow
def test_served_dashboard_binds_all_interfaces_only_when_asked(tmp_path: pathlib.Path) -> None:
    assert _serve_and_read_interface(tmp_path, "--address", "0.0.0.0") == "0.0.0.0"
    assert _serve_and_read_interface(tmp_path, env={"DASK_CARLS__DASHBOARD__ADDRESS": "0.0.0.0"}) == "0.0.0.0"


@pytest.mark.slow
def test_trainer_and_maker_run_over_tls() -> None:
    from carls_dask.examples.digits import DigitsMaker, DigitsTrainer, digits_table

    with Workbench(security="temporary", progress=False,
                   cluster_options={"n_workers": 2, "threads_per_worker": 1}) as wb:
        assert wb.client.scheduler.address.startswith("tls://")
        bank = wb.create_bank([digits_table()], n_shards=2)
        wb.submit_trainer(DigitsTrainer("trainer", max_steps=120, publish_every=20))
        wb.submit_maker(DigitsMaker("maker"))
        wb.wait(timeout=600)
        results = wb.stop(timeout=120)
        assert results["trainer"].steps == 120 and len(results["maker"].rounds) >= 1
        assert bank.size("digits") == 1797  # the maker wrote every image's knowledge through TLS
        assert results["trainer"].value["bank_reads"] == 120
