"""Planning a big model: sizes, budgets, and where infer_auto_device_map puts each piece."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from notebook_accel import (
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
)
from notebook_accel.big_model.devices import use_devices
from notebook_accel.big_model.memory import largest_unit_size, parse_size
from notebook_accel.big_model.planner import resolve_device_map
from tests.big_model_support import Block, FakeGPUs, Net, TiedLM, plan_bytes

MiB = 1 << 20


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


def empty_net(width: int = 64, blocks: int = 24) -> Net:
    with init_empty_weights():
        return Net(width, blocks)


def test_parse_size_units_and_errors():
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("10GB") == 10**10
    assert parse_size("1.5 MiB") == 3 << 19
    assert parse_size(512) == 512
    with pytest.raises(ValueError, match=r"'12 apples'.*GiB"):
        parse_size("12 apples")


def test_init_empty_weights_on_a_3gib_model_adds_under_5mib():
    before = rss_anon()
    model = empty_net(2048, 24)
    added = rss_anon() - before
    assert compute_module_sizes(model)[""] >= 3 << 30
    assert all(p.is_meta for p in model.parameters())
    assert not model.scale.is_meta  # buffers stay real unless asked
    assert added <= 5 * MiB, f"init_empty_weights added {added / MiB:.1f} MiB"


def test_include_buffers_and_init_on_device():
    with init_empty_weights(include_buffers=True):
        model = Net(8, 1)
    assert model.scale.is_meta and model.inp.weight.is_meta
    assert torch.zeros(1).device.type == "cpu"  # constructors are restored afterwards
    with init_on_device("cpu"):
        real = Net(8, 1)
    assert not real.inp.weight.is_meta


def test_compute_module_sizes_counts_tied_weights_once_and_honours_dtype():
    model = TiedLM()
    sizes = compute_module_sizes(model)
    unique = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    assert sizes[""] == sum(t.numel() * 4 for t in unique.values())
    assert sizes["blocks"] == sum(sizes[f"blocks.{i}"] for i in range(4))
    assert compute_module_sizes(model, dtype="float16")[""] == sizes[""] // 2


def test_planner_never_splits_no_split_modules_and_keeps_budgets():
    model = empty_net()
    sizes = compute_module_sizes(model)
    block = sizes["blocks.0"]
    budgets = {0: 5 * block, 1: 4 * block + block // 2, "cpu": 6 * block}
    plan = infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=["Block"])
    assert not [k for k in plan if k.count(".") > 1], plan  # no block was split
    held = plan_bytes(model, plan)
    # GPU 0 runs the offloaded blocks (cpu and disk): it keeps room for the largest of them.
    assert held[0] <= budgets[0] - block
    assert held[1] <= budgets[1]
    assert held["cpu"] <= budgets["cpu"]
    assert set(plan.values()) == {0, 1, "cpu", "disk"}
    # sequential over the GPUs: all of GPU 0's pieces come before GPU 1's
    order = [d for d in plan.values() if isinstance(d, int)]
    assert order == sorted(order)


def test_planner_splits_what_has_no_no_split_class():
    model = empty_net()
    block = compute_module_sizes(model)["blocks.0"]
    plan = infer_auto_device_map(model, max_memory={"cpu": 2 * block})
    assert any(k.startswith("blocks.") and k.count(".") == 2 for k in plan), plan


def test_cpu_only_plan_keeps_room_for_one_streamed_layer():
    model = empty_net()
    sizes = compute_module_sizes(model)
    budget = sizes[""] // 3
    plan = infer_auto_device_map(model, max_memory={"cpu": budget}, no_split_module_classes=["Block"])
    held = plan_bytes(model, plan)
    assert held["cpu"] <= budget - largest_unit_size(model, sizes, ["Block"])
    assert "disk" in plan.values()


def test_small_modules_after_the_cpu_budget_stay_on_cpu():
    """Peer #3041: once one block went to disk, every later piece did, however small."""
    model = empty_net()
    budget = compute_module_sizes(model)[""] // 3
    plan = infer_auto_device_map(model, max_memory={"cpu": budget}, no_split_module_classes=["Block"])
    assert plan["blocks.23"] == "disk"
    assert plan["out"] == "cpu"


def test_buffers_of_split_modules_are_placed():
    """Peer #1510/#4014: a buffer on a module whose children were split got no device."""
    model = empty_net()
    block = compute_module_sizes(model)["blocks.0"]
    plan = infer_auto_device_map(model, max_memory={"cpu": 3 * block}, no_split_module_classes=["Block"])
    assert plan["scale"] == "cpu"


def test_tied_parameters_land_on_one_device():
    with init_empty_weights():
        model = TiedLM(vocab=3000, width=32, blocks=4)
    sizes = compute_module_sizes(model)
    for budgets in ({0: sizes["embed"] + sizes["blocks.0"], 1: sizes[""], "cpu": sizes[""]},
                    {0: sizes["blocks.0"], 1: sizes["embed"] * 3, "cpu": sizes[""]},
                    {"cpu": sizes["embed"] + sizes["blocks.0"] * 2}):
        plan = infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=["Block"])
        device = {name: plan[next(k for k in plan if name == k or name.startswith(k + ".") or k == "")]
                  for name in ("embed", "head")}
        assert device["embed"] == device["head"], plan
        held = plan_bytes(model, plan)
        for key, budget in budgets.items():
            assert held.get(key, 0) <= budget, (plan, held)


def test_integer_gpu_keys_plan_on_a_cpu_only_machine():
    model = empty_net()
    block = compute_module_sizes(model)["blocks.0"]
    plan = infer_auto_device_map(model, max_memory={0: 8 * block, 1: 8 * block, 2: 20 * block},
                                 no_split_module_classes=["Block"])
    assert set(plan.values()) <= {0, 1, 2}
    assert plan["blocks.0"] == 0 and plan["blocks.23"] in (1, 2)


def test_balanced_strategies_spread_over_gpus():
    model = empty_net()
    sizes = compute_module_sizes(model)
    with use_devices(FakeGPUs(2, free=sizes[""] * 2)):
        sequential = resolve_device_map(model, "sequential", no_split_module_classes=["Block"])
        balanced = resolve_device_map(model, "balanced", no_split_module_classes=["Block"])
        low_zero = resolve_device_map(model, "balanced_low_0", no_split_module_classes=["Block"])
        budgets = get_balanced_memory(model, no_split_module_classes=["Block"])
        assert resolve_device_map(model, "auto", no_split_module_classes=["Block"]) == balanced
    assert set(sequential.values()) == {0}
    held = plan_bytes(model, balanced)
    assert abs(held[0] - held[1]) <= 2 * sizes["blocks.0"], held
    assert budgets[0] < sizes[""] and budgets[1] < sizes[""]
    low = plan_bytes(model, low_zero)
    assert low.get(0, 0) < low[1], low


def test_get_max_memory_reads_the_seam_and_parses():
    with use_devices(FakeGPUs(2, free=123)):
        found = get_max_memory()
    assert found[0] == found[1] == 123 and found["cpu"] > 0
    assert get_max_memory({"cuda:1": "1KiB", "cpu": "1MB"}) == {1: 1024, "cpu": 10**6}
    with pytest.raises(ValueError, match="'tpu'"):
        get_max_memory({"tpu": 1})


def test_unknown_strategy_names_the_valid_ones():
    with pytest.raises(ValueError, match="'balanced_low_0'"):
        resolve_device_map(empty_net(), "fastest")


def test_whole_model_fitting_is_one_entry():
    model = nn.Sequential(Block(8), Block(8))
    assert infer_auto_device_map(model, max_memory={"cpu": "1GiB"}) == {"": "cpu"}
