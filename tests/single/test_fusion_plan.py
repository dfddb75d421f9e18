"""Fusion planning is a pure function: order kept, compatible neighbours fused up to the threshold."""
from gradflow import _native

F32, F64 = 5, 6
SUM, AVG = 0, 1


def item(nbytes, dtype=F32, op=AVG, wire=0, pre=1.0, post=1.0, fusable=True):
    return (dtype, op, wire, pre, post, nbytes, fusable)


def test_fuses_up_to_threshold():
    assert _native.plan_fusion([item(40)] * 5, 100) == [2, 2, 1]


def test_threshold_zero_disables_fusion():
    assert _native.plan_fusion([item(4)] * 3, 0) == [1, 1, 1]


def test_incompatible_neighbours_split_groups():
    items = [item(8), item(8, dtype=F64), item(8, dtype=F64), item(8, op=SUM), item(8, wire=1),
             item(8, pre=0.5), item(8, fusable=False), item(8)]
    assert _native.plan_fusion(items, 1 << 20) == [1, 2, 1, 1, 1, 1, 1]


def test_large_item_alone_and_order_preserved():
    plan = _native.plan_fusion([item(10), item(500), item(10), item(10)], 100)
    assert plan == [1, 1, 2] and sum(plan) == 4


def test_empty():
    assert _native.plan_fusion([], 100) == []
