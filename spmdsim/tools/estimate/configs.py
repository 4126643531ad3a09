"""The parallel configurations of a GPT that `search` (spmdsim.tools.estimate.search) chooses among.

Each configuration sets tensor parallel tp, context parallel cp and its method (a dense GPT), pipeline
stages pp and virtual stages v, data parallel dp, expert parallel ep and the experts' own tp (with MoE layers:
split over attention's tp, or with tp above 1 folded into their ep whole or over a divisor of tp,
Megatron-Core's parallel folding, spmdsim.models.moe.fold), microbatches, recomputation, ZeRO (0 to 3) and
sequence parallelism; the rules they obey: the search module's docstring. `parse_fixed` reads `--fix tp=8 ...`,
`fixed_configurations` keeps the configurations that have those degrees.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from ...errors import SpmdsimError
from ...models.axes import CONTEXT, DATA, EXPERT, PIPELINE, TENSOR
from ...models.gpt.context import Context, context_problem
from ...models.gpt.pipeline_problems import pipeline_layout_problem
from ...models.moe.fold import fold_problem
from ...programs.context import METHODS
from ...programs.pipeline.records import MAX_PAIRS
from .transfers import uneven_on_nodes

__all__ = ["Config", "configurations", "vocab_note", "fold_note", "context_note", "MAX_CONFIGS",
           "RECOMPUTE", "ZERO", "FIXABLE", "parse_fixed", "fixed_configurations", "model_of"]

#: Most configurations a search enumerates before it refuses (the enumeration alone is cheap).
MAX_CONFIGS = 200_000

RECOMPUTE = ("none", "selective", "full")
#: The ZeRO stages searched (spmdsim.models.gpt.memory.ZERO): 1 and 2 only with more than one rank to shard over
#: (dp x ep x cp), 3 (the parameters sharded too, over dp x cp: spmdsim.nn.fsdp) only with dp x cp > 1 and no MoE
#: layers.
ZERO = (0, 1, 2, 3)


@dataclass(frozen=True)
class Config:
    """One way to train the GPT: the mesh, the schedule, recomputation, ZeRO and sequence parallelism; `cp`
    context-parallel ranks, each sequence split over them for the whole block, attention by `cp_method`
    (spmdsim.models.gpt.context: "ring", "allgather" or "alltoall"; the balanced causal split).

    With MoE layers `ep` is the size of the mesh's "ep" axis (pp x dp x ep x cp x tp = the devices, as the ledger
    takes it) and `etp` the experts' own tp (MoEConfig.etp): 0, split over attention's tp as attention is; a
    divisor of tp below it (tp above 1 only; 1, whole experts), attention's other tp ranks folded into their
    expert-parallel group (spmdsim.models.moe.fold): the experts' ep is then ep x tp / etp (`experts_ep`, what
    `spmdsim estimate --ep` and the search's table count) and their tp etp (`experts_tp`)."""

    tp: int
    pp: int
    dp: int
    sp: bool
    microbatches: int
    virtual: int
    recompute: str
    zero: int
    ep: int = 1  # expert-parallel ranks of a stage (a GPT with MoE layers; the dense layers' batch: dp x ep)
    # layers per chunk in pipeline order (spmdsim.models.gpt.stages.chunk_parts; `spmdsim estimate --stage-layers`);
    # None, as the search makes every configuration: balanced
    split: Optional[tuple] = None
    cp: int = 1
    cp_method: str = "ring"
    etp: int = 0  # the experts' tp: 0, attention's tp; below tp (MoE layers), the rest of tp folded into their ep

    @property
    def experts_ep(self) -> int:
        """The experts' expert-parallel size: the mesh's ep, folded (etp below tp) ep x tp / etp (`spmdsim
        estimate --ep`)."""
        return self.ep * (self.tp // self.etp) if self.etp else self.ep

    @property
    def experts_tp(self) -> int:
        """The experts' tensor-parallel size: attention's tp, or folded their etp."""
        return self.etp or self.tp

    @property
    def schedule(self) -> str:
        return "interleaved" if self.virtual > 1 else "1f1b"

    def short(self) -> str:
        return (f"tp {self.tp}{' sp' if self.sp else ''}, pp {self.pp}" + (f" v {self.virtual}" if self.virtual > 1
                else "") + f", dp {self.dp}"
                + (f", ep {self.experts_ep}" if self.experts_ep > 1 else "") + (f", etp {self.etp}" if self.etp else "")
                + (f", cp {self.cp} {self.cp_method}" if self.cp > 1 else "")
                + f", {self.microbatches} mb, {self.recompute}, ZeRO {self.zero}")


def vocab_note(cfg: Any, devices: int, gpus_per_node: int) -> str:
    """A line naming the tensor-parallel sizes the vocabulary alone leaves out (each divides the devices and the
    heads within a node, not the embedding's rows), with the padding that lets them in; "" when none is."""
    lost = [tp for tp in _tensor_parallel(cfg, devices, gpus_per_node) if cfg.padded_vocab % tp]
    if not lost:
        return ""
    pad = 128 * math.lcm(*lost)  # Megatron pads to a multiple of 128 x tp: one for every tp left out
    return (f"tp {', '.join(map(str, lost))} left out: they do not divide vocab {cfg.vocab_words} (the embedding is "
            f"split over tp); pad it, e.g. vocab_pad_to={pad} (Megatron pads to 128 x tp)")


def fold_note(cfg: Any, configs: Any) -> str:
    """A line saying the experts folded into ep were left out of a search of `configs` (SearchResult.folded False),
    whole (etp 1) or in part (an etp between 1 and tp), naming each etp one of them could take
    (spmdsim.tools.estimate.search: the closed forms alone do not search them); "" where none could."""
    if cfg.moe is None:
        return ""
    etps = sorted({e for c in configs for e in _etps(cfg, c.tp, c.ep, between=True)} - {0})
    if etps == [1]:
        return "not searched: the experts folded into ep (etp 1); --moe-cells or --fix etp=1 adds them"
    if not etps:
        return ""
    return (f"not searched: the experts folded into ep, whole or in part (etp {', '.join(map(str, etps))}); "
            "--moe-cells or --fix etp=N adds them")


def context_note(cfg: Any, configs: Any, devices: int, gpus_per_node: int) -> str:
    """A line saying context parallelism was left out of a search of `configs` beside MoE layers
    (SearchResult.contexts False) where the model could split its sequences over cp beside one of their tp sizes
    (spmdsim.tools.estimate.search); "" where it could not."""
    if cfg.moe is None or not any(len(_contexts(cfg, devices // tp, tp, gpus_per_node)) > 1
                                  for tp in {c.tp for c in configs}):
        return ""
    return "context parallelism beside the experts not searched: --moe-cells or --fix cp=N adds it"


def _divisors(n: int) -> list[int]:
    """n's divisors in order, by trial up to sqrt(n) (up to n: minutes for n = 10**12)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def _tensor_parallel(cfg: Any, devices: int, gpus_per_node: int) -> list[int]:
    """The tp sizes that divide the devices and the heads within a node (the vocabulary aside); the key/value
    heads and the MLP's hidden width too, where Llama's options (GPTConfig kv_heads, ffn) make them differ."""
    return [tp for tp in _divisors(devices) if tp <= gpus_per_node and not cfg.heads % tp and not cfg.kv % tp
            and not cfg.hidden % tp]


#: The attention method a search prices context parallelism with unless `--fix cp-method=M` names another: the
#: ring, Megatron-LM's and PyTorch's default (each method's layer cells are dry runs of their own).
SEARCHED_METHODS = ("ring",)


def configurations(cfg: Any, devices: int, gpus_per_node: int, cp: Optional[int] = None,
                   methods: tuple = METHODS, folded: bool = True, sharded: bool = False,
                   etps: tuple = (), between: bool = False, even: bool = True) -> list[Config]:
    """Every configuration of the module docstring for `cfg` (a GPTConfig, batch = the global batch); `cp`:
    those of that context-parallel size alone, within a node or across nodes (`--fix cp=N`); `methods`: the
    context-parallel attention methods tried (SEARCHED_METHODS in a search); `folded`: with the experts folded
    into their ep too (etp 1), beside split over tp, and at each experts' tp of `etps` (`--fix etp=N`) that
    divides a tp above it; `between`: at every experts' tp that divides tp between 1 and tp too (the layer
    cells' search, `--moe-cells`); `sharded`: with MoE layers, ZeRO-3 too (FSDP: the experts sharded over dp,
    the rest over dp x ep; a dense GPT's ZeRO-3 always); `even`: only meshes whose groups of each axis fall alike
    on the nodes (transfers.uneven_on_nodes: the dry run prices one rank of a stage for all)."""
    out: list[Config] = []
    for tp in _tensor_parallel(cfg, devices, gpus_per_node):
        if cfg.padded_vocab % tp:
            continue
        contexts = _contexts(cfg, devices // tp, tp, devices if cp else gpus_per_node, methods)
        for size, method in (c for c in contexts if cp is None or c[0] == cp):
            ranks = devices // (tp * size)
            for pp, ep in itertools.product(_divisors(ranks), _eps(cfg, ranks)):
                if ranks % (pp * ep):
                    continue
                dp = ranks // (pp * ep)
                data = dp * ep  # the dense layers' batch is split over dp x ep
                if cfg.layers % pp or cfg.batch % data:
                    continue
                if even and uneven_on_nodes(((TENSOR, tp), (CONTEXT, size), (EXPERT, ep), (DATA, dp)), pp,
                                           gpus_per_node):
                    continue  # (tp 4 on 6-GPU nodes: ranks 4-7's tp group crosses nodes, rank 0's, priced, does not)
                for etp in _etps(cfg, tp, ep, etps, between) if folded else (0,):
                    out += _scheduled(model_of(cfg, etp), Config(tp, pp, dp, False, 1, 1, "none", 0, ep, cp=size,
                                                                 cp_method=method, etp=etp), sharded)
                if len(out) > MAX_CONFIGS:
                    raise SpmdsimError(f"more than {MAX_CONFIGS:,} configurations of the GPT on {devices:,} "
                                       "devices; expected fewer: a smaller global batch or fewer layers")
    return out


def _scheduled(cfg: Any, mesh: Config, sharded: bool = False) -> list[Config]:
    """The configurations on `mesh`'s degrees (tp, cp and its method, pp, dp, ep, etp; `cfg` with the experts'
    etp, `model_of`): every microbatch count, virtual stages, sequence parallelism, recomputation and ZeRO stage
    that runs there (folded with a capacity, a microbatch tp's ranks share; dropless, a sequence:
    spmdsim.models.gpt.layouts.mesh_problem)."""
    tp, pp, dp, ep, cp = mesh.tp, mesh.pp, mesh.dp, mesh.ep, mesh.cp
    data = dp * ep
    out = []
    virtuals = [1] + ([v for v in _divisors(cfg.layers // pp) if v > 1] if pp > 1 else [])
    for m, v in itertools.product(_divisors(cfg.batch // data), virtuals):
        if (v > 1 and m % pp) or pp * m * v > MAX_PAIRS:  # more pairs than a schedule runs
            continue
        for sp, recompute, zero in itertools.product((False, True), RECOMPUTE, ZERO):
            if (sp and (tp == 1 or cfg.seq % tp)) or (zero in (1, 2) and data * cp == 1):
                continue
            if zero == 3 and (cfg.moe is not None and not sharded or data * cp == 1):
                continue
            if (sp or cfg.moe is not None) and cp > 1 and \
                    context_problem(cfg, cp, tp, sp, Context(mesh.cp_method)) is not None:
                continue  # (sp's and the folded experts' share of a cp chunk: tp must divide it)
            if pipeline_layout_problem(cfg, pp, dp, tp, sp, m, v, ep=ep) is not None:
                continue
            out.append(replace(mesh, sp=sp, microbatches=m, virtual=v, recompute=recompute, zero=zero))
    return out


def _contexts(cfg: Any, ranks: int, tp: int, within: int, methods: tuple = METHODS) -> list[tuple[int, str]]:
    """(cp, method) pairs to try on `ranks` ranks beside tp: cp 1, and every divisor of `ranks` up to tp x cp =
    `within` (a node: the ring's messages, the gathers and the all-to-alls on its links) the sequence splits
    over (the balanced causal split: seq a multiple of 2 cp) with each method its heads take (the all-to-all's
    divide by tp x cp); with MoE layers each rank routes its chunks (with a capacity, each chunk its own)."""
    out = [(1, "ring")]
    for cp in _divisors(ranks)[1:]:
        if tp * cp > within:
            break
        out += [(cp, m) for m in methods if context_problem(cfg, cp, tp, False, Context(m)) is None]
    return out


#: The degrees `--fix NAME=VALUE` holds (the names of the search's table) and the Config field of each; ep and etp
#: are the experts' (`Config.experts_ep`; etp N, their tp N: 1, tp 1 or folded whole, or the word tp, split over
#: attention's tp).
FIXABLE = {TENSOR: TENSOR, PIPELINE: PIPELINE, "v": "virtual", DATA: DATA, EXPERT: EXPERT, "etp": "etp", CONTEXT: "cp",
           "cp-method": "cp_method", "mb": "microbatches", "recompute": "recompute", "zero": "zero", "sp": "sp"}
#: The words `--fix` takes for the degrees that are not integers >= 1.
WORDS = {"recompute": RECOMPUTE, "cp-method": METHODS}


def parse_fixed(items: Any) -> dict[str, Any]:
    """{Config field: value} of `--fix NAME=VALUE` items (NAME among FIXABLE), each checked; one line otherwise."""
    names = ", ".join(FIXABLE)
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        name, sep, text = str(item).partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text:
            raise SpmdsimError(f"--fix {item!r} must read DEGREE=VALUE with --machine, e.g. 'tp=8' (DEGREE one of "
                               f"{names})")
        if "=" in text:  # --gpt's comma-separated spelling: "--fix tp=2,pp=2"
            each = " ".join(f"--fix {part.strip()}" for part in f"{name}={text}".split(","))
            raise SpmdsimError(f"--fix {item!r} holds one degree a --fix; expected {each}")
        if name not in FIXABLE:
            raise SpmdsimError(f"--fix {name}={text} holds an operator's strategy; with --machine --fix holds a "
                               f"degree of the configuration, one of {names} (e.g. --fix tp=8)")
        if name in WORDS:
            if text not in WORDS[name]:
                raise SpmdsimError(f"--fix {name}={text} must be one of {', '.join(WORDS[name])}")
            value: Any = text
        elif name == "etp":
            if text != TENSOR and not (text.isdigit() and int(text) >= 1):
                raise SpmdsimError(f"--fix etp={text} must be an integer >= 1 (the experts' tp: 1, whole; below tp, "
                                   "the rest of attention's tp folded into their ep) or tp (the experts split over "
                                   "attention's tp)")
            value = TENSOR if text == TENSOR else int(text)
        elif name in ("zero", "sp"):
            can = tuple(map(str, ZERO)) if name == "zero" else ("0", "1")  # sp off or on
            if text not in can:
                raise SpmdsimError(f"--fix {name}={text} must be {', '.join(can[:-1])} or {can[-1]}")
            value = bool(int(text)) if name == "sp" else int(text)
        else:
            try:
                value = int(text)
            except ValueError:
                value = 0
            if value < 1 or str(value) != text.lstrip("+"):
                raise SpmdsimError(f"--fix {name}={text} must be an integer >= 1")
        field_ = FIXABLE[name]
        if field_ in out and out[field_] != value:
            raise SpmdsimError(f"--fix {name}={given[field_]} and --fix {name}={text} hold {name} two ways; give one")
        out[field_], given[field_] = value, text
    return out


def _shown(field_: str, value: Any) -> str:
    """A fixed value as `--fix` spells it (sp 1, not True)."""
    name = next(n for n, f in FIXABLE.items() if f == field_)
    return f"{name}={int(value) if isinstance(value, bool) else value}"


def _degree(c: Config, field_: str) -> Any:
    """`c`'s degree `field_` (a FIXABLE value other than etp) as --fix names it: ep the experts' ep."""
    return c.experts_ep if field_ == EXPERT else getattr(c, field_)


def _holds(c: Config, field_: str, value: Any) -> bool:
    """Whether `c` has degree `field_` (a FIXABLE value) at `value` (`_degree`); etp N the experts' tp N (1: whole,
    tp 1 or folded), etp "tp" the experts split over attention's tp (tp 1 too)."""
    if field_ == "etp":
        return c.etp == 0 if value == TENSOR else c.experts_tp == value
    return _degree(c, field_) == value


def fixed_configurations(configs: list[Config], fixed: Any, devices: int) -> list[Config]:
    """The configurations among `configs` with every degree of `fixed` ({Config field: value}, parse_fixed;
    `_holds`); one line naming the first degree that leaves none and the values it can take (with the degrees
    before it)."""
    done: list[str] = []
    for field_, value in (fixed or {}).items():
        if field_ not in FIXABLE.values():
            raise SpmdsimError(f"fixed degree {field_!r} is unknown; expected one of {tuple(FIXABLE.values())!r}")
        left = [c for c in configs if _holds(c, field_, value)]
        if not left:
            name = _shown(field_, value).split("=")[0]
            words = RECOMPUTE + METHODS + (TENSOR,)
            values = {1, TENSOR} | {c.etp for c in configs if c.etp} if field_ == "etp" else \
                {_degree(c, field_) for c in configs}  # (etp: an unfolded one's tp is "tp")
            can = sorted((v for v in values if any(_holds(c, field_, v) for c in configs)),
                         key=lambda v: (isinstance(v, str), words.index(v) if isinstance(v, str) else int(v)))
            values = ", ".join(_shown(field_, v).split("=")[1] for v in can)
            beside = f" with --fix {', '.join(done)}" if done else ""
            raise SpmdsimError(f"--fix {_shown(field_, value)} leaves no configuration of the GPT on {devices:,} "
                               f"devices{beside}; {name} can be {values}")
        configs = left
        done.append(_shown(field_, value))
    return configs


def _etps(cfg: Any, tp: int, ep: int, etps: tuple = (), between: bool = False) -> tuple[int, ...]:
    """The experts' tp to try on a mesh of `tp` x `ep`: 0 (attention's), and with MoE layers and tp above 1 also
    1 (folded: spmdsim.models.moe.fold) and each of `etps` below tp that divides it (`between`: every divisor of
    tp between 1 and tp), where the experts' ep (ep x tp / etp) divides the experts."""
    if cfg.moe is None or tp == 1:
        return (0,)
    tried = (1,) + tuple(etps) + (tuple(_divisors(tp)[1:-1]) if between else ())
    return (0,) + tuple(e for e in sorted(set(tried)) if e < tp and not fold_problem(tp, e)
                        and cfg.moe.experts % (ep * tp // e) == 0)


@functools.lru_cache(maxsize=64)
def model_of(cfg: Any, etp: int) -> Any:
    """`cfg` with its MoE layers' experts at `etp` (MoEConfig.etp; the Config's): what the configuration's dry
    run trains. A search tries each etp whatever `cfg.moe.etp` says; a dense `cfg` is itself."""
    if cfg.moe is None or cfg.moe.etp == etp:
        return cfg
    return replace(cfg, moe=replace(cfg.moe, etp=etp))


def _eps(cfg: Any, ranks: int) -> list[int]:
    """The expert-parallel sizes to try: the divisors of `ranks` that divide the experts (1 without MoE)."""
    if cfg.moe is None:
        return [1]
    return [e for e in _divisors(ranks) if cfg.moe.experts % e == 0]
