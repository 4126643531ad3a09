"""What a FLOP counter keeps (spmdsim.base.flops counts into it): each matrix product's shape as a `Gemm`,
each other kernel's elements as a `Kernel`, the `Fresh` blocks of each call, and how many times each ran.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ..errors import SpmdsimError
from .precision import named_dtype
from .tables import put


__all__ = ["PHASES", "KERNELS", "KERNEL_PHASES", "KINDS", "Gemm", "Kernel", "Fresh", "FlopCounter"]


PHASES = ("forward", "backward", "recompute")


#: The fused kernels a product may run inside (Gemm.kernel): "" none (a GEMM of its own), "attention" a
#: flash/fused attention kernel (spmdsim.nn.ops.flash, spmdsim.nn.ops.ring_attention).
KERNELS = ("", "attention")


#: What a kernel may be doing: a product's phases, and the optimizer's update.
KERNEL_PHASES = PHASES + ("optimizer",)


#: What a kernel's elements are: "activations" (the operators' values, gradients of values, masks, ids),
#: or the optimizer's roles ("params", "grads", "master", "states"), priced apart (spmdsim.tools.estimate.ledger).
KINDS = ("activations", "params", "grads", "master", "states")


class _HashedOnce:
    """A frozen record whose fields' hash is worked out once (`_keep_hash`, from its __post_init__): a counter
    adds each product or kernel a program runs by it (a dry run's step counts ~10,000), where a dataclass's
    hash builds the tuple of fields on every call. Pickled without it (a str's hash differs between
    processes) and worked out again on load. A dataclass writes its own __hash__ unless its body names one:
    each subclass's body says ``__hash__ = _HashedOnce.__hash__``."""

    def _keep_hash(self) -> None:
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._keep_hash()


@dataclass(frozen=True)
class Gemm(_HashedOnce):
    """One matrix product's shape: (a batch of) (m x k) @ (k x n), its dtype and phase; `kernel` names the fused
    kernel it runs inside ("attention": a flash/fused attention kernel, whose score tiles stay on chip; "" a
    GEMM of its own) and `share` the part of its FLOPs that kernel executes (0.5 for a causal core, whose
    kernel skips the tiles above the diagonal: FlashAttention's count); its FLOPs are the whole product's."""

    batch: int
    m: int
    n: int
    k: int
    dtype: str
    phase: str
    kernel: str = ""
    share: float = 1.0

    def __post_init__(self) -> None:
        for name in ("batch", "m", "n", "k"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise SpmdsimError(f"Gemm {name} {value!r} must be an integer >= 0")
        if self.phase not in PHASES:
            raise SpmdsimError(f"Gemm phase {self.phase!r} must be one of {PHASES!r}")
        if self.kernel not in KERNELS:
            raise SpmdsimError(f"Gemm kernel {self.kernel!r} must be one of {KERNELS!r}")
        if type(self.share) not in (int, float) or not 0 < self.share <= 1:
            raise SpmdsimError(f"Gemm share {self.share!r} must be a number in (0, 1]")
        self._keep_hash()

    __hash__ = _HashedOnce.__hash__

    @property
    def flops(self) -> int:
        """Multiplies and adds: 2 * batch * m * n * k."""
        return 2 * self.batch * self.m * self.n * self.k

    def __str__(self) -> str:
        lead = f"{self.batch} x " if self.batch != 1 else ""
        fused = f" in {self.kernel}" + (f" ({self.share:g} executed)" if self.share != 1 else "") if self.kernel else ""
        return f"{lead}({self.m}x{self.k})@({self.k}x{self.n}) {self.dtype} {self.phase}{fused}"


@dataclass(frozen=True)
class Kernel(_HashedOnce):
    """One non-product kernel's memory traffic in one dtype: elements read and written.

    op: the operator ("layer_norm", "add", "softmax", "adamw", ...); phase: one of KERNEL_PHASES;
    kind: one of KINDS; dtype: numpy's name of the elements' dtype.
    """

    op: str
    phase: str
    kind: str
    dtype: str
    read: int
    written: int

    def __post_init__(self) -> None:
        for name in ("read", "written"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise SpmdsimError(f"Kernel {name} {value!r} must be an integer >= 0")
        if self.phase not in KERNEL_PHASES:
            raise SpmdsimError(f"Kernel phase {self.phase!r} must be one of {KERNEL_PHASES!r}")
        if self.kind not in KINDS:
            raise SpmdsimError(f"Kernel kind {self.kind!r} must be one of {KINDS!r}")
        self._keep_hash()

    __hash__ = _HashedOnce.__hash__

    @property
    def nbytes(self) -> int:
        """Bytes read and written, at the elements' own width (an FP8 copy's too where no dry run of this process
        loaded ml_dtypes: a search's look-ahead runs them in its workers)."""
        return (self.read + self.written) * named_dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Fresh:
    """What one product or kernel call read and wrote that the rank held nowhere else (`FlopCounter.fresh`).

    what: the product's Gemm, or the kernel's operator name; phase: one of PHASES; floating: elements of its
    floating blocks (a product's operands and result are floating); other: bytes of its other blocks (masks,
    ids) at their own width. Each array once, however many of the call's operands and results it is.
    """

    what: Any
    phase: str
    floating: int
    other: int


@dataclass
class FlopCounter:
    """How many times each `Gemm` and each `Kernel` ran while this counter was open; with `calls` and `held`
    (``counting(blocks=True)``) the blocks of each call and the blocks the rank holds anyway (`fresh`)."""

    counts: dict = field(default_factory=dict)  # Gemm -> times executed
    kernels: dict = field(default_factory=dict)  # Kernel -> times executed
    # (what, phase, ((weak reference to the block's owner or None, elements, floating, itemsize), ...)) a call
    calls: Optional[list] = None
    held: Optional[dict] = None  # id(weak reference) -> that reference: blocks `hold` marked

    def fresh(self) -> tuple:
        """The `Fresh` records of the calls seen (None without ``blocks=True``): each call's blocks that are not
        held (`hold`, by identity), equal records once."""
        if self.calls is None:
            return None
        held = self.held
        out: dict = {}  # (what, phase, floating, other) -> None: a Fresh's fields, each record made once
        for what, phase, entries in self.calls:
            floating = other = 0
            for ref, n, is_float, itemsize in entries:
                if ref is not None and held.get(id(ref)) is ref:
                    continue
                if is_float:
                    floating += n
                else:
                    other += n * itemsize
            out[(what, phase, floating, other)] = None
        return tuple(_fresh(key) for key in out)

    def add(self, gemm: Gemm, times: int = 1) -> None:
        """Count `gemm` executed `times` more times."""
        _check_times(times)
        if times:
            self.counts[gemm] = self.counts.get(gemm, 0) + times

    def total(self, phase: Optional[str] = None) -> int:
        """The FLOPs of every product counted, or of those of one `phase`."""
        if phase is not None and phase not in PHASES:
            raise SpmdsimError(f"phase {phase!r} must be one of {PHASES!r} (or None: all)")
        return sum(g.flops * n for g, n in self.counts.items() if phase is None or g.phase == phase)

    def traffic(self, phase: Optional[str] = None) -> int:
        """Bytes the counted kernels read and wrote (at their own widths), or those of one `phase`."""
        if phase is not None and phase not in KERNEL_PHASES:
            raise SpmdsimError(f"phase {phase!r} must be one of {KERNEL_PHASES!r} (or None: all)")
        return sum(k.nbytes * n for k, n in self.kernels.items() if phase is None or k.phase == phase)

    def merge(self, other: "FlopCounter", times: int = 1) -> None:
        """Add `other`'s products and kernels, each `times` times (a cell that ran `times` more times)."""
        _check_times(times)
        for g, n in list(other.counts.items()):
            self.add(g, n * times)
        if times:
            for k, n in list(other.kernels.items()):
                self.kernels[k] = self.kernels.get(k, 0) + n * times
        if self.calls is not None and other.calls is not None:  # the same blocks however often repeated
            self.calls.extend(other.calls)
            self.held.update(other.held)


_FRESH: dict = {}  # Fresh's fields -> that (frozen) Fresh: a search's dry runs make the same records again and again


def _fresh(key: tuple) -> Fresh:
    """``Fresh(*key)``, made once per value (a frozen dataclass's __init__ takes ~1.5 us)."""
    made = _FRESH.get(key)
    if made is None:
        made = Fresh(*key)
        put(_FRESH, key, made, 8192)
    return made


def _check_times(times: Any) -> None:
    if type(times) is not int or times < 0:
        raise SpmdsimError(f"times {times!r} must be an integer >= 0")
