"""Where a kernel's device request goes on an agent's devices (common/devices.py): the plan
the scheduler makes and the agent's allocation map takes."""

from decimal import Decimal

import pytest

from common import devices
from common.slots import ResourceSlots, SlotError

D = Decimal


def agent_free(**used):
    """The free amount of each of four cuda devices, given what is used of some."""
    return ResourceSlots({f"cuda@{n}": 1 - D(str(used.get(f"d{n}", 0))) for n in range(4)})


KEYS = devices.keys_by_kind(agent_free())


def test_whole_devices_come_from_those_entirely_free_in_device_order():
    planned = devices.plan({"cuda.device": D(2)}, agent_free(d0="0.5"), KEYS)
    assert planned == {"cuda@1": 1, "cuda@2": 1}
    assert devices.plan({"cuda.device": D(4)}, agent_free(d3="0.01"), KEYS) is None


def test_shares_go_to_the_fullest_device_that_holds_them():
    free = agent_free(d1="0.5", d2="0.75")
    assert devices.plan({"cuda.shares": D("0.25")}, free, KEYS) == {"cuda@2": D("0.25")}
    assert devices.plan({"cuda.shares": D("0.5")}, free, KEYS) == {"cuda@1": D("0.5")}
    # not packing (for comparison): the emptiest device
    assert devices.plan({"cuda.shares": D("0.25")}, free, KEYS, pack=False) == {
        "cuda@0": D("0.25")}


def test_more_than_one_device_of_shares_takes_as_few_devices_as_it_can_evenly():
    assert devices.share_parts(D("1.5")) == [D("0.75"), D("0.75")]
    assert devices.share_parts(D("2.05")) == [D("0.69"), D("0.68"), D("0.68")]
    assert devices.share_parts(D("0.3")) == [D("0.3")]
    planned = devices.plan({"cuda.shares": D("1.5")}, agent_free(d0="0.25"), KEYS)
    assert planned == {"cuda@0": D("0.75"), "cuda@1": D("0.75")}
    assert devices.plan({"cuda.shares": D("1.5")},
                        agent_free(d0="0.5", d1="0.5", d2="0.5", d3="0.5"), KEYS) is None


def test_packed_shares_leave_whole_devices_free():
    free, taken = agent_free(), []
    for _ in range(4):
        planned = devices.plan({"cuda.shares": D("0.5")}, free, KEYS)
        free, taken = free - planned, taken + list(planned)
    assert sorted(taken) == ["cuda@0", "cuda@0", "cuda@1", "cuda@1"]
    assert devices.plan({"cuda.device": D(2)}, free, KEYS) == {"cuda@2": 1, "cuda@3": 1}


def test_a_hint_is_taken_when_its_devices_are_free_for_it():
    hint = {"cuda@3": D("0.5")}
    assert devices.plan({"cuda.shares": D("0.5")}, agent_free(), KEYS, hint=hint) == hint
    # taken meanwhile: planned again on what is free
    assert devices.plan({"cuda.shares": D("0.5")}, agent_free(d3="0.75"), KEYS,
                        hint=hint) == {"cuda@0": D("0.5")}
    # a hint for another amount is not this request's
    assert devices.plan({"cuda.shares": D("0.25")}, agent_free(), KEYS,
                        hint=hint) == {"cuda@0": D("0.25")}


def test_several_kernels_on_one_agent_each_see_what_the_ones_before_took():
    plans = devices.plan_all([{"cuda.device": D(3)}, {"cuda.shares": D("0.5")}],
                             agent_free(), KEYS)
    assert plans == [{"cuda@0": 1, "cuda@1": 1, "cuda@2": 1}, {"cuda@3": D("0.5")}]
    assert devices.plan_all([{"cuda.device": D(3)}, {"cuda.device": D(2)}],
                            agent_free(), KEYS) is None


def test_allocations_in_backend_ai_shape_and_back():
    planned = devices.plan({"cuda.shares": D("1.5")}, agent_free(), KEYS)
    allocation = devices.allocation_of({"cuda.shares": D("1.5")}, planned)
    assert allocation == {"cuda.shares": {"0": "0.75", "1": "0.75"}}
    assert devices.planned_of(allocation) == planned
    assert devices.device_ids({"cuda.device": {"10": "1", "2": "1"}}) == {"cuda": ["2", "10"]}


@pytest.mark.parametrize("request_, message", [
    ({"cuda.device": "0.5"}, "not a whole number of devices (for a fraction of a device "
                             "ask for cuda.shares)"),
    ({"cuda.device": "1", "cuda.shares": "0.5"}, "not both"),
    ({"cuda.shares": "0.255"}, "finer than 0.01"),
])
def test_requests_no_agent_could_honour_are_refused(request_, message):
    with pytest.raises(SlotError, match=message.replace("(", r"\(").replace(")", r"\)")):
        devices.check_request(ResourceSlots.parse(request_))


def test_device_slots_are_told_apart_from_the_rest():
    slots = ResourceSlots.parse({"cpu": "1", "mem": "1g", "cuda.device": "1",
                                 "rocm.shares": "0"})
    assert devices.device_part(slots) == {"cuda.device": 1}
    assert devices.kind_of("rocm.shares") == "rocm" and devices.kind_of("cpu") is None
    with pytest.raises(SlotError):  # a device key is never a slot a request may name
        ResourceSlots.parse({"cuda@0": "1"})
