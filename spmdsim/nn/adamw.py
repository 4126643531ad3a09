"""AdamW over DTensor parameters: each rank steps its own blocks, together over flat buffers when it can.

The update is adamw_update's (spmdsim.nn.adamw_flat) element by element; decoupled weight decay, as
torch.optim.AdamW."""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Any, Callable, Iterable, Union

import numpy as np

from ..base.buffers import owned_bytes
from ..base.foreign import take_foreign
from ..errors import OperatorError
from ..base.precision import is_low
from ..base.validate import tolerance_arg
from .adamw_flat import (_decay_flags, _end_to_end, _gather_elements, _groups, _memory_order, _picker, _step_pieces,
                         _step_sizes, adamw_update)
from .optim_checks import PYTORCH_KEYWORDS, _adam_args, _into
from .optimizer import _drain, _Optimizer


class AdamW(_Optimizer):
    """AdamW (Loshchilov and Hutter; torch.optim.AdamW's semantics): decay decoupled from the moments.

    Args:
        decay: which parameters decay: None (those of 2 or more dims), a predicate
            ``decay(param) -> bool``, or an iterable of the parameters that decay.
    """

    _moments = 2  # m and v

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2,
                 decay: Union[None, Callable[[Any], bool], Iterable[Any]] = None, **foreign: Any) -> None:
        if foreign:  # torch.optim's keywords, by habit: spmdsim's values pass
            take_foreign(type(self).__name__, foreign, PYTORCH_KEYWORDS)
        super().__init__(params, lr)
        self.betas, self.eps = _adam_args(betas, eps)
        self.weight_decay = tolerance_arg(weight_decay, "weight_decay", OperatorError)
        self.decays = _decay_flags(self.params, decay)
        # Per parameter, as PyTorch keeps it: (steps taken, first moment, second moment).
        self.state: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        self.master: dict[int, np.ndarray] = {}  # float32 copies of bfloat16 parameters, made at their first step
        # The parameters last updated together: the buffer a group's gradients are gathered into (one group's
        # size at most, _GROUP_ELEMENTS), their moments and scratch in flat buffers, their spans and groups.
        self._flat: tuple = ((), None)
        # Parameters known to have taken the same number of steps (`_in_lockstep`), and those whose blocks and
        # gradients were last found of one dtype (`_together_now`): tuples of indices, or None.
        self._steady: Any = None
        self._typed: Any = None
        # A dry run's `state` and `_flat`, by size: per parameter its steps, its block's bytes and where its
        # moments live (None: a pair of its own; else the indices of the flat buffers they view), and the
        # indices of the flat buffers last made.
        self._dry_steps: dict[int, int] = {}
        self._dry_sizes: dict[int, int] = {}
        self._dry_homes: dict[int, Any] = {}
        self._dry_flat: tuple = ()
        self._dry_itemsize = 8  # the flat buffers' element size (the parameters' dtype)
        self._dry_master: dict[int, int] = {}

    _hyper = ("lr", "betas", "eps", "weight_decay")

    def _state_items(self) -> dict:
        out = {}
        for i, (t, m, v) in sorted(self.state.items()):
            out[i] = {"step": t, "exp_avg": m, "exp_avg_sq": v}
            if i in self.master:
                out[i]["master"] = self.master[i]
        return out

    def _entry_spec(self, key: int) -> dict:
        block = self.params[key].local
        if not is_low(block.dtype):
            return {"step": int, "exp_avg": (block.shape, (block.dtype,)), "exp_avg_sq": (block.shape, (block.dtype,))}
        # A bfloat16 one: float32 moments and master copy (its gradients float32, bf16-mixed's); gradients of
        # its own dtype, set by hand, step it in bfloat16 with the others, without a master copy.
        wide = (block.shape, (np.dtype(np.float32), block.dtype))
        return {"step": int, "exp_avg": wide, "exp_avg_sq": wide, "master": (block.shape, (np.dtype(np.float32),),
                                                                            "optional")}

    def _load(self, entries: dict) -> None:
        # Into the live moments where a parameter has them (views of the flat buffers `_update_all` reads); a
        # parameter that gains or loses its state: the flat buffers are made again at the next step, from `state`.
        # A loaded moment that is not copied into the live one (another dtype: a bfloat16 parameter's float32
        # moments) is no longer a view of the flat buffers: those are made again too. The steps loaded may
        # differ: nothing is known in lockstep any more (`_in_lockstep` looks again).
        remake = set(entries) != set(self.state)
        self._steady = None
        for i in [i for i in self.state if i not in entries]:
            del self.state[i]
            self.master.pop(i, None)
        for i, e in entries.items():
            _, m, v = self.state.get(i) or (0, None, None)
            self.state[i] = (e["step"], _into(m, e["exp_avg"]), _into(v, e["exp_avg_sq"]))
            remake = remake or self.state[i][1] is not m or self.state[i][2] is not v
            if "master" in e:
                self.master[i] = _into(self.master.get(i), e["master"])
        if remake:
            self._flat = ((), None)

    def _update(self, index: int, param: np.ndarray, grad: np.ndarray) -> None:
        # A bfloat16 parameter (spmdsim.base.precision's bf16-mixed): a float32 master copy and float32 moments
        # take the update, and the parameter is the master rounded once (Megatron's mixed precision).
        # (The master made once: `setdefault`'s default would be a float32 copy of the block made at every step.)
        target = param if not is_low(param.dtype) else self.master.get(index)
        if target is None:
            target = self.master[index] = param.astype(np.float32)
        t, m, v = self.state.get(index) or (0, np.zeros_like(target), np.zeros_like(target))
        self.state[index] = (t + 1, m, v)
        self._steady = None  # a parameter stepped alone: its steps may differ from the others' now
        adamw_update(target, grad, m, v, t + 1, lr=self.lr, betas=self.betas, eps=self.eps,
                     weight_decay=self.weight_decay if self.decays[index] else 0.0)
        if target is not param:  # rounded once, as astype rounds it, with no block-sized temporary
            np.copyto(param, target, casting="unsafe")

    def _together(self, found: list, taken: Any = None) -> bool:
        # One dtype, and every parameter at the same step (each counts its own): then the moments are one
        # pass each over flat buffers (PyTorch's foreach AdamW), not ~12 numpy calls per parameter.
        # `taken`: index -> steps taken (a dry run's); default `state`'s.
        if len(found) < 2:
            return False
        dtype = found[0][1].dtype
        if taken is None:
            steps = {self.state[i][0] if i in self.state else 0 for i, _, _ in found}
        else:
            steps = {taken.get(i, 0) for i, _, _ in found}
        return len(steps) == 1 and all(b.dtype == dtype and g.dtype == dtype for _, b, g in found)

    def _together_now(self, indices: tuple, blocks: tuple, grads: tuple, again: bool) -> bool:
        # `_together` without its Python per parameter at a step like the last: the same blocks, gradients
        # of the dtypes found last time (`again`), and parameters known to be in lockstep.
        if not (again and indices is self._typed):
            dtype = blocks[0].dtype if blocks else None
            self._typed = indices if len(indices) >= 2 and all(b.dtype == dtype for b in blocks) \
                and all(g.dtype == dtype for g in grads) else None
            if self._typed is None:
                return False
        return self._in_lockstep(indices)

    def _in_lockstep(self, indices: tuple) -> bool:
        """Whether these parameters have all taken the same number of steps: looked up once, then known
        (`_steady`) while they step together (`_update_all`), until one steps alone (`_update`) or a state
        is loaded (`_load`)."""
        steady = self._steady
        if steady is not None and (indices is steady or indices == steady):
            return True
        state = self.state
        if len({state[i][0] if i in state else 0 for i in indices}) != 1:
            return False
        self._steady = indices
        return True

    def _dry_step(self, found: list) -> tuple[int, ...]:
        """`step`'s choices on sizes: the same parameters go together, the flat buffers are made when
        `_flatten` makes them (while the old ones still live), moments never made twice."""
        held = []
        for i, block, _ in found:  # a bfloat16 block: float32 moments (and a float32 master copy)
            self._dry_sizes[i] = block.size * 4 if is_low(block.dtype) else block.nbytes
            if is_low(block.dtype):
                self._dry_master[i] = block.size * 4
        if self._together(found, self._dry_steps):
            indices = tuple(i for i, _, _ in found)
            if indices != self._dry_flat:  # m, v, the scratch and the gather made, the old ones not yet freed
                old = self._dry_held()  # by the old buffers' element size
                self._dry_itemsize = found[0][1].dtype.itemsize
                new = sum(self._dry_sizes[i] for i in indices)
                held.append(old + 2 * new + 2 * self._dry_gather(new))
                self._dry_flat = indices
                for i in indices:
                    self._dry_homes[i] = indices
        for i, _, _ in found:
            self._dry_homes.setdefault(i, None)  # alone: a pair of its own, made at its first step
            self._dry_steps[i] = self._dry_steps.get(i, 0) + 1
        return tuple(held) + (self._dry_held(),)

    def _dry_held(self) -> int:
        """The bytes `state` and `_flat` hold: each own pair; the moments' flat buffers that a parameter's
        moments still view (the whole buffers); the last flat scratch and gather buffers."""
        own = sum(2 * self._dry_sizes[i] for i, home in self._dry_homes.items() if home is None)
        # the last flat set among them, each once: by identity (every parameter of a set holds the one tuple), as
        # hashing the tuples made this O(parameters**2) a step (1,000 layers: a fifth of `spmdsim estimate`'s time)
        viewed = {id(home): home for home in self._dry_homes.values() if home is not None}.values()
        flats = sum(2 * sum(self._dry_sizes[i] for i in indices) for indices in viewed)
        return own + flats + self._dry_buffers()

    def _dry_buffers(self) -> int:
        """The bytes of the last scratch and gather buffers a dry run's `_flatten` would have made."""
        total = sum(self._dry_sizes[i] for i in self._dry_flat)
        return 2 * self._dry_gather(total) if total else 0

    def _dry_gather(self, total: int) -> int:
        """The bytes of the scratch (and of the gather buffer) `_flatten` makes for flat buffers of `total`
        bytes: one group's (`_GROUP_ELEMENTS`)."""
        return _gather_elements(total // self._dry_itemsize) * self._dry_itemsize

    def memory(self) -> dict:
        """This rank's bytes: "optimizer states" (the moments), "master copy" (the float32 copies of bfloat16
        parameters; none otherwise: the parameters are their own), "buffers" (the update's scratch and the
        buffer a group's gradients are gathered into, one group's each: `_GROUP_ELEMENTS`); each buffer
        counted once."""
        if self._dry_sizes:  # a dry run's: what `_dry_held` counts, by kind
            scratch = self._dry_buffers()
            return {"optimizer states": self._dry_held() - scratch, "master copy": sum(self._dry_master.values()),
                    "buffers": scratch}
        moments = owned_bytes(a for _, m, v in self.state.values() for a in (m, v))
        flat = self._flat[1]
        scratch = (flat[0].nbytes + flat[3].nbytes) if flat is not None else 0
        return {"optimizer states": moments, "master copy": sum(a.nbytes for a in self.master.values()),
                "buffers": scratch}

    def states_of(self, params: Iterable[Any]) -> int:
        """The bytes of the moments of these parameters (of this optimizer's; none before their first
        step): both moments' blocks each, views of the flat buffers counted by their own size; a dry run's
        alike from the blocks' sizes. A part of `memory`'s "optimizer states": one kind of parameter's
        (an MoE layer's experts, spmdsim.models.moe.ledger)."""
        wanted = {id(p) for p in params}
        indices = [i for i, p in enumerate(self.params) if id(p) in wanted]
        if self._dry_sizes:
            return sum(2 * self._dry_sizes[i] for i in indices if i in self._dry_steps)
        return sum(self.state[i][1].nbytes + self.state[i][2].nbytes for i in indices if i in self.state)

    def _update_all(self, indices: tuple, params: tuple, grads: tuple) -> None:
        """The same step as `_update` on each parameter, bit for bit: the moments and the step sizes over
        flat buffers, then each block decayed and stepped."""
        if not self._in_lockstep(indices):
            # A replay (the capture found them at one step) after a state_dict loaded with these parameters at
            # different steps: each its own update, as the step run eagerly now would take them.
            for k, i in enumerate(indices):
                self._update(i, params[k], grads[k])
            return
        # Other parameters than last time: new buffers, from the moments as they are now (kept in `state`).
        flat = self._flat
        if flat[0] is not indices and flat[0] != indices:
            self._flatten(indices, params, grads)
            flat = self._flat
        g, m, v, tmp, spans, groups, moments, decays = flat[1]
        if decays is not self.decays:  # (set anew since the buffers were made: each group's flags again)
            groups = self._grouped(indices, params, tmp, spans, groups)
            self._flat = (indices, flat[1][:5] + (groups, moments, self.decays))
        t = self.state[indices[0]][0] + 1
        self.state.update(zip(indices, zip(repeat(t), *moments)))  # (t, m, v): each one's moments, views of m, v
        wd = bool(self.weight_decay)
        decay = 1 - self.lr * self.weight_decay
        # A group of parameters at a time (_GROUP_ELEMENTS): its gradients read where they lie when they lie
        # end to end (a gradient bucket's summed buffer, Megatron's grad buffer), else gathered into `g` (a
        # larger block alone and not contiguous: copied by reshape); its moments and steps, its blocks
        # stepped while that part of the buffers is still in cache; elementwise, so the same values as one
        # pass over the whole buffers.
        # The step sizes go into one group's scratch (`tmp`), as Megatron's fused Adam holds none of the
        # parameters' size; a block larger than a group alone is stepped a piece at a time (`_pieces`).
        hyper = {"lr": self.lr, "betas": self.betas, "eps": self.eps}
        for a, b, members, pick, steps, decaying in groups:
            if b - a > tmp.size:  # one block alone, larger than a group
                (k,) = members
                param, (pa, pb) = params[k], spans[k]
                _step_pieces(param, grads[k], m[pa:pb].reshape(param.shape), v[pa:pb].reshape(param.shape), t,
                             tmp, decay if self.weight_decay and self.decays[indices[k]] else None, **hyper)
                continue
            ours = pick(grads)
            grad = _end_to_end(ours, g.dtype)
            if grad is None:
                grad = np.concatenate([x.reshape(-1) for x in ours], out=g[:b - a])
            _step_sizes(grad, m[a:b], v[a:b], t, tmp[:b - a], **hyper)
            # The decaying blocks decayed (``param *= decay``), then every block stepped by its step sizes, its
            # view of `tmp` (``param -= step``): `map` makes those calls, no Python per parameter (the blocks
            # are apart: each one's values are those of its own two calls in turn).
            if wd and decaying is not None:
                _drain(map(operator.imul, decaying(params), repeat(decay)))
            _drain(map(operator.isub, pick(params), steps))

    def _flatten(self, indices: tuple, params: tuple, grads: tuple) -> tuple:
        """Flat buffers for these parameters, laid out in the order their gradients lie in memory (a bucket's
        members end to end, so a group of them is read in place); each one's moments become views of them
        (values kept), so a later update of one alone (`_update`) writes into them."""
        order = _memory_order(grads)
        ends = np.cumsum([params[k].size for k in order]).tolist()
        starts = [0] + ends[:-1]
        spans: list = [None] * len(params)
        for k, a, b in zip(order, starts, ends):
            spans[k] = (a, b)
        dtype = params[0].dtype
        m, v = (np.zeros(ends[-1], dtype) for _ in range(2))
        g, tmp = (np.zeros(_gather_elements(ends[-1]), dtype) for _ in range(2))
        for k, (a, b) in enumerate(spans):
            i, param = indices[k], params[k]
            t, m_i, v_i = self.state.get(i) or (0, None, None)
            if m_i is not None:
                m[a:b], v[a:b] = m_i.reshape(-1), v_i.reshape(-1)
            self.state[i] = (t, m[a:b].reshape(param.shape), v[a:b].reshape(param.shape))
        groups = _groups(grads, order, starts, ends)
        # What `_update_all` reads at every step, made once with the buffers (`_grouped`); each parameter's
        # moments, the views `state` holds.
        moments = tuple(tuple(self.state[i][n] for i in indices) for n in (1, 2))
        self._flat = (indices, (g, m, v, tmp, tuple(spans), self._grouped(indices, params, tmp, spans, groups),
                                moments, self.decays))

    def _grouped(self, indices: tuple, params: tuple, tmp: np.ndarray, spans: tuple, groups: Any) -> tuple:
        """Each group (a, b, members: positions in the step's columns) with what `_update_all` reads of it at
        every step: `pick` (a tuple of the members' from a column), their step sizes (views of the scratch
        `tmp`; none for a block larger than a group, stepped a piece at a time) and `decaying` (a tuple of the
        members that decay, `decays`' now, from a column; None for none)."""
        out = []
        for a, b, members, *_ in groups:
            steps = tuple(tmp[spans[k][0] - a:spans[k][1] - a].reshape(params[k].shape) for k in members) \
                if b - a <= tmp.size else ()
            decaying = [k for k in members if self.decays[indices[k]]]
            out.append((a, b, members, _picker(members), steps, _picker(decaying) if decaying else None))
        return tuple(out)
