from decimal import Decimal

import pytest

from common.slots import ResourceSlots, SlotError, SlotsCache, humanize, total


@pytest.mark.parametrize("given, expected", [
    ({"cpu": "2", "mem": "1g"}, {"cpu": "2", "mem": str(2**30)}),
    ({"cpu": 0.5, "mem": "256m"}, {"cpu": "0.5", "mem": str(256 * 2**20)}),
    ({"cpu": "1.50", "mem": "1.5GiB"}, {"cpu": "1.5", "mem": str(3 * 2**29)}),
    ({"mem": 1024}, {"mem": "1024"}),
    ({"mem": "64k"}, {"mem": "65536"}),
    ({"cpu": "100"}, {"cpu": "100"}),
    ({"cuda.device": "2"}, {"cuda.device": "2"}),
])
def test_parse_stores_canonical_units(given, expected):
    assert ResourceSlots.parse(given).to_json() == expected


@pytest.mark.parametrize("given, message", [
    ({"cpu": "two"}, "cpu: 'two' is not a number"),
    ({"cpu": "-1"}, "cpu: '-1' is negative"),
    ({"cpu": "nan"}, "not a finite number"),
    ({"cpu": True}, "is not a number"),
    ({"mem": "lots"}, "mem: 'lots' is not a size"),
    ({"mem": "1.5"}, "not a whole number of bytes"),
    ({"Bad Name": "1"}, "is not a valid resource slot name"),
    (["cpu", 1], "resources must be a mapping"),
])
def test_parse_rejects_bad_input_with_a_clear_message(given, message):
    with pytest.raises(SlotError, match=message.replace("(", r"\(")):
        ResourceSlots.parse(given)


def test_zero_is_refused_where_a_request_needs_an_amount():
    with pytest.raises(SlotError, match="cpu: must be more than zero"):
        ResourceSlots.parse({"cpu": "0"}, allow_zero=False)


def test_add_subtract_and_missing_slots_count_as_zero():
    a = ResourceSlots.parse({"cpu": "1.5", "mem": "1g"})
    b = ResourceSlots.parse({"cpu": "0.5", "cuda.device": "1"})
    assert (a + b).to_json() == {"cpu": "2", "mem": str(2**30), "cuda.device": "1"}
    assert (a - b).to_json() == {"cpu": "1", "mem": str(2**30), "cuda.device": "-1"}
    assert (a - b).clamp_negative()["cuda.device"] == 0
    assert total([a, b, a])["cpu"] == Decimal("3.5")


def test_fits_in_compares_every_requested_slot():
    capacity = ResourceSlots.parse({"cpu": "2", "mem": "1g"})
    assert ResourceSlots.parse({"cpu": "2", "mem": "1g"}).fits_in(capacity)
    assert not ResourceSlots.parse({"cpu": "2.01"}).fits_in(capacity)
    assert not ResourceSlots.parse({"cpu": "1", "cuda.device": "1"}).fits_in(capacity)
    assert ResourceSlots.parse({"cpu": "1", "cuda.device": "0"}).fits_in(capacity)
    assert ResourceSlots.parse({"cpu": "3", "mem": "2g"}).shortfall(capacity) == ["cpu", "mem"]


def test_humanize_for_pages():
    assert humanize({"cpu": "1", "mem": "256m"}) == "cpu 1, mem 256 MiB"


def test_slots_cache_parses_each_distinct_value_once():
    parse = SlotsCache()
    first = parse({"cpu": "1", "mem": "1g"})
    assert first == {"cpu": Decimal(1), "mem": Decimal(2**30)}
    assert parse({"mem": "1g", "cpu": "1"}) is first  # the same value, keys in any order
    assert parse(None) == parse({}) == {}
    assert len(parse.parsed) == 2
