"""The GPT's parameters (names, shapes, seeded initial values) and its dropout masks' seeds.

Every initial weight and every dropout mask is a `SeededTensor`: the reference takes
``.full()``, a rank ``.region(its slices)``, and both see the same numbers.

Dropout sites and the global shape of the tensor each one masks (the mask's element
order is the tensor's, so a rank's block of it is ``.region`` of these shapes):

    "emb"          (B, T, D)      wte[x] + wpe
    "h{l}.attn"    (B, H, T, T)   the attention probabilities, "bhqk"
    "h{l}.resid1"  (B, T, D)      o @ wo + bo
    "h{l}.resid2"  (B, T, D)      m @ w2 + b2 (or the MoE layer's output)

A block with an MoE layer (``cfg.is_moe(l)``, spmdsim.models.moe) has, in place of
mlp.w1 .. mlp.b2: moe.router (D, E), moe.w1 (E, D, F), moe.b1 (E, F), moe.w2
(E, F, D), moe.b2 (E, D), with F the experts' hidden width; the experts follow
the MLP's options as the dense MLP does: mlp "swiglu" adds moe.w3 (E, D, F)
(and moe.b3 (E, F)) after b1, bias False drops b1, b3 and b2 (Mixtral's
experts: SwiGLU, no biases).

With vocabulary padding (GPTConfig.vocab_pad_to) wte has cfg.padded_vocab rows: the first cfg.vocab
are the unpadded model's (the same seeded numbers: an element's value depends on its flat index
only), the rest start at zero (`initial_value`, spmdsim.models.gpt.parallel.GPT). `unpadded_params` and
`padded_params` convert between the two models' parameter dicts.
"""
from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...layouts.datagen import SeededTensor
from ...errors import SpmdsimError
from ...base.validate import as_int
from .config import GPTConfig

__all__ = ["ParamSpec", "INITS", "param_specs", "seeded", "constant", "decays", "is_expert", "initial_value",
           "dropout_seed", "dropout_tensor", "dropout_shape", "dropout_sites", "unpadded_params",
           "padded_params"]

#: How a parameter starts: "seeded" (uniform weights of std init_std), "zeros" or "ones".
INITS = ("seeded", "zeros", "ones")


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its name ("h0.attn.wq"), global shape and how it starts (one of INITS)."""

    name: str
    shape: tuple[int, ...]
    init: str

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise SpmdsimError(f"parameter {self.name!r} init {self.init!r} must be one of {INITS!r}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))


@functools.lru_cache(maxsize=16)  # a dry run's representatives ask for a 128-layer model's list many times
def param_specs(cfg: GPTConfig) -> tuple[ParamSpec, ...]:
    """Every parameter in the optimizer's order: wte, wpe, the blocks h0..h{L-1}, lnf (and head.w untied).

    Llama's options (spmdsim.models.gpt.GPTConfig) change the list: positions "rope" has no wpe; norm "rms" no
    layer norm biases (ln1.b, ln2.b, lnf.b); kv_heads makes wk and wv (D, kv_heads x head_dim); mlp
    "swiglu" adds mlp.w3 (D, F) (and mlp.b3) beside w1; bias False drops attn.bq, bv, bo and the MLP's
    biases; tied False adds head.w (padded_vocab, D) last."""
    V, D, T, F = cfg.padded_vocab, cfg.d_model, cfg.seq, cfg.hidden
    KD = cfg.kv * cfg.head_dim
    rms, bias = cfg.norm == "rms", cfg.bias
    out = [ParamSpec("wte", (V, D), "seeded")]
    if cfg.positions == "learned":
        out.append(ParamSpec("wpe", (T, D), "seeded"))

    def norm(name: str) -> list:
        return [ParamSpec(f"{name}.w", (D,), "ones")] + ([] if rms else [ParamSpec(f"{name}.b", (D,), "zeros")])

    for layer in range(cfg.layers):
        h = f"h{layer}"
        out += norm(f"{h}.ln1")
        for w in ("q", "k", "v", "o"):
            out.append(ParamSpec(f"{h}.attn.w{w}", (D, KD) if w in "kv" else (D, D), "seeded"))
            if w != "k" and bias:  # no key bias: softmax ignores it, its gradient is zero but for rounding,
                out.append(ParamSpec(f"{h}.attn.b{w}", (KD,) if w == "v" else (D,), "zeros"))  # which Adam would
        out += norm(f"{h}.ln2")  # blow up to +-lr steps
        if cfg.is_moe(layer):  # the experts follow mlp and bias as the dense MLP does, each (E, ...) stacked
            E, FE = cfg.moe.experts, cfg.expert_hidden
            out.append(ParamSpec(f"{h}.moe.router", (D, E), "seeded"))
            out.append(ParamSpec(f"{h}.moe.w1", (E, D, FE), "seeded"))
            out += [ParamSpec(f"{h}.moe.b1", (E, FE), "zeros")] if bias else []
            if cfg.mlp == "swiglu":
                out.append(ParamSpec(f"{h}.moe.w3", (E, D, FE), "seeded"))
                out += [ParamSpec(f"{h}.moe.b3", (E, FE), "zeros")] if bias else []
            out.append(ParamSpec(f"{h}.moe.w2", (E, FE, D), "seeded"))
            out += [ParamSpec(f"{h}.moe.b2", (E, D), "zeros")] if bias else []
            continue
        out.append(ParamSpec(f"{h}.mlp.w1", (D, F), "seeded"))
        out += [ParamSpec(f"{h}.mlp.b1", (F,), "zeros")] if bias else []
        if cfg.mlp == "swiglu":
            out.append(ParamSpec(f"{h}.mlp.w3", (D, F), "seeded"))
            out += [ParamSpec(f"{h}.mlp.b3", (F,), "zeros")] if bias else []
        out.append(ParamSpec(f"{h}.mlp.w2", (F, D), "seeded"))
        out += [ParamSpec(f"{h}.mlp.b2", (D,), "zeros")] if bias else []
    out += norm("lnf")
    if not cfg.tied:
        out.append(ParamSpec("head.w", (V, D), "seeded"))
    return tuple(out)


def seeded(cfg: GPTConfig, spec: ParamSpec) -> Optional[SeededTensor]:
    """The seeded global tensor a weight starts from; None for "zeros" and "ones" parameters.

    Uniform in [-a, a) with a = sqrt(3) * init_std (std init_std); the residual outputs
    (attn.wo, mlp.w2) use a / sqrt(2 * layers), GPT-2's scaling.
    """
    if spec.init != "seeded":
        return None
    a = math.sqrt(3.0) * cfg.init_std
    if spec.name.endswith((".attn.wo", ".mlp.w2", ".moe.w2")):
        a /= math.sqrt(2.0 * cfg.layers)
    seed = zlib.crc32(f"{cfg.seed}:{spec.name}".encode())
    return SeededTensor(spec.shape, "float64", seed=seed, low=-a, high=a)


def constant(spec: ParamSpec) -> float:
    """The value every element of a "zeros" or "ones" parameter starts at."""
    if spec.init == "seeded":
        raise SpmdsimError(f"parameter {spec.name!r} is seeded, not constant; use seeded(cfg, spec)")
    return 0.0 if spec.init == "zeros" else 1.0


def decays(spec: ParamSpec) -> bool:
    """Whether AdamW's weight decay applies: to the weights of 2 or more dims, never to biases (the experts'
    (E, F) and (E, D) ones included) or norms."""
    return len(spec.shape) >= 2 and not spec.name.rsplit(".", 1)[-1].startswith("b")


def is_expert(name: str) -> bool:
    """Whether parameter `name` is an MoE layer's experts' ("h1.moe.w1" .. "h1.moe.b2", w3 and b3), not its
    router's."""
    return name.split(".")[1:2] == ["moe"] and not name.endswith(".router")


def initial_value(cfg: GPTConfig, spec: ParamSpec) -> np.ndarray:
    """The whole initial parameter as a new float64 array (references and small runs)."""
    source = seeded(cfg, spec)
    if source is None:
        return np.full(spec.shape, constant(spec), dtype=np.float64)
    out = np.array(source.full(), dtype=np.float64)
    if spec.name in ("wte", "head.w"):
        out[cfg.vocab:] = 0.0  # the padded rows (GPTConfig.vocab_pad_to)
    return out


def unpadded_params(arrays: dict, cfg: GPTConfig) -> dict:
    """`arrays` (parameter name -> whole array of the padded model `cfg`) with wte's padded rows dropped
    (a view): the unpadded model's (cfg.unpadded()); the same dict when cfg pads nothing."""
    if cfg.padded_vocab == cfg.vocab or not ("wte" in arrays or "head.w" in arrays):
        return arrays
    return {**arrays, **{k: arrays[k][:cfg.vocab] for k in ("wte", "head.w") if k in arrays}}


def padded_params(arrays: dict, cfg: GPTConfig, rows: Optional[np.ndarray] = None) -> dict:
    """`arrays` of the unpadded model with wte's padded rows appended: `rows` ((padded_vocab - vocab, D)),
    default zeros (a gradient's); the same dict when cfg pads nothing."""
    extra = cfg.padded_vocab - cfg.vocab
    if not extra or not ("wte" in arrays or "head.w" in arrays):
        return arrays
    out = dict(arrays)
    for name in ("wte", "head.w"):
        if name in arrays:
            table = arrays[name]
            tail = np.zeros((extra,) + table.shape[1:], table.dtype) if rows is None or name != "wte" else rows
            out[name] = np.concatenate([table, np.asarray(tail, table.dtype)])
    return out


def dropout_sites(cfg: GPTConfig) -> tuple[str, ...]:
    """Every dropout site in forward order."""
    return _sites(cfg.layers)


@functools.lru_cache(maxsize=64)
def _sites(layers: int) -> tuple[str, ...]:
    """dropout_sites of a model of `layers` blocks (each mask's seed checks its site: 13 a step at 4 layers)."""
    return ("emb",) + tuple(f"h{layer}.{part}" for layer in range(layers) for part in ("attn", "resid1", "resid2"))


def dropout_shape(cfg: GPTConfig, site: str, batch: Optional[int] = None) -> tuple[int, ...]:
    """The global shape a site's mask covers (batch defaults to cfg.batch)."""
    b = cfg.batch if batch is None else batch
    _check_site(cfg, site)
    if site.endswith(".attn"):
        return (b, cfg.heads, cfg.seq, cfg.seq)
    return (b, cfg.seq, cfg.d_model)


def dropout_seed(cfg: GPTConfig, step: int, site: str, micro: Optional[int] = None) -> int:
    """The seed of the mask at `site` in training step `step` (0-based); `micro`: the microbatch of a
    step that accumulates gradients over several (None: the step's whole batch at once)."""
    n = step if type(step) is int else as_int(step)
    if n is None or n < 0:
        raise SpmdsimError(f"step {step!r} must be an integer >= 0")
    if site not in _sites(cfg.layers):  # _check_site's test, without its two calls (13 masks a step)
        _check_site(cfg, site)
    if micro is None:
        return zlib.crc32(f"{cfg.seed}:dropout:{n}:{site}".encode())
    i = as_int(micro)
    if i is None or i < 0:
        raise SpmdsimError(f"microbatch {micro!r} must be an integer >= 0")
    return zlib.crc32(f"{cfg.seed}:dropout:{n}:{site}:micro{i}".encode())


def dropout_tensor(cfg: GPTConfig, step: int, site: str, batch: Optional[int] = None,
                   micro: Optional[int] = None) -> SeededTensor:
    """The uniform [0, 1) numbers behind a site's mask: keep where value >= cfg.dropout."""
    return SeededTensor(dropout_shape(cfg, site, batch), "float64", seed=dropout_seed(cfg, step, site, micro),
                        low=0.0, high=1.0)


def _check_site(cfg: GPTConfig, site: str) -> None:
    if site not in dropout_sites(cfg):
        raise SpmdsimError(f"dropout site {site!r} is not one of this model's: 'emb', "
                           f"'h{{l}}.attn', 'h{{l}}.resid1', 'h{{l}}.resid2' for l < {cfg.layers}")
