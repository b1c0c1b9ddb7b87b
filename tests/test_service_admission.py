"""TCP connections that have not authenticated cannot shut the user out.

They have a budget of their own, smaller than the authenticated clients' (server.Admission); when
it is full, the oldest unauthenticated connection makes room for the new one and is told why.
The real `skyline serve --listen`, real sockets that connect and send nothing.
"""

from __future__ import annotations

import pytest

from service_client import ServiceProcess, copy_project
from skyline_engine.service.server import MAX_CLIENTS, MAX_PENDING_PER_PEER

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("admission"))


@pytest.fixture
def service(root, tmp_path):
    # Idle sockets may hold their place for two minutes: only making room can let anyone in.
    service = ServiceProcess(root, "--handshake-timeout", "120", stdio=False, token_file=tmp_path / "token")
    clients = []

    def connect():
        client = service.tcp_client()
        clients.append(client)
        return client

    service.connect = connect
    yield service
    for client in clients:
        client.close()
    service.stop()


@pytest.mark.parametrize("idle", [16, 64])
def test_idle_unauthenticated_sockets_cannot_lock_the_user_out(service, idle):
    user = service.connect()
    user.initialize(token=service.token)
    squatters = [service.connect() for _ in range(idle)]
    newcomer = service.connect()
    assert newcomer.initialize(token=service.token)["protocol_version"] == 1
    assert newcomer.request("status")["analysis_id"] is None
    assert user.request("status")["analysis_id"] is None  # an authenticated client is never closed for room
    # All from one address: beyond its budget, the oldest were closed, each told why first.
    made_room = squatters[: idle + 1 - MAX_PENDING_PER_PEER]
    for squatter in made_room:
        assert squatter.wait_closed(30)
        assert [(m, p["code"]) for m, p in squatter.notifications] == [("protocol_error", "too_many_connections")]
    assert "initialize" in made_room[0].notifications[0][1]["message"]
    assert service.alive()


def test_beyond_the_authenticated_budget_a_client_is_told_why(service):
    for _ in range(MAX_CLIENTS):
        service.connect().initialize(token=service.token)
    extra = service.connect()
    error, _ = extra.call("initialize", {"protocol_version": 1, "token": service.token})
    assert error["code"] == "too_many_connections"
    assert extra.wait_closed(30)
