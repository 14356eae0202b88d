"""The embedded redis-server: found, started on a free port, answering, stopped cleanly."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from cache_runtime.services import RedisHandle, RedisServer, RedisStartError, find_redis_server

pytestmark = pytest.mark.integration


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_binary_is_found() -> None:
    binary = find_redis_server()
    assert binary.is_file() and binary.name == "redis-server"


def test_start_ping_stop_without_persistence() -> None:
    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        assert client.config_get("save")["save"] == ""
        assert client.config_get("appendonly")["appendonly"] == "no"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        client.close()
    finally:
        server.stop()
    assert not port_open(server.port)
    server.stop()  # idempotent


def test_handle_uses_configured_url_and_starts_nothing(redis_url: str) -> None:
    with RedisHandle(redis_url) as url:
        assert url == redis_url
    with RedisHandle(None) as url:
        assert url != redis_url and redis.Redis.from_url(url).ping()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert not port_open(port)


def test_startup_failure_is_reported(tmp_path: Path) -> None:
    # A port already taken: the second server exits, and the first one's PING must not fool us.
    with (
        RedisServer() as first,
        pytest.raises(RedisStartError, match=r"redis-server exited|did not answer"),
    ):
        RedisServer(port=first.port, startup_timeout_s=5).start()


def test_a_supervised_server_killed_by_pid_is_reaped_and_started_again_on_its_port() -> None:
    import os
    import signal

    from helpers import wait_until

    server = RedisServer().start().supervise(retry_s=0.05)
    try:
        first = server.pid
        assert first is not None
        redis.Redis.from_url(server.url).set("k", "v")
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: server.restarts == 1 and server.pid not in (None, first))
        client = redis.Redis.from_url(server.url)
        assert client.ping() and client.get("k") is None  # a new, empty instance
        assert client.info("server")["process_id"] == server.pid
        assert not os.path.exists(f"/proc/{first}")  # reaped: a <defunct> would still be listed
        client.close()
    finally:
        server.stop()
    assert server.pid is None
