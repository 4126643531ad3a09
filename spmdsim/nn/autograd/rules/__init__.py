"""Backward rules: every operator's gradient, one module per family of operators.

An operator of `spmdsim.nn.ops` runs its forward (validate, compute the local
block, execute its program) and, when one of its inputs has ``_ag`` set,
makes one call here, ``record_<op>(out, ...)``, which attaches the node
whose backward is the operator's gradient rule. The rule gets the output's
gradient in the layout the node asked for (`Node.want`: for matmul the
local product's, so the forward's Allreduce answers with nothing, its
Reduce_scatter with an Allgather) and returns each input's gradient as a
DTensor in the input's tensor map, a pending sum over the axes its local
math summed over (`grads.grad_tensor`); the backward walk
(`spmdsim.nn.autograd.engine`) resolves and moves them by planned
redistributions, each the conjugate of a forward step.

=================  ==============================================================
module             operators
=================  ==============================================================
``matmul``         matmul, linear, the fused ParallelMLP, embedding
``pointwise``      add ... clip, erf (numpy broadcasting: `DERIVATIVES`), relu
                   and gelu, bias_add, scale, dropout
``reduce``         sum, mean, max, min
``norms``          softmax, layer_norm and rms_norm along a whole dim
``attention``      attention
``losses``         mse_loss, cross_entropy
``shapes``         transpose, reshape, broadcast_to, narrow, concatenate (and
                   what is built from them: chunk, stack, getitem)
``einsum``         einsum
``megatron``       Megatron's fused pieces (spmdsim.nn.ops.megatron): column- and
                   row-parallel products, bias + dropout + residual
``fused``          the graph's fused pieces (spmdsim.nn.ops.fused): einsum + bias
                   (+ reshape), reshape + einsum, bias + dropout + residual,
                   each its chain's rules in turn
=================  ==============================================================

The ops built from these (softmax and the norms along a split dim,
log_softmax, var, masked_fill) take their gradients from the nodes of the
ops they call; a redistribution's node is the graph's own
(`spmdsim.nn.autograd.graph`), its backward the reverse move; a user's
`spmdsim.nn.autograd.Function` brings its own backward.

Most rules do local math only. Two move data themselves, as their forward
did: a slice or a join along a split dim moves its gradient's rows back
(`shapes`, with the mover the forward hands it), and max or min along a
split dim counts the ties over the group (`reduce`, one Allreduce through
the DTensor's own ``redistribute``). No module here imports the runtime:
results are built with the class of the DTensor a rule is given.
"""
from __future__ import annotations

from . import attention, einsum, fused, grads, losses, matmul, megatron, norms, pointwise, reduce, shapes  # noqa: F401
