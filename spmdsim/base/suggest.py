"""The "did you mean" of a refusal: the names a mistyped one was likely meant as (a command, a choice, a flag).

difflib's close matches, after the spellings users bring from elsewhere: `ring_allreduce` for `ring-allreduce`,
`--device_matrix` for `--device-matrix`, another case, `mpiexec` for `mpirun`.
"""
from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["close_matches", "did_you_mean", "did_you_mean_each", "word_list"]

#: Names from other tools, and spmdsim's that do their work (the first a command has is named): PyTorch's
#: sharding flags and Megatron-LM's (by spelling alone `--hsdp 2` meets "did you mean --sp or --dp?", and
#: `--hidden-size` nothing in train_gpt.py; train_gpt.py's `--d-model` is the estimate's `--hidden`).
SYNONYMS = {"mpiexec": ("mpirun",), "srun": ("mpirun",), "--hsdp": ("--shard-group",),
            "--hybrid-shard": ("--shard-group",), "--fsdp": ("--zero",), "--sequence-parallel": ("--sp",),
            "--tensor-model-parallel-size": ("--tp",), "--pipeline-model-parallel-size": ("--pp",),
            "--context-parallel-size": ("--cp",), "--expert-model-parallel-size": ("--ep",),
            "--expert-tensor-parallel-size": ("--etp",),
            "--virtual-pipeline-model-parallel-size": ("--virtual-stages",),
            "--num-layers": ("--layers",), "--hidden-size": ("--d-model", "--hidden"),
            "--num-attention-heads": ("--heads",), "--seq-length": ("--seq",), "--ffn-hidden-size": ("--ffn",),
            "--num-query-groups": ("--kv-heads",), "--vocab-size": ("--vocab",), "--num-experts": ("--experts",),
            "--moe-router-topk": ("--top-k",), "--moe-expert-capacity-factor": ("--capacity-factor",),
            "--global-batch-size": ("--batch", "--global-batch"), "--micro-batch-size": ("--micro-batch",),
            "--train-iters": ("--steps",), "--normalization": ("--norm",), "--recompute-granularity": ("--recompute",),
            "--use-distributed-optimizer": ("--zero",), "--untie-embeddings-and-output-weights": ("--untied",),
            # train_gpt.py's sizes and the estimate's: its --batch is a step's sequences, --global-batch (a
            # typo's match named --micro-batch)
            "--d-model": ("--hidden",), "--hidden": ("--d-model",), "--batch": ("--global-batch",),
            "--global-batch": ("--batch",),
            # `run embedding --mode vocab` and `run linear --parallel column`: each picks how its operator is split
            "--mode": ("--parallel",), "--parallel": ("--mode",)}


def close_matches(word: str, names: Iterable[object], most: int = 3) -> list[str]:
    """The names `word` was likely meant as, the likeliest first: its other spelling alone where there is one
    (`_` for `-` or the reverse, another case, a synonym); else the names it begins (`matmul_2x4` of
    `matmul_2x4_4x1`), then difflib's close matches; at most `most`. Flags are compared without their dashes."""
    names = [str(n) for n in names]
    for other in (word.replace("_", "-"), word.replace("-", "_"), word.lower(), *SYNONYMS.get(word, ())):
        if other and other != word and other in names:
            return [other]
    bare: dict[str, str] = {}
    for name in names:
        bare.setdefault(name.lstrip("-").lower(), name)
    key = word.lstrip("-").lower()
    if not key:
        return []
    begun = [name for stem, name in bare.items() if len(key) > 1 and stem.startswith(key) and stem != key]
    close = [bare[stem] for stem in difflib.get_close_matches(key, bare, n=most)]
    return list(dict.fromkeys(begun + close))[:most]


def word_list(items: list[str], word: str = "or") -> str:
    """'a', 'a or b', 'a, b or c' (`word` "and": 'a, b and c')."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def did_you_mean(word: str, names: Iterable[object], quoted: bool = True) -> str:
    """``did you mean 'estimate'?`` (`quoted`: each name as repr writes it; a flag is not), or "" when no name is
    close to `word`."""
    return did_you_mean_each([word], names, quoted)


def did_you_mean_each(words: list[str], names: Iterable[object], quoted: bool = True) -> str:
    """``did you mean 'mlp'?`` for the one word of `words` that has close `names`; where several words were given,
    each's named: ``did you mean --hidden for --hiden; --seq for --sq?`` (`quoted` as `did_you_mean`), or ""."""
    names = [str(n) for n in names]
    shown = (lambda w: repr(w)) if quoted else (lambda w: w)
    hints = [(word, word_list([shown(m) for m in matches]))
             for word in words for matches in (close_matches(word, names),) if matches]
    if not hints:
        return ""
    if len(words) == 1:
        return f"did you mean {hints[0][1]}?"
    return f"did you mean {'; '.join(f'{flags} for {shown(word)}' for word, flags in hints)}?"
