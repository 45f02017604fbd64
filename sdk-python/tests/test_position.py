"""Position's JSON: the one form every Narad SDK writes and reads (docs/sdk/contract.md,
Replay), the older forms each SDK wrote before it, and malformed input refused."""

from __future__ import annotations

import pytest

from narad import Position


@pytest.mark.parametrize(("pos", "want"), [
    (Position.beginning(), '{"offsets":{}}'),
    (Position.at_time(1733500000000), '{"offsets":{},"time_ms":1733500000000}'),
    (Position.end(), '{"offsets":{},"start":"latest"}'),
    (Position.at_offsets({10: 1, 3: 7, 0: 12}), '{"offsets":{"0":12,"3":7,"10":1}}'),
    (Position(offsets=((0, 12),), time_ms=1733500000000, incarnation="42"),
     '{"offsets":{"0":12},"time_ms":1733500000000,"incarnation":"42"}'),
    (Position(offsets=((1, 2),), at_end=True, incarnation="7"),
     '{"offsets":{"1":2},"start":"latest","incarnation":"7"}'),
])
def test_every_position_writes_the_one_form(pos: Position, want: str) -> None:
    assert pos.dumps() == want
    assert Position.loads(want) == pos


def test_a_position_at_a_time_and_at_the_end_is_refused() -> None:
    with pytest.raises(ValueError, match="both time_ms and at_end"):
        Position(time_ms=1, at_end=True)


AT = 1733500000000


@pytest.mark.parametrize(("text", "want"), [
    ('{"offsets":{"0":12,"3":7},"time_ms":1733500000000,"incarnation":"42"}',
     Position(offsets=((0, 12), (3, 7)), time_ms=AT, incarnation="42")),
    ('{"offsets":{"0":12},"start":"latest"}', Position(offsets=((0, 12),), at_end=True)),
    ('{"incarnation":"42"}', Position(incarnation="42")),
    ('{"offsets":null,"time_ms":null,"start":null,"incarnation":null}', Position()),
    # Go before the one form: "time" in RFC 3339 (nanoseconds, any offset).
    ('{"offsets":{"0":12},"time":"2024-12-06T15:46:40.000123456Z","incarnation":"42"}',
     Position(offsets=((0, 12),), time_ms=AT, incarnation="42")),
    ('{"time":"2024-12-06T16:46:40+01:00"}', Position(time_ms=AT)),
    ('{"time":"2024-12-06T15:46:40.5-00:30"}', Position(time_ms=AT + 1_800_500)),
    # Python before the one form: sorted keys.
    ('{"incarnation":"42","offsets":{"0":12},"time_ms":1733500000000}',
     Position(offsets=((0, 12),), time_ms=AT, incarnation="42")),
    # TypeScript before the one form: "otherwise".
    ('{"offsets":{"0":12},"otherwise":"earliest","incarnation":"42"}',
     Position(offsets=((0, 12),), incarnation="42")),
    ('{"offsets":{},"otherwise":"latest"}', Position(at_end=True)),
    ('{"offsets":{"1":3},"otherwise":{"time":1733500000000}}',
     Position(offsets=((1, 3),), time_ms=AT)),
])
def test_the_one_form_and_every_old_one_load(text: str, want: Position) -> None:
    assert Position.loads(text) == want


@pytest.mark.parametrize(("text", "why"), [
    ("[]", "JSON object"),
    ("nope", "not JSON"),
    ('{"offsets":[1]}', "offsets must be an object"),
    ('{"offsets":{"0":1.5}}', "integer from 0"),
    ('{"offsets":{"0":"12"}}', "integer from 0"),
    ('{"offsets":{"0":-1}}', "integer from 0"),
    ('{"offsets":{"0":true}}', "integer from 0"),
    ('{"offsets":{"x":1}}', "partition"),
    ('{"offsets":{"-1":1}}', "partition"),
    ('{"offsets":{"01":1}}', "partition"),
    ('{"offsets":{"4294967296":1}}', "partition"),
    ('{"time_ms":1.5}', "time_ms"),
    ('{"time_ms":"1733500000000"}', "time_ms"),
    ('{"start":"earliest"}', "start"),
    ('{"start":"newest"}', "start"),
    ('{"start":1}', "start"),
    ('{"time_ms":1,"start":"latest"}', "both"),
    ('{"time_ms":1,"otherwise":"latest"}', "both"),
    ('{"time":"yesterday"}', "RFC 3339"),
    ('{"time":"2024-13-06T15:46:40Z"}', "RFC 3339"),
    ('{"otherwise":"soon"}', "otherwise"),
    ('{"otherwise":{"time":"x"}}', "otherwise.time"),
    ('{"incarnation":42}', "incarnation"),
])
def test_malformed_positions_are_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Position.loads(text)

