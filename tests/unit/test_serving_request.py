"""RecordReader: a request's records checked against an MLflow column schema, strictly, with one clear message."""

from __future__ import annotations

import json

import pytest
from mlflow.types import ColSpec, Schema

from hybridtrain.serving.request import BadRecords, RecordReader

SCHEMA = Schema([ColSpec("long", "tenure"), ColSpec("double", "charges"), ColSpec("boolean", "streaming"),
                 ColSpec("string", "contract")])
GOOD = {"tenure": 3, "charges": 89.5, "streaming": True, "contract": "monthly"}


def body(*records) -> str:
    return json.dumps({"dataframe_records": list(records)})


@pytest.fixture(scope="module")
def reader() -> RecordReader:
    return RecordReader(SCHEMA)


def test_records_become_columns_with_nulls_kept_and_extra_keys_ignored(reader):
    cols = reader.read(body(GOOD, {**GOOD, "charges": None, "contract": None, "account_id": "A-7", "tenure": 0}))
    assert cols.rows == 2
    assert cols.values == {"tenure": [3, 0], "charges": [89.5, None], "streaming": [True, True],
                           "contract": ["monthly", None]}
    assert reader.read(body({**GOOD, "charges": 90})).values["charges"] == [90]  # an integer is a number


@pytest.mark.parametrize("change, message", [
    ({"tenure": 3.5}, "column tenure: record 1 has 3.5, but the column takes an integer"),
    ({"tenure": True}, "column tenure: record 1 has true, but the column takes an integer"),
    ({"tenure": None}, "column tenure: record 1 has null, but the column takes an integer"),
    ({"charges": "lots"}, 'column charges: record 1 has "lots", but the column takes a number or null'),
    ({"streaming": 1}, "column streaming: record 1 has 1, but the column takes true or false"),
    ({"contract": 12}, "column contract: record 1 has 12, but the column takes text or null"),
])
def test_a_value_of_the_wrong_type_names_record_column_and_what_it_takes(reader, change, message):
    with pytest.raises(BadRecords) as exc:
        reader.read(body(GOOD, {**GOOD, **change}))
    assert str(exc.value) == message


def test_missing_columns_and_malformed_bodies_say_what_to_send(reader):
    partial = {k: v for k, v in GOOD.items() if k != "contract"}
    with pytest.raises(BadRecords, match="^record 0 lacks the feature column contract; every record needs tenure, "):
        reader.read(body(partial))
    with pytest.raises(BadRecords, match=r"and 1 more problem"):
        reader.read(body({**GOOD, "tenure": "x"}, partial))
    for bad, needle in [("{not json", "the body is not JSON"), (json.dumps({"dataframe_records": {}}), "must be a list"),
                        (body(5), "record 0 is not an object"), (body(), "no records to score")]:
        with pytest.raises(BadRecords, match=needle):
            reader.read(bad)


def test_other_request_forms_are_left_to_mlflows_parser(reader):
    assert reader.read(json.dumps({"dataframe_split": {"columns": list(GOOD), "data": [list(GOOD.values())]}})) is None
    assert reader.read(json.dumps({"dataframe_records": [GOOD], "params": {"x": 1}})) is None
    assert reader.read("[1, 2]") is None


def test_a_schema_type_without_a_record_check_is_refused_when_the_version_loads():
    with pytest.raises(ValueError, match="binary"):
        RecordReader(Schema([ColSpec("binary", "blob")]))


def test_served_connections_send_at_once_without_waiting_for_an_ack():
    """Nagle's algorithm off on every accepted connection, as asyncio sets it for TCP sockets: with it on,
    a response written as headers then body waited ~40 ms for the client's delayed ACK."""
    import asyncio
    import socket

    from hybridtrain.serving.server import bind

    listener = bind("127.0.0.1", 0)
    seen: list[int] = []

    async def main() -> None:
        async def handle(reader, writer):
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.05)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0
