"""User admin, credentials and grants against a broker with security on."""

from __future__ import annotations

import uuid

import pytest

import narad
from conftest import ADMIN_PASSWORD, Broker, Driver, wait_for


@pytest.fixture
def admin(drv: Driver, secure_broker: Broker):  # type: ignore[no-untyped-def]
    return drv.new_client(secure_broker.url, auth=("admin", ADMIN_PASSWORD))


def test_user_admin_round_trip(  # type: ignore[no-untyped-def]
        drv: Driver, secure_broker: Broker, admin) -> None:
    name = f"u-{uuid.uuid4().hex[:8]}"
    grants = [narad.Grant("consume", (f"{name}.*",)), narad.Grant("produce", (f"{name}.in",))]
    user = admin.create_user(name, "first-password", grants)
    assert isinstance(user, narad.User) and user.username == name
    assert set(user.grants) == set(grants)
    assert admin.get_user(name) == user
    assert name in [u.username for u in admin.list_users()]
    with pytest.raises(narad.Conflict) as ce:
        admin.create_user(name, "another-password")
    assert ce.value.code == "user_exists"

    changed = admin.replace_grants(name, [narad.Grant("admin", (f"{name}.*",))])
    assert changed.grants == (narad.Grant("admin", (f"{name}.*",)),)

    me = drv.new_client(secure_broker.url, auth=(name, "first-password"))
    me.change_password(name, "second-password", current_password="first-password")
    again = drv.new_client(secure_broker.url, auth=(name, "second-password"))
    again.create_topic(f"{name}.mine", partitions=1)
    with pytest.raises(narad.Unauthenticated) as ue:
        me.list_topics()
    assert ue.value.status == 401 and not ue.value.retryable

    admin.delete_user(name)
    with pytest.raises(narad.NotFound) as nf:
        admin.get_user(name)
    assert nf.value.code == "user_not_found"


def test_forbidden_and_unauthenticated(  # type: ignore[no-untyped-def]
        drv: Driver, secure_broker: Broker, admin) -> None:
    anonymous = drv.new_client(secure_broker.url)
    with pytest.raises(narad.Unauthenticated):
        anonymous.list_topics()
    name = f"u-{uuid.uuid4().hex[:8]}"
    admin.create_user(name, "a-password", [narad.Grant("consume", (f"{name}.*",))])
    limited = drv.new_client(secure_broker.url, auth=(name, "a-password"))
    with pytest.raises(narad.Forbidden) as fe:
        limited.create_topic(f"{name}.x")
    assert fe.value.status == 403 and fe.value.code == "forbidden" and not fe.value.retryable
    # A consumer refuses to start without the right, and says so.
    admin.create_topic(f"{name}.jobs", partitions=1)
    wrong = drv.new_client(secure_broker.url, auth=(name, "not-the-password"))
    with pytest.raises(narad.Unauthenticated):
        wrong.consume(f"{name}.jobs", drv.handler(lambda m: None))


def test_consumer_stops_when_its_grant_is_revoked(  # type: ignore[no-untyped-def]
        drv: Driver, secure_broker: Broker, admin) -> None:
    name = f"u-{uuid.uuid4().hex[:8]}"
    topic = f"{name}.jobs"
    admin.create_topic(topic, partitions=1)
    admin.create_user(name, "a-password", [narad.Grant("consume", (f"{name}.*",))])
    worker = drv.new_client(secure_broker.url, auth=(name, "a-password"))
    seen: list[narad.Message] = []
    con = worker.consume(topic, drv.handler(seen.append), wait=1)
    admin.produce(topic, b"one")
    wait_for(lambda: con.stats.acked == 1, what="the first message")
    admin.replace_grants(name, [])
    # The broker hides topics a user holds no grant on (404, not 403): terminal too.
    with pytest.raises(narad.NotFound):
        con.wait(30)  # a terminal error stops the loop, and it says so
    assert not con.running and isinstance(con.error, narad.NotFound)
