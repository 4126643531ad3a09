"""The GPT's hyperparameters: one frozen, validated value shared by the reference and the ranks."""
from __future__ import annotations

import math
import numbers
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Mapping, Optional

from ...base.typed_numbers import shown
from ...errors import SpmdsimError
from ..moe.config import MoEConfig
from ...base.validate import as_int

__all__ = ["GPTConfig", "CHOICES", "ROPE_BASE", "said_as"]

_SIZES = ("vocab", "d_model", "heads", "layers", "seq", "batch", "vocab_pad_to")
#: The architecture's named choices: field -> the values it takes (the first is the default).
CHOICES = {"norm": ("layer", "rms"), "mlp": ("gelu", "swiglu"), "positions": ("learned", "rope"),
           "attention": ("unfused", "flash")}
#: Rotary embeddings' base (Llama-2's theta): frequency i of a head is base ** (-2i / head_dim).
ROPE_BASE = 10000.0

#: How a refusal names each field: ({field: the flag the user typed}, {fields left at their default}) while
#: `said_as` holds (empty: "GPTConfig field"). A context variable: each simulated rank's thread has its own.
_SAID: ContextVar[tuple[Mapping[str, str], frozenset]] = ContextVar("spmdsim_gptconfig_said",
                                                                    default=({}, frozenset()))


@contextmanager
def said_as(flags: Mapping[str, str], defaults: Iterable[str] = ()) -> Iterator[None]:
    """Within it, a GPTConfig's refusal names a field by the flag that gave it (`flags`: field -> flag, e.g.
    ``{"d_model": "--hidden"}``): "--hidden 100 must be divisible by --heads 3", not "GPTConfig d_model 100
    must be divisible by heads 3", a name the user never typed. ``"positions": "--rope"`` names the rotary
    embeddings' flag. `defaults`: fields the user left at their default (no flag gives them, as ``spmdsim
    autoshard --gpt``'s keys not typed): said as such beside their value, "the default d_model 128 must be
    divisible by --gpt heads 3", not as if typed. Other fields keep "GPTConfig field"."""
    token = _SAID.set((flags, frozenset(defaults)))
    try:
        yield
    finally:
        _SAID.reset(token)


def _subject(name: str) -> str:
    """A refusal's subject for field `name` (its value follows): its flag under `said_as`, "the default name"
    when left at its default, else "GPTConfig name"."""
    flags, defaults = _SAID.get()
    return flags.get(name) or (f"the default {name}" if name in defaults else f"GPTConfig {name}")


def _valued(name: str) -> str:
    """Field `name` as a refusal's later words say it before its value: its flag under `said_as`, "the default
    name" when left at its default, else the field's name."""
    flags, defaults = _SAID.get()
    return flags.get(name) or (f"the default {name}" if name in defaults else name)


def _word(name: str) -> str:
    """Field `name` as a refusal's later words say it without a value: its flag under `said_as`, else the
    field's name."""
    return _SAID.get()[0].get(name) or name


@dataclass(frozen=True)
class GPTConfig:
    """A decoder-only GPT (pre-LN blocks, tied head) and its AdamW training: ``GPTConfig(layers=2)``.

    Llama's architecture is options of the same model (each default is the GPT's): `ffn` the MLP's hidden
    width, ``norm="rms"`` RMSNorm, ``mlp="swiglu"`` the SwiGLU MLP, `kv_heads` grouped-query attention
    (each key/value head serves heads / kv_heads query heads, Megatron's num_query_groups),
    ``tied=False`` an LM head of its own, ``positions="rope"`` rotary embeddings (base ROPE_BASE, 10000) and
    ``bias=False`` linear layers without biases (docs/howto/train-gpt.md, "Llama's options"); ``attention="flash"`` runs
    the attention core as FlashAttention-2 (the same values up to rounding; no scores kept:
    docs/howto/memory.md, "Memory").

    The defaults are the model of examples/train_gpt.py: 4 layers, d_model 128, 4 heads,
    sequence 64, batch 8, character vocabulary 128.

    ``vocab_pad_to`` m > 1 pads the vocabulary to a multiple of m (`padded_vocab`), as Megatron-LM's
    --make-vocab-size-divisible-by does (it pads to 128 x tp), so tp can split a vocabulary that it does
    not divide: the token embedding (and the head tied to it) has `padded_vocab` rows, the padded ones
    start at zero and are never looked up, and their logits are masked out of the softmax (-inf, forward
    and backward), so the loss and every gradient are the unpadded model's (docs/howto/train.md,
    "An odd vocabulary"). The single-process reference is always the unpadded model (`unpadded`).
    """

    vocab: int = 128
    d_model: int = 128
    heads: int = 4
    layers: int = 4
    seq: int = 64
    batch: int = 8
    dropout: float = 0.1
    seed: int = 0
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    weight_decay: float = 0.1
    ln_eps: float = 1e-5
    init_std: float = 0.02
    clip: float = 0.0  # the gradients' joint norm is clipped to this before each update (0: not clipped)
    moe: Optional[MoEConfig] = None  # mixture-of-experts MLPs in every moe.every-th block (docs/howto/experts.md)
    vocab_pad_to: int = 1  # the embedding's rows: vocab rounded up to a multiple of this (1: not padded)
    ffn: Optional[int] = None  # the MLP's hidden width (None: 4 * d_model); `hidden` says it
    norm: str = "layer"  # "layer" (LayerNorm, weight and bias) or "rms" (RMSNorm, a weight only)
    mlp: str = "gelu"  # "gelu" (GELU(x W1 + b1) W2 + b2) or "swiglu" (silu(x W1 + b1) * (x W3 + b3) W2 + b2)
    kv_heads: Optional[int] = None  # grouped-query attention's key/value heads (None: heads); `kv` says it
    tied: bool = True  # the LM head is the token embedding (False: its own (padded_vocab, d_model) "head.w")
    positions: str = "learned"  # "learned" (wpe, (seq, d_model)) or "rope" (rotary, on q and k; no wpe)
    bias: bool = True  # the linear layers' biases (attention bq, bv, bo; the MLP's); False: none (Llama's)
    # the attention core: "unfused" (scores and probabilities materialized, kept for backward) or "flash"
    # (FlashAttention-2's tiles: q, k, v, the output and the rows' log-sum-exp kept; spmdsim.nn.ops.attention)
    attention: str = "unfused"

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            n = as_int(value)
            if n is None or n < 1:
                raise SpmdsimError(f"{_subject(name)} {value!r} must be an integer >= 1")
            object.__setattr__(self, name, n)
        if self.d_model % self.heads:
            d_model, heads = _word("d_model"), _word("heads")
            raise SpmdsimError(f"{_subject('d_model')} {self.d_model!r} must be divisible by {_valued('heads')} "
                               f"{self.heads!r} (each head takes {d_model} / {heads} features)")
        seed = as_int(self.seed)
        if seed is None or seed < 0:
            raise SpmdsimError(f"{_subject('seed')} {self.seed!r} must be an integer >= 0")
        object.__setattr__(self, "seed", seed)
        _real(self, "dropout", 0.0, 1.0, "in [0, 1)", high_open=True)
        _real(self, "weight_decay", 0.0, math.inf, ">= 0")
        _real(self, "clip", 0.0, math.inf, ">= 0 (0: no clipping)")
        _real(self, "lr", 0.0, math.inf, ">= 0")  # as torch.optim and spmdsim.nn.optim allow: 0 updates nothing
        for name in ("eps", "ln_eps", "init_std"):
            _real(self, name, 0.0, math.inf, "> 0", low_open=True)
        betas = self.betas
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise SpmdsimError(f"GPTConfig betas {betas!r} must be a pair (beta1, beta2) in [0, 1)")
        if not all(_is_real(b) and 0 <= b < 1 for b in betas):
            raise SpmdsimError(f"GPTConfig betas {betas!r} must be a pair (beta1, beta2) in [0, 1)")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        for name in ("ffn", "kv_heads"):
            value = getattr(self, name)
            if value is not None:
                n = as_int(value)
                if n is None or n < 1:
                    raise SpmdsimError(f"{_subject(name)} {value!r} must be an integer >= 1 (or None: "
                                       f"{'4 * ' + _word('d_model') if name == 'ffn' else _word('heads')})")
                object.__setattr__(self, name, n)
        for name, values in CHOICES.items():
            if getattr(self, name) not in values:
                raise SpmdsimError(f"GPTConfig {name} {getattr(self, name)!r} must be one of "
                                   f"{', '.join(map(repr, values))}")
        for name in ("tied", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise SpmdsimError(f"GPTConfig {name} {getattr(self, name)!r} must be True or False")
        if self.heads % self.kv:
            kv, heads = _word("kv_heads"), _word("heads")
            raise SpmdsimError(f"{_subject('kv_heads')} {self.kv_heads!r} must divide {_valued('heads')} "
                               f"{self.heads!r} (each key/value head serves {heads} / {kv} query heads)")
        if self.positions == "rope" and self.head_dim % 2:
            rope = _SAID.get()[0].get("positions") or "GPTConfig positions 'rope'"
            raise SpmdsimError(f"{rope} needs an even head_dim, got {_valued('d_model')} {self.d_model} / "
                               f"{_valued('heads')} {self.heads} = {self.head_dim} (rotary embeddings turn pairs of "
                               "features)")
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise SpmdsimError(f"GPTConfig moe {self.moe!r} must be None or a spmdsim.models.moe.MoEConfig")
        if self.moe is not None and self.moe.every > self.layers:  # a dense GPT that would say it has experts
            none = "no MoE layer of the only layer" if self.layers == 1 else \
                f"none of the {self.layers} layers an MoE layer"
            raise SpmdsimError(f"GPTConfig moe every {self.moe.every} makes {none} (the first would be block "
                               f"{self.moe.every - 1}, counted from 0); expected every at most layers {self.layers}, "
                               "or moe=None for a dense GPT")

    def is_moe(self, layer: int) -> bool:
        """Whether block `layer` has a mixture-of-experts layer in place of its MLP."""
        return self.moe is not None and self.moe.is_moe(layer)

    @property
    def padded_vocab(self) -> int:
        """The token embedding's rows: vocab rounded up to a multiple of vocab_pad_to."""
        return -(-self.vocab // self.vocab_pad_to) * self.vocab_pad_to

    @property
    def vocab_words(self) -> str:
        """The vocabulary as a line says it: "50257", or "50257 (padded to 51,200)"."""
        padded = self.padded_vocab
        return f"{self.vocab}" if padded == self.vocab else f"{self.vocab} (padded to {padded:,})"

    def unpadded(self) -> GPTConfig:
        """This model without vocabulary padding (the single-process reference's model)."""
        return self if self.vocab_pad_to == 1 else replace(self, vocab_pad_to=1)

    @property
    def hidden(self) -> int:
        """The MLP's hidden width: ffn, or 4 * d_model."""
        return 4 * self.d_model if self.ffn is None else self.ffn

    @property
    def expert_hidden(self) -> int:
        """The MoE layers' experts' hidden width: moe.hidden when given, else the MLP's (`hidden`: ffn, or 4 *
        d_model), as Megatron's moe_ffn_hidden_size defaults to its ffn_hidden_size."""
        return (self.moe.hidden if self.moe is not None else 0) or self.hidden

    @property
    def expert_tp(self) -> int:
        """The MoE layers' experts' own tp, MoEConfig.etp (0: attention's tp; 0 without MoE layers): between 1
        and tp it splits the mesh's tp in two axes (spmdsim.models.axes.model_layout)."""
        return self.moe.etp if self.moe is not None else 0

    @property
    def kv(self) -> int:
        """The attention's key/value heads: kv_heads, or heads (multi-head attention)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def parameters(self) -> int:
        """The model's parameter count in closed form (spmdsim.models.gpt.params.param_specs lists them): the token
        embedding (padded_vocab x d_model; an untied head as many again), learned positions, per dense layer
        its attention (Q and the projection d_model^2 each, K and V d_model x kv x head_dim) and MLP (2 or,
        SwiGLU, 3 matrices d_model x hidden), the biases and norms' vectors. An MoE layer has, in place of the
        MLP, the router (d_model x experts) and `experts` MLPs of expert_hidden, each with the MLP's matrices and
        biases (SwiGLU's three, Mixtral's experts without biases)."""
        V, D, F, L = self.padded_vocab, self.d_model, self.hidden, self.layers
        KD = self.kv * self.head_dim
        mats = self.mlp_matrices
        norm = D if self.norm == "rms" else 2 * D

        def mlp(width: int) -> int:  # w1 (and w3), w2; b1 (and b3), b2
            return mats * D * width + ((mats - 1) * width + D if self.bias else 0)

        attention = self.attention_weights + 2 * norm + (D + KD + D if self.bias else 0)  # bq, bv, bo
        total = V * D * (1 if self.tied else 2) + (self.seq * D if self.positions == "learned" else 0) + norm
        moe_layers = 0 if self.moe is None else sum(self.is_moe(layer) for layer in range(L))
        experts = 0 if self.moe is None else D * self.moe.experts + self.moe.experts * mlp(self.expert_hidden)
        return total + L * attention + (L - moe_layers) * mlp(F) + moe_layers * experts

    @property
    def attention_weights(self) -> int:
        """The elements of a layer's attention matrices: Q and the projection d_model^2 each, K and V d_model x
        kv x head_dim (`parameters`, the memory check's and the search's bounds count them so)."""
        return 2 * self.d_model * self.d_model + 2 * self.d_model * self.kv * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """The MLP's weight matrices, and each MoE expert's (they follow `mlp`): 2, SwiGLU's 3."""
        return 3 if self.mlp == "swiglu" else 2

    @property
    def head_dim(self) -> int:
        """Features per attention head: d_model // heads."""
        return self.d_model // self.heads


def _is_real(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


def _real(cfg: GPTConfig, name: str, low: float, high: float, expected: str,
          low_open: bool = False, high_open: bool = False) -> None:
    """Check a float field against [low, high] (open ends as asked) and store it as a float."""
    value = getattr(cfg, name)
    ok = _is_real(value) and (value > low if low_open else value >= low) \
        and (value < high if high_open else value <= high)
    if not ok:
        raise SpmdsimError(f"{_subject(name)} {shown(value)} must be a finite number {expected}")  # "--lr -1" as typed
    object.__setattr__(cfg, name, float(value))
