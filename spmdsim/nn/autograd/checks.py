"""The backward's order of nodes (`_topological`) and its refusals: a loss that is no scalar, options it does not
take, a graph freed or read stale."""
from __future__ import annotations

import math
from itertools import chain, compress, count, tee
from operator import attrgetter, eq, is_
from typing import Any

from ...errors import OperatorError
from .graph import Leaf, Node, stale_reads
from .plans import _AG, _NONE


def _refuse_options(explain: Any, retain_graph: Any, create_graph: Any) -> None:
    """The one-line refusal of `backward`'s `explain` that is no list, or of PyTorch's `retain_graph` or
    `create_graph` asked for (alike on every rank: the arguments are the program's)."""
    if explain is not None and not isinstance(explain, list):
        hint = "; PyTorch's second argument, retain_graph, is spmdsim's explain" if isinstance(explain, bool) else ""
        raise OperatorError(f"backward(explain={explain!r}): expected a list (it receives each answered step's "
                            f"collectives) or None{hint}")
    if retain_graph is not None and retain_graph is not False:
        raise OperatorError(f"backward(retain_graph={retain_graph!r}): not taken; the walk frees each node's saved "
                            "tensors as it goes. Run the forward again for another backward, or add the losses and "
                            "call backward() once: (loss1 + loss2).backward()")
    if create_graph is not False and create_graph is not None:
        raise OperatorError(f"backward(create_graph={create_graph!r}): not taken; the backward records no graph "
                            "of its own (no gradient of a gradient)")


def _refuse_stale(order: list) -> None:
    """Refuse, on every rank alike before any collective, a walk whose graph read a parameter before an optimizer
    step changed its block in place: its rules would read the new values where the forward read the old ones (a
    wrong gradient, without a word; PyTorch's version counter refuses it too)."""
    found = stale_reads(order)
    if found is not None:
        node, t = found
        raise OperatorError(
            f"backward through a graph recorded before an optimizer step changed a parameter it reads in place: "
            f"{node.describe().split(':')[0]!r} read the parameter of global shape {tuple(t.global_shape)!r}, "
            f"layout {t.layout}, whose values are now the step's; run the forward again after step() (or call "
            "backward() before step())")


def _check_loss(loss: Any, gradient: Any) -> None:
    """Refuse a loss or an upstream gradient `backward` cannot take (alike on every rank: shapes, layouts, the
    graph)."""
    shape = getattr(loss, "global_shape", None)
    if shape is None or not hasattr(loss, "_ag"):
        raise OperatorError(f"backward() needs a DTensor loss, got {type(loss).__name__}")
    if gradient is not None:
        g_shape = getattr(gradient, "global_shape", None)
        if g_shape is None or not hasattr(gradient, "_ag"):
            hint = "; explain is a keyword: backward(explain=[...])" if isinstance(gradient, list) else ""
            raise OperatorError(f"backward(gradient): the gradient must be a DTensor, got "
                                f"{type(gradient).__name__}{hint}")
        if tuple(g_shape) != tuple(shape):
            raise OperatorError(f"backward(gradient): gradient of global shape {tuple(g_shape)!r} for a tensor "
                                f"of global shape {tuple(shape)!r}; expected the same shape")
        if gradient.layout.layout != loss.layout.layout:
            raise OperatorError(f"backward(gradient): the gradient is on {gradient.layout.layout} but the tensor "
                                f"on {loss.layout.layout}")
    elif math.prod(shape) != 1:
        raise OperatorError(f"backward() needs a scalar loss (one element), got global shape "
                            f"{tuple(shape)!r}; reduce it first (mse_loss, cross_entropy) or pass its "
                            "upstream gradient: backward(gradient)")
    if loss._ag is None:
        raise OperatorError("backward() of a loss that does not require grad: no tensor it was "
                            "computed from has requires_grad_() (or it was computed under no_grad())")
    if isinstance(loss._ag, Leaf):
        raise OperatorError("backward() of a leaf: the loss must be computed from the parameters")


_SCALAR = ()  # a scalar loss's global shape


def _first_freed(root: Node) -> Node:
    """The freed node of `root`'s graph (a node whose backward is None) that the search meets first, depth
    first from `root`: the one `backward` names in its refusal (every rank alike)."""
    seen, stack = {root}, [root]
    while stack:
        for t in stack.pop().inputs:
            parent = getattr(t, "_ag", None)
            if type(parent) is Node and parent not in seen:
                if parent.backward is None:
                    return parent
                seen.add(parent)
                stack.append(parent)
    raise AssertionError("internal: no freed node found")  # pragma: no cover - only called when one is


def _refuse_freed(node: Node) -> None:
    raise OperatorError(
        f"backward through the graph of {node.describe()!r} a second time: its saved tensors were "
        "freed by the first backward(); run the forward again (two losses of one forward: add them and call "
        "backward() once)")


def _topological(root: Any) -> list:
    """Nodes reachable from `root`, latest recorded first (`Node.seq`): each after every node that consumes
    it, as a node's inputs were recorded before it (refuses freed ones, before any collective)."""
    if type(root) is not Node:
        return []
    if root.backward is None:
        _refuse_freed(root)
    # Breadth first, in C: `order` is the queue, extended by the new nodes among the graph slots of the inputs of
    # the nodes in it, read as it grows (a list's iterator reads its length at each step, and `extend` appends
    # each node as it comes, before the next slot is read: every node is in `order` before its inputs are read,
    # and the search ends when the slots of the last one are read). A node is new where `first.setdefault` answers
    # its own place in the stream of slots (a count in step). No Python per node or input, and no round per
    # depth (a pipeline stage walks a graph each microbatch).
    order = [root]
    first = {root: -1}
    found = filter(_IS_NODE, map(getattr, chain.from_iterable(map(_INPUTS, iter(order))), _AG, _NONE))
    found, again = tee(found)
    order.extend(compress(found, map(eq, map(first.setdefault, again, count()), count())))
    order.sort(key=_SEQ, reverse=True)
    if any(map(is_, _NONE, map(_BACKWARD, order))):  # a freed node (its backward None): named as a search finds it
        _refuse_freed(_first_freed(root))
    return order


_IS_NODE = Node.__instancecheck__  # isinstance(x, Node) in C (no subclass of Node exists)


_SEQ, _INPUTS = attrgetter("seq"), attrgetter("inputs")


_BACKWARD = attrgetter("backward")
