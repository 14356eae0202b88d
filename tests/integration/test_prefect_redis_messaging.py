"""Several Prefect API servers share events through Redis (prefect-redis), as `preheat serve`
runs Prefect with `[serve] prefect_messaging = "redis"`.

Server A runs the services (the event persister among them); server B is an API replica with
`--no-services` on the same database. An event posted to B is persisted by A only when the two
share a message bus: the control run, with the default in-memory bus, shows that it is not.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from helpers import wait_until

from cache_runtime.child_process import ManagedProcess, http_ok
from cache_runtime.services import RedisServer, free_port
from flows.serve.processes import prefect_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _post_event(api: str) -> str:
    event_id = str(uuid.uuid4())
    event = {
        "id": event_id, "occurred": datetime.now(UTC).isoformat(), "event": "preheat.test.shared",
        "resource": {"prefect.resource.id": "preheat.node.b"}, "payload": {"from": "replica"},
    }  # fmt: skip
    assert httpx.post(f"{api}/events", json=[event], timeout=10).status_code == 204
    return event_id


def _persisted(api: str, event_id: str) -> bool:
    body = {"filter": {"event": {"name": ["preheat.test.shared"]}}, "limit": 50}
    response = httpx.post(f"{api}/events/filter", json=body, timeout=10)
    return any(e["id"] == event_id for e in response.json().get("events", []))


@pytest.fixture
def two_servers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(A's API, B's API) on one sqlite database; Redis messaging when the param says so."""
    redis = RedisServer().start() if request.param == "redis" else None
    home = tmp_path / "prefect"
    database = f"sqlite+aiosqlite:///{home / 'shared.db'}"
    messaging = redis.url if redis else None
    ports = free_port(), free_port()
    servers: list[ManagedProcess] = []
    try:
        for port, services in zip(ports, (True, False), strict=True):
            server = prefect_server(
                "127.0.0.1", port, home, tmp_path, database_url=database,
                messaging_redis=messaging, services=services,
            ).start()  # fmt: skip
            servers.append(server)
            # one at a time: both would migrate the shared database at start-up
            server.wait_ready(http_ok(f"http://127.0.0.1:{port}/api/health"), 120)
        yield f"http://127.0.0.1:{ports[0]}/api", f"http://127.0.0.1:{ports[1]}/api"
    finally:
        for server in servers:
            server.stop()
        if redis is not None:
            redis.stop()


@pytest.mark.parametrize("two_servers", ["redis"], indirect=True)
def test_an_event_sent_to_a_replica_reaches_the_services_through_redis(
    two_servers: tuple[str, str],
) -> None:
    a, b = two_servers
    event_id = _post_event(b)
    wait_until(lambda: _persisted(a, event_id), timeout_s=60)


@pytest.mark.parametrize("two_servers", ["memory"], indirect=True)
def test_without_redis_messaging_the_replica_keeps_its_events(
    two_servers: tuple[str, str],
) -> None:
    a, b = two_servers
    control = _post_event(a)  # A's own events are persisted: the persister does run
    wait_until(lambda: _persisted(a, control), timeout_s=60)
    lost = _post_event(b)
    # A's persister has drained everything it received by now (its own later event is in), so
    # B's event is not in transit: it never left B's in-memory bus.
    after = _post_event(a)
    wait_until(lambda: _persisted(a, after), timeout_s=60)
    assert not _persisted(a, lost)
