"""The dialect forms of a teaching case: strategy, SBP, PyTorch DTensor placements, JAX PartitionSpec.

Each builder turns the JSON keys of its form (spmdsim.tools.cli.cases) into a Case
whose TensorLayout the teaching commands draw and list. Pure: never imports mpi4py.
"""
from __future__ import annotations

import math
from typing import Mapping

from ...errors import DialectError, SpmdsimError, StrategySizeError
from ...layouts.layout import TensorLayout
from ...base.validate import counted
from ...layouts.dialects._common import parse_partition_spec
from .case_checks import (_SBP_KEYS, Case, _device_count_checked, _flag_text, _require, check_device_count,
                          default_names, mesh_names, multi_axis_hint, with_partial_axes, world_size_mismatch)
from ...layouts.dialects.dtensor import placements_to_layout
from ...layouts.dialects.partition_spec import partition_spec_to_layout
from ...layouts.dialects.sbp import parse_sbp, sbp_to_layout
from ...layouts.dialects.strategy import matmul_layouts, parse_strategy, strategy_to_layout

__all__ = ["strategy_case", "sbp_case", "dtensor_case", "partition_spec_case"]


def strategy_case(data: Mapping, shape: tuple[int, ...], partial: tuple[str, ...]) -> Case:
    """One tensor's MindSpore `.shard` strategy over `world_size` devices (default: the strategy's product)."""
    value = data["strategy"]
    if isinstance(value, bool) or not isinstance(value, (str, list, tuple)):
        raise SpmdsimError(
            f"case key 'strategy' must be one tensor's strategy such as [[2, 1, 2, 2, 1]] "
            f"or \"((2, 1, 2, 2, 1),)\", got {value!r}"
        )
    parsed = parse_strategy(value)
    operand = data.get("operand")
    if len(parsed) == 2 and operand is not None:
        return _matmul_operand_case(data, value, parsed, operand, shape, partial)
    if operand is not None:
        raise SpmdsimError(f"operand {operand!r} goes with a MatMul strategy of two tensors such as "
                           f"((2, 1), (1, 4)); strategy {value!r} gives {len(parsed)}")
    if len(parsed) != 1:
        hint = "; for a MatMul strategy add --operand x, w or out" if len(parsed) == 2 else ""
        example = "((" + ", ".join(["2"] + ["1"] * (len(shape) - 1)) + "),)" if shape else "((2, 1),)"
        raise SpmdsimError(  # named as the user gave it: the flag and its key, as the other case refusals
            f"{_flag_text('strategy', value if isinstance(value, str) else str(value))} gives {len(parsed)} "
            f"tensors; expected one tensor's strategy such as {example!r}{hint}"
        )
    parsed = parsed[0]
    strategy = tuple(parsed)
    if len(strategy) != len(shape):  # before the layout, whose error would name its own axis_0, axis_1, ...
        raise SpmdsimError(f"strategy {value!r} has {counted(len(strategy), 'slice count')} but shape {shape!r} "
                           f"has {counted(len(shape), 'dim')}; expected one slice count per tensor dim")
    world = _world_size(data) if "world_size" in data else math.prod(strategy)
    check_device_count(max(world, math.prod(strategy)), f"strategy {value!r}")
    tl = _on_world(lambda: strategy_to_layout(strategy, world))
    return Case(_with_partial(tl, partial, _flag_text("strategy", value)), shape, "strategy", strategy=strategy)


def _on_world(read):
    """``read()``, where a strategy that does not fit --world-size says the world sizes that do (as `run`'s
    "expected --ranks 8"): only a given --world-size can differ, the default is the strategy's own count."""
    try:
        return read()
    except StrategySizeError as exc:
        raise exc.with_ways(f"; expected --world-size {exc.wanted()} (case key 'world_size'), or no --world-size") \
            from None


def _matmul_operand_case(data: Mapping, value: object, parsed: tuple, operand: object,
                         shape: tuple[int, ...], partial: tuple[str, ...]) -> Case:
    """One tensor of ``MatMul().shard(strategy)``: x, w or the (pending) output, as MindSpore lays it out."""
    if operand not in ("x", "w", "out"):
        raise SpmdsimError(f"operand {operand!r} must be 'x', 'w' or 'out'")
    xs, ws = parsed
    # Every axis of the strategy's device matrix: batch and (m, k) from x, n from w.
    needed = math.prod(xs) * ws[-1]
    world = _world_size(data) if "world_size" in data else needed
    check_device_count(max(world, needed), f"strategy {value!r}")
    tl = getattr(_on_world(lambda: matmul_layouts(parsed, world)), operand)
    if len(shape) == len(xs) + 1:
        # The M,K,N (or B,...,M,K,N) shape `spmdsim run matmul` takes: this operand's part of it.
        *batch, m, k, n = shape
        shape = {"x": (*batch, m, k), "w": (*batch, k, n)[len(batch) + 2 - len(ws):],
                 "out": (*batch, m, n)}[operand]
    return Case(_with_partial(tl, partial, f"{_flag_text('strategy', value)} with --operand {operand}"), tuple(shape),
                "strategy")


def sbp_case(data: Mapping, shape: tuple[int, ...], partial: tuple[str, ...]) -> Case:
    """OneFlow nD SBP over a placement of devices."""
    _require(data, _SBP_KEYS, "sbp")
    sbp = parse_sbp(data["sbp"])
    placement = _device_count_checked(data, "placement")
    if "world_size" in data and _world_size(data) != math.prod(placement):
        raise SpmdsimError(world_size_mismatch(data["world_size"], "placement", placement))
    tl = _with_partial(sbp_to_layout(sbp, placement, len(shape)), partial, _flag_text("sbp", data["sbp"]))
    return Case(tl, shape, "sbp", sbp=tuple(str(s) for s in sbp))


def _world_size(data: Mapping) -> int:
    world = data["world_size"]
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise SpmdsimError(f"{_flag_text('world_size', world)} must be a positive number of ranks, such as 8")
    return world


def dtensor_case(data: Mapping, shape: tuple[int, ...], partial: tuple[str, ...]) -> Case:
    """PyTorch DTensor placements over a device mesh of `device_matrix` (dims named by `alias_name`)."""
    _require(data, ("placements", "device_matrix"), "PyTorch DTensor")
    mesh = _device_count_checked(data, "device_matrix")
    names = mesh_names(data, mesh) if "alias_name" in data else None
    tl = placements_to_layout(data["placements"], mesh, len(shape), names)
    return Case(_with_partial(tl, partial, _flag_text("placements", data["placements"])), shape, "dtensor")


def partition_spec_case(data: Mapping, shape: tuple[int, ...], partial: tuple[str, ...]) -> Case:
    """A JAX PartitionSpec over a mesh of `device_matrix` sizes and `alias_name` axis names."""
    _require(data, ("partition_spec", "device_matrix"), "JAX PartitionSpec")
    mesh = _device_count_checked(data, "device_matrix")
    spec = data["partition_spec"]
    if isinstance(spec, str):
        spec = parse_partition_spec(spec)  # ('x', None), x,None, ((sp,dp),None) or JAX's PartitionSpec('x', None)
    names = (mesh_names(data, mesh) if "alias_name" in data else
             default_names(len(mesh), spec if isinstance(spec, (list, tuple)) else (), partial, "JAX PartitionSpec"))
    try:
        tl = partition_spec_to_layout(spec, mesh, len(shape), names)
    except DialectError as exc:
        # Too many plain names for a 1-D tensor: perhaps one dim over several axes.
        hint = multi_axis_hint(spec, len(shape)) if isinstance(spec, (tuple, list)) else ""
        if not hint:
            raise
        raise DialectError(f"{exc}{hint}") from None
    return Case(_with_partial(tl, partial, _flag_text("partition_spec", data["partition_spec"])), shape,
                "partition_spec")


def _with_partial(tl: TensorLayout, partial: tuple[str, ...], given: str) -> TensorLayout:
    """`tl` with the case's `partial` axes added to those its dialect already gives (SBP's P, DTensor's Partial);
    `given` names the dialect's value as the user wrote it (`with_partial_axes`)."""
    return with_partial_axes(tl, partial, given, lambda axis: _flag_text("partial", axis))
