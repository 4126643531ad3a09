"""Llama's architecture (spmdsim.models.gpt.GPTConfig's options ffn, kv_heads, norm, mlp, tied, positions, bias) as
command-line flags, spelled alike wherever a GPT is built from a command line: examples/train_gpt.py and
examples/train_moe_gpt.py (spmdsim.models.gpt.options.model_arguments), ``spmdsim estimate`` and ``spmdsim autoshard
--machine`` (docs/howto/train-gpt.md, "Llama's options"). Pure: argparse only (no numpy: a command's start imports it).

``architecture_arguments(parser)`` adds ``--ffn``, ``--kv-heads``, ``--norm``, ``--mlp``, ``--untied``, ``--rope``,
``--no-bias`` and ``--attention`` (GPTConfig's attention: the core unfused or flash); ``architecture_problem(args)``
why their values cannot be (one line naming the flag);
``architecture_fields(args)`` the GPTConfig fields they say; ``architecture_flags(cfg)`` the flags that say a
GPTConfig's (none for the GPT's own architecture); ``architecture_words(cfg)`` a line's words for them;
``ARCHITECTURE_SAID`` the flags that set GPTConfig's fields, for its refusals (spmdsim.models.gpt.config.said_as);
``MAX_SIZE`` and ``size_problem(flag, value)``: the most any size flag of a command may say (a width, a count of heads,
tokens or experts).
"""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["architecture_arguments", "architecture_problem", "architecture_fields", "architecture_flags",
           "architecture_words", "size_problem", "NORMS", "MLPS", "ATTENTIONS", "ARCHITECTURE_SAID", "LLAMA_FLAGS",
           "MAX_SIZE"]

#: --norm's and --mlp's values, the first the default (spmdsim.models.gpt.config.CHOICES' "norm" and "mlp").
NORMS = ("layer", "rms")
MLPS = ("gelu", "swiglu")
#: --attention's values, the first the default (spmdsim.models.gpt.config.CHOICES' "attention").
ATTENTIONS = ("unfused", "flash")
#: GPTConfig's fields that `architecture_arguments`' flags set -> the flag, so that GPTConfig's refusal names the
#: flag typed (spmdsim.models.gpt.config.said_as): "--rope needs an even head_dim", not "GPTConfig
#: positions 'rope' ...".
ARCHITECTURE_SAID = {"ffn": "--ffn", "kv_heads": "--kv-heads", "norm": "--norm", "mlp": "--mlp",
                     "positions": "--rope", "attention": "--attention"}
#: `architecture_arguments`' flags that make a Llama, as a refusal of a network named "llama" spells them.
LLAMA_FLAGS = "--ffn N --kv-heads N --norm rms --mlp swiglu --untied --rope --no-bias"
#: The most a size flag may say (--hidden, --ffn, --vocab, --heads, --experts, --global-batch, a sequence's tokens):
#: 2**24, over 900 times the widest published model's width (18,432) and 65 times the largest vocabulary (256,000).
#: Unbounded, a dry run past it would stop at a seeded tensor's line that names no flag, and the pure commands
#: would print numbers of thirty digits.
MAX_SIZE = 1 << 24
#: The GPT's size flags (as argparse's names) that `architecture_problem` bounds by MAX_SIZE where a command has them.
SIZED = ("vocab", "pad_vocab_to", "d_model", "heads", "seq", "batch", "experts")


def size_problem(flag: str, value: Optional[int]) -> Optional[str]:
    """Why size flag `flag` cannot say `value` (one line naming the flag, the value and `MAX_SIZE`), or None (None
    too for a flag left out)."""
    if value is None or value <= MAX_SIZE:
        return None
    return f"{flag} {value:,} is too large; expected at most {MAX_SIZE:,} (2**24, far past any model's size)"


def architecture_arguments(parser: Any, width: str = "--d-model") -> None:
    """Add Llama's options (GPTConfig ffn, kv_heads, norm, mlp, tied, positions, bias) to a parser, each default
    the GPT's; `width`: the parser's flag for d_model (``spmdsim estimate``'s is --hidden)."""
    parser.add_argument("--ffn", type=int, default=None, metavar="N",
                        help=f"the MLP's hidden width (default 4 x {width}; Llama-2 7B: 11008)")
    parser.add_argument("--kv-heads", type=int, default=None, metavar="N",
                        help="grouped-query attention's key/value heads (default --heads; Llama-2 70B: 8)")
    parser.add_argument("--norm", default="layer", choices=NORMS, help="LayerNorm (default) or RMSNorm")
    parser.add_argument("--mlp", default="gelu", choices=MLPS,
                        help="the MLP: GELU (default) or SwiGLU (silu(x W1) * (x W3) W2)")
    parser.add_argument("--untied", action="store_true", help="an LM head of its own (default: tied to the embedding)")
    parser.add_argument("--rope", action="store_true", help="rotary position embeddings (default: learned positions)")
    parser.add_argument("--no-bias", action="store_true", help="linear layers without biases (as Llama's)")
    parser.add_argument("--attention", default="unfused", choices=ATTENTIONS,
                        help="the attention core: unfused (default: the scores materialized and kept for backward) "
                             "or flash (FlashAttention-2's query tiles: no scores kept)")


def architecture_problem(args: Any, heads: Optional[int] = None, said: str = "--heads") -> Optional[str]:
    """Why the flags of `architecture_arguments` cannot be (one line naming the flag), or None: --ffn and
    --kv-heads at least 1 and at most MAX_SIZE, the GPT's sizes that `args` has (the training examples' --vocab,
    --pad-vocab-to, --d-model, --heads, --seq, --batch, --experts) at most MAX_SIZE, before any is multiplied (a
    step's memory), --kv-heads dividing the heads (`heads`, said as `said`; default args.heads, --heads).
    Pure: alike on every rank."""
    for name in ("ffn", "kv_heads", *SIZED):
        value = getattr(args, name, None)
        if name in ("ffn", "kv_heads") and value is not None and value < 1:
            return f"--{name.replace('_', '-')} {value} must be >= 1"
        problem = size_problem(f"--{name.replace('_', '-')}", value) if isinstance(value, int) else None
        if problem:
            return problem
    heads = args.heads if heads is None else heads
    if args.kv_heads is not None and heads >= 1 and heads % args.kv_heads:
        return (f"--kv-heads {args.kv_heads} must divide {said} {heads} (each key/value head serves "
                "heads / kv-heads query heads)")
    return None


def architecture_fields(args: Any) -> dict:
    """The GPTConfig fields the flags of `architecture_arguments` say."""
    return {"ffn": args.ffn, "kv_heads": args.kv_heads, "norm": args.norm, "mlp": args.mlp,
            "tied": not args.untied, "positions": "rope" if args.rope else "learned", "bias": not args.no_bias,
            "attention": getattr(args, "attention", "unfused")}


def architecture_flags(cfg: Any) -> list[str]:
    """The flags of `architecture_arguments` that give cfg's options (none for the GPT's own architecture)."""
    return (([f"--ffn {cfg.ffn}"] if cfg.ffn is not None else [])
            + ([f"--kv-heads {cfg.kv_heads}"] if cfg.kv_heads is not None else [])
            + ([f"--norm {cfg.norm}"] if cfg.norm != "layer" else [])
            + ([f"--mlp {cfg.mlp}"] if cfg.mlp != "gelu" else [])
            + (["--untied"] if not cfg.tied else []) + (["--rope"] if cfg.positions == "rope" else [])
            + (["--no-bias"] if not cfg.bias else [])
            + ([f"--attention {cfg.attention}"] if getattr(cfg, "attention", "unfused") != "unfused" else []))


def architecture_words(cfg: Any) -> str:
    """A line's words for Llama's options that differ from the GPT's, each after ", " ("" when none does)."""
    words = ([f"ffn {cfg.hidden}"] if cfg.ffn is not None else []) \
        + (["SwiGLU"] if cfg.mlp == "swiglu" else []) + (["RMSNorm"] if cfg.norm == "rms" else []) \
        + ([f"{cfg.kv} kv heads"] if cfg.kv != cfg.heads else []) + (["RoPE"] if cfg.positions == "rope" else []) \
        + (["untied head"] if not cfg.tied else []) + (["no biases"] if not cfg.bias else []) \
        + (["flash attention"] if getattr(cfg, "attention", "unfused") == "flash" else [])
    return "".join(", " + w for w in words)
