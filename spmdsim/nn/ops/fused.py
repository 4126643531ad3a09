"""The graph's fused pieces: chains of general operators the GPT's default blocks (``kept="graph"``) run, each as
one operator and one node, with the separate operators' values, kept blocks and counts.

A node costs Python on every step (the operator's dispatch, its DTensor, the node, its rule, the backward walk's
bookkeeping), whatever the size of its blocks; these chains are half of a block's nodes. Each piece computes
what the chain computes, with the same numpy calls in the same order (the same bits, forward and backward, under
every precision policy), keeps for backward every block the chain's nodes kept (spmdsim.nn.autograd.kept_bytes
measures the same bytes, by the same kinds), and counts the same FLOPs and kernels (spmdsim.base.flops). Its rule
(`spmdsim.nn.autograd.rules.fused`) runs the chain's rules in turn, without the walk between them (``residual``
and ``norm_affine`` are in spmdsim.nn.ops.residual and spmdsim.nn.ops.norm_affine, with this module's helpers):

- ``einsum_bias(spec, x, w, bias=None, shape=None)``: ``ops.reshape(ops.einsum(spec, x, w) + bias, shape)``, the
  column-parallel products of Q, K, V and fc1 (no bias: the product alone; no shape: not reshaped). The node keeps
  the einsum's operands, the product before its bias and the biased product (what the einsum's, the add's and the
  reshape's nodes kept);
- ``residual(h, y, bias=None, p=0.0, seed=None, mask_dims=None)``: ``h + ops.dropout(y + bias, p, seed,
  mask_dims)``, the row-parallel output's bias, dropout and residual (no bias: dropout and add; p 0: no dropout).
  The node keeps y, the biased y, the dropout's float factors, the dropped-out values, h and the sum (what the
  add's, the dropout's and the residual add's nodes kept; ``kept="megatron"`` has its own,
  spmdsim.nn.ops.megatron.bias_dropout_add, which keeps the boolean mask alone);
- ``reshape_einsum(x, shape, spec, w)``: ``ops.einsum(spec, ops.reshape(x, shape), w)``, the attention output
  merged back to (T, B, D) for its projection; the node keeps x and w (the reshape's and the einsum's);
- ``norm_affine(x, d, eps, centre, op, weight=None, bias=None)``: a layer norm's (`centre`) or RMSNorm's
  normalization along a whole last dim times its weight plus its bias, what ``ops.layer_norm`` and
  ``ops.rms_norm`` run with ``kept="graph"`` where x's rows are whole (no weight: no product; no bias: no add). The
  node keeps x, the normalized values and 1 / sqrt(var + eps) (the normalization's node), the product and the sum
  (the product's and the add's); ``kept="megatron"`` has its own (spmdsim.nn.ops.norms' fused norms, which keep x and
  each row's statistics).

Where the chain would move an operand (its plans' layouts differ) or hold a pending sum, each piece runs the
separate operators instead (their nodes, as before): the fusion is only what the chain does without moving.

What a piece's call signature decides (the operands' layout objects, shapes and dtypes, its arguments, the rank) is
kept after its first call (`_Call`, in a table per piece, as ops.einsum's and ops.pointwise's `Prepared` calls):
a repeat whose chain fuses, moves nothing and is not bfloat16 runs the same kernels and builds its tensors, rule
and node itself, without the general helpers (signature, prepared_result, make_dtensor); a first call, a captured
step (spmdsim.runtime.replay) and a dry run (spmdsim.runtime.sim.dry) go through them.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Optional, Sequence

import numpy as np

from ...base import flops as _flops
from ..autograd.graph import Leaf, attach, used_axes, with_partial
from ..autograd.rules.einsum import EinsumGrads, record_einsum
from ..autograd.rules.grads import NEED2
from ..autograd.rules.fused import EinsumBiasGrads, ReshapeEinsumGrads, bias_sums
from ...base.buffers import CAPTURE
from ...references.contraction import contract, pair_function
from ...base.flops import sweep
from ...programs.infer import infer_reshape
from ...runtime.mesh import foreign
from ...base.precision import is_low, rounded, wide
from . import _common
from .einsum import _PREPARED as _EINSUMS, einsum as _einsum, first_call as _einsum_first_call
from .pointwise import _PREPARED as _ADDS, _Prepared as _PointwisePrepared, _dry_block, pointwise as _pointwise
from ._common import _PLAIN_DTYPES, dry_zeros, make_dtensor, moved, prepare, prepared_result, signature
from .local import reshape
from ...base.tables import put

__all__ = ["einsum_bias", "reshape_einsum"]

# ops.einsum's and ops.pointwise's tables of prepared calls (_EINSUMS, _ADDS): a fused product and add share them.


def _product(spec: str, x: Any, w: Any, stay: bool = False) -> Optional[tuple]:
    """(einsum(spec, x, w) outside the graph, the operands in the plan's layouts, the call's `Prepared`): ops.einsum's
    forward, the same plan, kernel and rounding, without its node; `stay`: None, nothing computed, where the plan
    moves an operand."""
    xs = (x, w)
    try:
        key = signature(spec, xs)
        prepared = _EINSUMS.get(key)
    except (AttributeError, TypeError):
        key = prepared = None
    if prepared is None:
        prepared = _einsum_first_call(spec, xs, key)
    if stay and not prepared.stays:
        return None
    plan = prepared.plan
    xs = moved(xs, prepared)
    if not CAPTURE.on:
        blocks = [xs[0]._local, xs[1]._local]
    else:  # a captured step reads its record's views
        blocks = [xs[0].local, xs[1].local]
    block = contract(plan.spec.inputs, blocks, plan.spec.output)
    if block.dtype != prepared.dtype and not plan.local.partial:  # bfloat16: a float32 product rounded once
        dry = dry_zeros(xs[0].mesh, block.shape, prepared.dtype, rounded, block, prepared.dtype)
        block = rounded(block, prepared.dtype) if dry is None else dry
    return prepared_result(xs[0].mesh, block, prepared), xs, prepared


def _rounds(x: Any) -> bool:
    """Whether a node reading `x` rounds a bfloat16 gradient before its rule (spmdsim.nn.autograd.engine: a node of
    parameters alone does not): x is computed (a node's output, or a recomputed region's input). Where the input a
    fused piece's chain reads first is not, its first node rounds and the fused node would not: the separate
    operators run."""
    ag = x._ag
    return ag is not None and type(ag) is not Leaf


def _add_plan(a: Any, b: Any, op: str = "add") -> Any:
    """ops.add(a, b)'s prepared call (`op` "mul": ops.mul's; ops.pointwise's table, shared), or None when the
    operands are not DTensors of one mesh (the separate operator then says why)."""
    try:
        key = signature(op, (a, b))
        prepared = _ADDS.get(key)
    except (AttributeError, TypeError):
        return None
    if prepared is None:
        cls = _common._DTENSOR or _common._dtensor_class()
        if type(a) is not cls or type(b) is not cls or a.mesh is not b.mesh and foreign(a.mesh, b.mesh):
            return None
        prepared = prepare(_ADDS, 4096, partial(_PointwisePrepared, op), (a, b), key)
    return prepared


def _in_place(plan: Any, layout: Any) -> bool:
    """Whether an add planned as `plan` moves no operand and leaves its result whole in `layout` (the first
    operand's): the chains fused here, else the separate operators run."""
    return plan is not None and plan.stays and not plan.out.partial and (plan.out is layout or plan.out == layout)


def _added(mesh: Any, plan: Any, a: np.ndarray, b: np.ndarray, op: str = "add", kernel: Any = np.add) -> Any:
    """ops.add's result of blocks `a` and `b` under its prepared `plan` (`op` "mul" and its `kernel`: ops.mul's):
    its kernel (bfloat16 widened, rounded once; a dry run's large one: zeros), counted as its one pass."""
    block = _dry_block(mesh, kernel, [a, b]) if mesh.engine.dry else None
    if block is None:
        block = rounded(kernel(wide(a), wide(b)), plan.dtype) if plan.dtype_name == "bfloat16" else kernel(a, b)
    if _flops._OPEN:
        sweep(op, [a, b], (block,))
    return prepared_result(mesh, block, plan)


class _Linear:
    """What an `einsum_bias` call signature decides, once: the einsum's and the add's plans, the reshape's layout
    and block shape on this rank, the bias gradient's sums (the add rule's), and the fused node's name, `want` and
    read layouts; `fused` False where the chain moves an operand or holds a pending sum (the separate operators
    run). Holds the layouts its key names by id."""

    __slots__ = ("einsum", "bias_layout", "add", "fused", "name", "want", "reads", "shaped", "block_shape", "sums")

    def __init__(self, einsum: Any, y: Any, bias: Any, shape: Optional[tuple]) -> None:
        self.einsum, self.bias_layout, self.add = einsum, None if bias is None else bias._layout, None
        self.fused = not einsum.out.partial
        self.shaped = self.block_shape = self.sums = None
        reads, source = einsum.reads, einsum.out
        name = f"einsum {einsum.plan.spec}"
        if bias is not None and self.fused:
            self.add = add = _add_plan(y, bias)
            # (and a pending dY the add would pass the einsum passes too: the bias's gradient sums what the add's did)
            self.fused = _in_place(add, y._layout) and tuple(add.shape) == tuple(y._shape) \
                and used_axes(einsum.reads) <= used_axes(add.reads)
            if self.fused:
                reads, source = reads + add.reads, add.out
                name += " + bias"
                self.sums = bias_sums(add, bias)
        if shape is not None and self.fused:
            layout, new_shape = infer_reshape(source, y._shape, shape)
            self.shaped = (layout, new_shape)
            self.block_shape = layout.local_shape(new_shape, y._mesh.rank)
            reads, source = reads + (source, layout), layout
            name += ", reshaped"
        self.name, self.reads = name, reads
        self.want = with_partial(source, ())


_LINEARS: dict = {}  # (id(einsum's Prepared), id(bias layout), bias shape and dtype, shape, rank) -> _Linear


def einsum_bias(spec: str, x: Any, w: Any, bias: Any = None, shape: Optional[Sequence[int]] = None) -> Any:
    """``ops.reshape(ops.einsum(spec, x, w) + bias, shape)`` in one node (`bias` None: no add; `shape` None: no
    reshape): the separate operators' values, kept blocks and counts (see the module docstring). `bias` is
    broadcast against the product as the add broadcasts it.

    A repeated call signature (`_CALLS`: the operands' layout objects, shapes and dtypes, the shape, the rank)
    whose chain fuses, moves nothing and is not bfloat16 runs its kernels and builds its tensors and node here,
    from what its first call decided (`_Call`), without the general helpers; the rest (a first call, a captured
    step, a dry run) take `_einsum_bias`: the same numpy calls either way."""
    try:
        if bias is None:
            key = spec, id(x._layout), id(w._layout), x._shape, w._shape, x._local.dtype, w._local.dtype, shape, \
                x._mesh.rank
        else:
            key = spec, id(x._layout), id(w._layout), x._shape, w._shape, x._local.dtype, w._local.dtype, shape, \
                x._mesh.rank, id(bias._layout), bias._shape, bias._local.dtype
        call = _CALLS.get(key)
    except (AttributeError, TypeError):  # no DTensor, a shape that does not hash: the general path says why
        key = call = None
    mesh = x._mesh if call is not None else None
    if call is None or CAPTURE.on or mesh.engine.dry:
        return _einsum_bias(spec, x, w, bias, shape, key)
    prepared = call.prepared
    block = call.product(x._local, w._local)  # (_product's contract: the recipe's function, found once)
    if block.dtype != prepared.dtype and not prepared.plan.local.partial:
        block = rounded(block, prepared.dtype)
    if type(block) is _ndarray and block.shape == prepared.block and block.flags.c_contiguous:
        out = y = _new(_common._DTENSOR)  # prepared_result's usual case
        y._mesh, y._local, y._layout, y._shape, y._ag = mesh, block, prepared.out, prepared.shape, None
    else:
        out = y = prepared_result(mesh, block, prepared)
    linear = call.linear
    shaped = linear.shaped
    biased = y._local  # the (biased) product's block: the node keeps it, the rule reads its shape
    if bias is not None:  # _added's kernel and count (no bfloat16 here), its result built as prepared_result's
        add = linear.add
        a, b = biased, bias._local
        block = np.add(a, b)
        if _flops._OPEN:
            sweep("add", [a, b], (block,))
        if type(block) is _ndarray and block.shape == add.block and block.flags.c_contiguous:
            biased = block
            if shaped is None:  # the result (reshaped: a DTensor of its view alone)
                out = _new(_common._DTENSOR)
                out._mesh, out._local, out._layout, out._shape, out._ag = mesh, block, add.out, add.shape, None
        else:
            out = prepared_result(mesh, block, add)
            biased = out._local
    if shaped is not None:  # ops.reshape's view of the block (make_dtensor passed it on the first call)
        block = biased.reshape(linear.block_shape)
        if block.flags.c_contiguous:
            out = _new(_common._DTENSOR)
            out._mesh, out._local, out._layout, out._shape, out._ag = mesh, block, shaped[0], shaped[1], None
        else:
            out = make_dtensor(mesh, block, shaped[0], shaped[1])
    xa, wa = x._ag, w._ag
    if xa is None and wa is None and (bias is None or bias._ag is None):
        return out
    einsum = _new(EinsumGrads)  # einsum_grads' object, without its call
    einsum.xs, einsum.prepared, einsum.need = (x, w), prepared, NEED2[xa is None][wa is None]
    grads = _new(EinsumBiasGrads)  # its __init__'s fields, without its frame
    grads.einsum, grads.y, grads.bias, grads.biased, grads.sums = einsum, y, bias, biased, linear.sums
    grads.shaped = shaped is not None
    return attach(out, linear.name, (x, w) if bias is None else (bias, x, w), grads, linear.want, linear.reads)


class _Call:
    """A fused piece's repeated call signature (`_CALLS`, `_RESIDUAL_CALLS`, `_RESHAPE_CALLS`): what its first call
    decided, for a call that runs its kernels and builds its tensors and node directly (its chain fuses, moves
    nothing, is not bfloat16). Holds its `Prepared` calls, which hold the layouts its key names by id."""

    __slots__ = ("prepared", "linear", "residual", "geometry", "sums", "flat", "name", "reads", "product")

    def __init__(self, prepared: Any = None, linear: Any = None, blocks: tuple = ()) -> None:
        self.prepared, self.linear = prepared, linear
        self.residual = self.geometry = self.sums = self.flat = self.name = self.reads = None
        # The product's function of the operands' blocks (`blocks`, the first call's: the key fixes their shapes
        # and dtypes on this rank): `pair`'s, without its test of a dry run and bfloat16 where neither block is
        # bfloat16 (a repeat runs on no dry run), found once.
        self.product = None
        if blocks:
            (a_word, b_word), output = prepared.words
            self.product = pair_function(a_word, blocks[0], b_word, blocks[1], output)


def _plain(shape: Any) -> bool:
    """`shape` None or a tuple of Python ints (16.0 finds 16's entry: never kept)."""
    return shape is None or type(shape) is tuple and all(type(n) is int for n in shape)


# einsum_bias's call signature (spec; the operands' layout ids, shapes and dtypes; the shape; the rank; the bias's
# layout id, shape and dtype) -> _Call
_CALLS: dict = {}
_ndarray = np.ndarray
_new = object.__new__


def _einsum_bias(spec: str, x: Any, w: Any, bias: Any, shape: Any, call_key: Any) -> Any:
    """`einsum_bias` through the general helpers (`call_key`: its call signature, kept in `_CALLS` where a repeat can
    run directly; None: never)."""
    y, xs, prepared = _product(spec, x, w)
    if bias is None and shape is None:
        return _separate(y, xs, prepared, None, None)
    mesh = y._mesh
    try:
        key = (id(prepared), shape, mesh.rank) if bias is None else \
            (id(prepared), shape, mesh.rank, id(bias._layout), bias._shape, bias._local.dtype)
        linear = _LINEARS.get(key)
    except (AttributeError, TypeError):  # a bias that is no DTensor (the add says so), a shape that does not hash
        return _separate(y, xs, prepared, bias, shape)
    if linear is None:
        linear = _Linear(prepared, y, bias, None if shape is None else tuple(shape))
        if type(shape) is tuple or shape is None:
            put(_LINEARS, key, linear, 4096)
    record = xs[0]._ag is not None or xs[1]._ag is not None or bias is not None and bias._ag is not None
    if not linear.fused or record and y._local.dtype.kind == "V" and is_low(y._local.dtype) and not _rounds(xs[0]):
        return _separate(y, xs, prepared, bias, shape)
    if (call_key is not None and prepared.stays and prepared.paired and y._local.dtype in _PLAIN_DTYPES
            and (bias is None or linear.add.dtype_name != "bfloat16" and linear.add.dtype in _PLAIN_DTYPES)
            and _plain(shape) and type(mesh) is _common._MESH):
        put(_CALLS, call_key, _Call(prepared, linear, (xs[0]._local, xs[1]._local)), 4096)
    out = biased = y
    if bias is not None:
        plain = not CAPTURE.on
        out = biased = _added(mesh, linear.add, y._local if plain else y.local, bias._local if plain else bias.local)
    if linear.shaped is not None:  # ops.reshape's view of each rank's block
        layout, new_shape = linear.shaped
        out = make_dtensor(mesh, biased.local.reshape(linear.block_shape), layout, new_shape)
    if not record:
        return out
    grads = EinsumBiasGrads(xs, linear.einsum, y, bias, biased._local, linear.sums, linear.shaped is not None)
    inputs = xs if bias is None else (bias, xs[0], xs[1])  # the bias's gradient first, as the add's node gave it
    return attach(out, linear.name, inputs, grads, linear.want, linear.reads)


def _separate(y: Any, xs: tuple, prepared: Any, bias: Any, shape: Any) -> Any:
    """The separate operators from the product `y` computed outside the graph: the einsum's node, the add, the
    reshape."""
    if xs[0]._ag is not None or xs[1]._ag is not None:
        y = record_einsum(y, xs, prepared)
    if bias is not None:
        y = _pointwise("add", y, bias)
    return y if shape is None else reshape(y, shape)


def reshape_einsum(x: Any, shape: Sequence[int], spec: str, w: Any) -> Any:
    """``ops.einsum(spec, ops.reshape(x, shape), w)`` in one node: the separate operators' values, kept blocks and
    counts (see the module docstring)."""
    if getattr(x, "_ag", None) is None:
        return _einsum(spec, reshape(x, shape), w)
    try:  # a repeated call signature (`_RESHAPE_CALLS`) that fuses and is not bfloat16: built here
        key = spec, id(x._layout), id(w._layout), x._shape, w._shape, x._local.dtype, w._local.dtype, shape, \
            x._mesh.rank
        call = _RESHAPE_CALLS.get(key)
    except (AttributeError, TypeError):  # no DTensor w, a shape that does not hash: the general path
        key = call = None
    mesh = x._mesh
    if call is None or CAPTURE.on or mesh.engine.dry:
        return _reshape_einsum(x, shape, spec, w, key)
    layout, new_shape, block_shape = call.flat
    block = x._local.reshape(block_shape)
    if block.flags.c_contiguous:  # ops.reshape's repeat, outside the graph
        flat = _new(_common._DTENSOR)
        flat._mesh, flat._local, flat._layout, flat._shape, flat._ag = mesh, block, layout, new_shape, None
    else:
        flat = make_dtensor(mesh, block, layout, new_shape)
    prepared = call.prepared
    block = call.product(flat._local, w._local)  # (_product's contract: the recipe's function, found once)
    if block.dtype != prepared.dtype and not prepared.plan.local.partial:
        block = rounded(block, prepared.dtype)
    if type(block) is _ndarray and block.shape == prepared.block and block.flags.c_contiguous:
        y = _new(_common._DTENSOR)  # prepared_result's usual case
        y._mesh, y._local, y._layout, y._shape, y._ag = mesh, block, prepared.out, prepared.shape, None
    else:
        y = prepared_result(mesh, block, prepared)
    flat._ag = x._ag  # ReshapeEinsumGrads' fields, without its frame and einsum_grads' call
    einsum = _new(EinsumGrads)
    einsum.xs, einsum.prepared, einsum.need = (flat, w), prepared, NEED2[False][w._ag is None]
    grads = _new(ReshapeEinsumGrads)
    grads.einsum, grads.x = einsum, x
    return attach(y, call.name, (x, w), grads, prepared.want, call.reads)


# reshape_einsum's call signature (spec; the layout ids, shapes and dtypes of x and w; the shape; the rank) -> _Call
_RESHAPE_CALLS: dict = {}


def _reshape_einsum(x: Any, shape: Any, spec: str, w: Any, key: Any) -> Any:
    """`reshape_einsum` of an x that takes a gradient, through the general helpers (`key`: its call signature,
    kept in `_RESHAPE_CALLS` where a repeat can run directly; None: never)."""
    flat = reshape(type(x)._trusted(x._mesh, x._local, x._layout, x._shape), shape)  # outside the graph
    made = _product(spec, flat, w, stay=True)
    if made is None or not _rounds(x) and is_low(x._local.dtype):  # the plan moves the reshaped x: separate
        return _einsum(spec, reshape(x, shape), w)
    y, xs, prepared = made
    name, reads = f"reshape, einsum {prepared.plan.spec}", (x._layout,) + prepared.reads
    if (key is not None and xs[1] is w and prepared.paired and _plain(shape) and y._local.dtype in _PLAIN_DTYPES
            and flat._local.dtype in _PLAIN_DTYPES and type(x._mesh) is _common._MESH):
        call = _Call(prepared, None, (flat._local, w._local))
        call.flat = (flat._layout, flat._shape, flat._local.shape)
        call.name, call.reads = name, reads
        put(_RESHAPE_CALLS, key, call, 4096)
    return attach(y, name, (x, xs[1]), ReshapeEinsumGrads(x, flat, xs[1], prepared), prepared.want, reads)
