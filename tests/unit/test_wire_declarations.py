"""The wire's messages, each declared once: the frames they make and the events read from dicts."""

from __future__ import annotations

import dataclasses
import pickle

from notebook_accel import wire
from notebook_accel.wire import framing


def test_a_frame_is_a_length_then_the_kind_the_time_and_the_fields_in_declaration_order():
    stack = wire.Stack((("f.py", 1, "g"),), 3, 7, (wire.Collective(
        4, "default", "all_reduce", ("float32[2]",), ("f.py", 1, "g"), 1.0, None, False),),
        timestamp=2.5)
    for message in (wire.Metrics(3, {"loss": 0.5}, timestamp=1.5), stack,
                    wire.FailureRecord(1, 42, 1, "ValueError", "ValueError: x", timestamp=2.0),
                    wire.StopAsk(timestamp=3.0)):
        fields = tuple(getattr(message, f.name) for f in dataclasses.fields(message)
                       if f.name != "timestamp")
        body = pickle.dumps((message.kind.value, message.timestamp, fields),
                            protocol=pickle.HIGHEST_PROTOCOL)
        assert wire.encode(message) == wire.HEADER.pack(len(body)) + body
        assert wire.decode(wire.encode(message)) == message
    # the collectives inside a Stack travel under their public name, whatever module holds them
    assert b"notebook_accel.wire\x94\x8c\nCollective" in wire.encode(stack)


def test_every_event_is_read_from_its_plain_dict_as_its_declaration_says(monkeypatch):
    monkeypatch.setattr(framing, "_now", lambda: 7.0)

    def event(kind, data):
        return wire.decode(wire.encode_data(kind, data))

    progress = {"id": 1, "n": 2, "closed": False}
    assert event(wire.Kind.PROGRESS, progress) == wire.Progress(progress, timestamp=7.0)  # whole
    assert event("metrics", {}) == wire.Metrics(None, {}, timestamp=7.0)
    assert event("metrics", {"step": 2, "values": None}).values == {}  # converted
    assert event("memory", {"gpu": 5, "other": 1}) == wire.Memory(5, timestamp=7.0)
    assert event("phase", {}) == wire.Phase(None, timestamp=7.0)
    assert event("dropped", {"count": "4"}).count == 4 and event("dropped", {}).count == 0
    assert event("rich_hidden", {}).count == 1  # its own default when missing
    assert {kind for kind in wire.Kind if not kind.reliable} == {
        wire.Kind.PROGRESS, wire.Kind.METRICS, wire.Kind.MEMORY, wire.Kind.PHASE,
        wire.Kind.DROPPED, wire.Kind.RICH_HIDDEN}


def test_every_message_class_is_a_message_with_its_kind_and_a_keyword_only_timestamp():
    classes = {cls for cls in vars(wire).values()
               if isinstance(cls, type) and issubclass(cls, wire.Message) and cls is not wire.Message}
    assert {cls.kind for cls in classes} == set(wire.Kind)
    for cls in classes:
        stamp = next(f for f in dataclasses.fields(cls) if f.name == "timestamp")
        assert stamp.kw_only and stamp.default == 0.0 and "__slots__" in vars(cls)  # slotted
