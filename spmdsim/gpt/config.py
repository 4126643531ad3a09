"""The GPT's hyperparameters: one frozen, validated value shared by the reference and the ranks."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Optional

from ..errors import SpmdsimError
from ..moe.config import MoEConfig
from ..validate import as_int

__all__ = ["GPTConfig"]

_SIZES = ("vocab", "d_model", "heads", "layers", "seq", "batch", "vocab_pad_to")


@dataclass(frozen=True)
class GPTConfig:
    """A decoder-only GPT (pre-LN blocks, tied head) and its AdamW training: ``GPTConfig(layers=2)``.

    The defaults are the model of examples/train_gpt.py: 4 layers, d_model 128, 4 heads,
    sequence 64, batch 8, character vocabulary 128.

    ``vocab_pad_to`` m > 1 pads the vocabulary to a multiple of m (`padded_vocab`), as Megatron-LM's
    --make-vocab-size-divisible-by does (it pads to 128 x tp), so tp can split a vocabulary that it does
    not divide: the token embedding (and the head tied to it) has `padded_vocab` rows, the padded ones
    start at zero and are never looked up, and their logits are masked out of the softmax (-inf, forward
    and backward), so the loss and every gradient are the unpadded model's (docs/training.md,
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
    moe: Optional[MoEConfig] = None  # mixture-of-experts MLPs in every moe.every-th block (docs/experts.md)
    vocab_pad_to: int = 1  # the embedding's rows: vocab rounded up to a multiple of this (1: not padded)

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            n = as_int(value)
            if n is None or n < 1:
                raise SpmdsimError(f"GPTConfig {name} {value!r} must be an integer >= 1")
            object.__setattr__(self, name, n)
        if self.d_model % self.heads:
            raise SpmdsimError(f"GPTConfig d_model {self.d_model!r} must be divisible by heads "
                               f"{self.heads!r} (each head takes d_model / heads features)")
        seed = as_int(self.seed)
        if seed is None or seed < 0:
            raise SpmdsimError(f"GPTConfig seed {self.seed!r} must be an integer >= 0")
        object.__setattr__(self, "seed", seed)
        _real(self, "dropout", 0.0, 1.0, "in [0, 1)", high_open=True)
        _real(self, "weight_decay", 0.0, math.inf, ">= 0")
        _real(self, "clip", 0.0, math.inf, ">= 0 (0: no clipping)")
        _real(self, "lr", 0.0, math.inf, ">= 0")  # as torch.optim and spmdsim.optim allow: 0 updates nothing
        for name in ("eps", "ln_eps", "init_std"):
            _real(self, name, 0.0, math.inf, "> 0", low_open=True)
        betas = self.betas
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise SpmdsimError(f"GPTConfig betas {betas!r} must be a pair (beta1, beta2) in [0, 1)")
        if not all(_is_real(b) and 0 <= b < 1 for b in betas):
            raise SpmdsimError(f"GPTConfig betas {betas!r} must be a pair (beta1, beta2) in [0, 1)")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise SpmdsimError(f"GPTConfig moe {self.moe!r} must be None or a spmdsim.moe.MoEConfig")
        if self.moe is not None and self.moe.every > self.layers:  # a dense GPT that would say it has experts
            raise SpmdsimError(f"GPTConfig moe every {self.moe.every} makes none of the {self.layers} layers an MoE "
                               f"layer (the first would be block {self.moe.every - 1}, counted from 0); expected every at most layers "
                               f"{self.layers}, or moe=None for a dense GPT")

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
        raise SpmdsimError(f"GPTConfig {name} {value!r} must be a finite number {expected}")
    object.__setattr__(cfg, name, float(value))
