"""What `spmdsim autoshard`'s operator search and its search by a machine file share: the GPT that --gpt
sizes, and the line on stderr that says a long choice is still being priced.
"""
from __future__ import annotations

import argparse
import sys
import threading
from typing import Any, Optional

from ...base.suggest import did_you_mean
from ...base.validate import counted
from ...errors import SpmdsimError
from ...models.gpt.config import GPTConfig, said_as
from ...models.gpt.flags import ARCHITECTURE_SAID, size_problem
from ...models.moe.config import MoEConfig
from .estimate import no_moe_block

__all__ = ["gpt_config", "gpt_said", "gpt_typed", "still_working", "PATIENCE_S", "GPT_KEYS", "MACHINE_KEYS"]

#: The GPTConfig fields --gpt sets.
GPT_KEYS = ("vocab", "d_model", "heads", "layers", "seq", "batch")
#: With --machine, the MoE layers' keys too (spmdsim.models.moe.MoEConfig: experts, top_k, every as moe_every, dropless
#: 0 or 1: with 1 the experts drop no token, the dry runs routing them balanced), and the
#: vocabulary's padding (the model's dry run masks the padded logits out of the loss, as Megatron does; the
#: operators' graph has no such mask: there a vocabulary no tp divides is cut unevenly instead).
MOE_KEYS = ("experts", "top_k", "moe_every", "dropless")
MACHINE_KEYS = MOE_KEYS + ("vocab_pad_to",)

#: Most layers --gpt prices: the search grows faster than the layers (64 take about 11 s
#: at 8 devices, 256 more than 30 s).
MAX_GPT_LAYERS = 64

#: Most elements of one GPT tensor (logits batch*seq*vocab, scores batch*heads*seq*seq,
#: the MLP's batch*seq*4*d_model, the table vocab*d_model): 2**40, so byte counts stay exact integers.
MAX_GPT_ELEMENTS = 2 ** 40


def gpt_said(text: Optional[str]) -> Any:
    """GPTConfig's refusals, within it, name the fields --gpt `text` typed ("--gpt d_model 100") and the
    architecture's flags (--rope, --kv-heads, ...) as typed, the other sizes as defaults ("the default d_model 128
    must be divisible by --gpt heads 3", not "--gpt d_model 128", a key the user never typed);
    spmdsim.models.gpt.config.said_as. `text` already read by gpt_config (None: no --gpt)."""
    typed = gpt_typed(text)
    sizes = GPT_KEYS + ("vocab_pad_to",)
    return said_as({**{key: f"--gpt {key}" for key in sizes if key in typed}, **ARCHITECTURE_SAID,
                    "dropout": "--dropout"},
                   defaults=[key for key in sizes if key not in typed])


def gpt_typed(text: Optional[str]) -> set:
    """The keys --gpt `text` gives (None: no --gpt, none)."""
    return {item.partition("=")[0].strip() for item in text.split(",")} if text else set()


def gpt_config(text: str, max_layers: int = MAX_GPT_LAYERS, sizes: bool = True, moe: bool = False) -> Any:
    """--gpt 'layers=2,d_model=64' as a GPTConfig (its own checks name a bad value); with `moe` (the search by
    a machine file) MACHINE_KEYS too: experts=N makes every moe_every-th block (default 2) an MoE layer, and
    vocab_pad_to=N pads the vocabulary."""
    keys = GPT_KEYS + (MACHINE_KEYS if moe else ())
    fields: dict = {}
    for item in text.split(",") if text else ():  # "": no --gpt (the search by a machine file), the defaults
        key, sep, value = (part.strip() for part in item.partition("="))
        if sep and key in MOE_KEYS and not moe:
            raise SpmdsimError(f"--gpt {key} sets MoE layers, which only the search by a machine file prices: "
                               "add --machine (e.g. --machine a100-dgx)")
        if sep and key == "vocab_pad_to" and not moe:
            raise SpmdsimError("--gpt vocab_pad_to pads the vocabulary in the search by a machine file (add --machine, "
                               "e.g. --machine a100-dgx); the operators' search cuts a vocabulary no tp divides "
                               "unevenly instead")
        if not sep or key not in keys:
            hint = did_you_mean(key, keys)
            raise SpmdsimError(f"--gpt {item.strip()!r} must read KEY=VALUE with KEY one of {keys!r}, "
                               f"e.g. 'layers=2,d_model=64'{'; ' + hint if hint else ''}")
        if key == "dropless" and value not in ("0", "1"):
            raise SpmdsimError(f"--gpt dropless {value!r} must be 0 or 1 (1: the experts drop no token)")
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1 and key != "dropless":  # the key typed, not GPTConfig's "layers -1 must be ..."
            raise SpmdsimError(f"--gpt {key} {value!r} must be an integer >= 1")
        problem = None if sizes or key in ("layers", "seq") else size_problem(f"--gpt {key}", number)
        if problem:  # the search by a machine file (the operators' graph bounds its tensors below; its own bounds
            raise SpmdsimError(problem)  # on layers and seq), before the search prices thirty-digit sizes
        if fields.get(key, number) != number:  # 'layers=1,layers=2' kept the last unsaid
            raise SpmdsimError(f"--gpt {key}={fields[key]} and {key}={number} set {key} two ways; give one")
        fields[key] = number
    experts = {k: fields.pop(k) for k in MOE_KEYS if k in fields}
    if experts and "experts" not in experts:
        raise SpmdsimError(f"--gpt {', '.join(experts)} set MoE layers: give experts=N too")
    if experts:
        experts["every"] = experts.pop("moe_every", 2)
        experts["dropless"] = bool(experts.get("dropless", 0))
        layers = fields.get("layers", GPTConfig.layers)
        if experts["every"] > layers:
            said = "--gpt layers" if "layers" in fields else "the default layers"  # not typed: not "--gpt"
            raise SpmdsimError(f"--gpt moe_every {experts['every']} makes {no_moe_block(layers)}; "
                               f"expected at most {said} {layers}")
        fields["moe"] = MoEConfig(**experts)
    with gpt_said(text):  # its refusals name the keys typed: "--gpt d_model 100 must be divisible by ..."
        config = GPTConfig(**fields)
    if config.layers > max_layers:
        raise SpmdsimError(f"--gpt layers {config.layers:,} is too many; expected at most {max_layers:,} "
                           "(the search's time grows faster than the layers)")
    c = config
    if not sizes:  # a dry run's blocks are never written: any size
        return config
    tensors = {"batch*seq*vocab": c.batch * c.seq * c.padded_vocab,
               "batch*heads*seq*seq": c.batch * c.heads * c.seq ** 2,
               "batch*seq*4*d_model": c.batch * c.seq * 4 * c.d_model, "vocab*d_model": c.padded_vocab * c.d_model}
    name, elements = max(tensors.items(), key=lambda kv: kv[1])
    if elements > MAX_GPT_ELEMENTS:
        raise SpmdsimError(f"--gpt {text!r} makes a tensor of {name} = {elements:,} elements; "
                           f"expected at most {MAX_GPT_ELEMENTS:,} (2**40)")
    return config


#: Seconds before the first "still choosing" line on stderr, and between the next ones.
PATIENCE_S = 15.0


class still_working:
    """Say on stderr, every PATIENCE_S seconds, that the choice is still being priced (never silent for minutes).

    The training objective plans each gradient move in full: the attention network at 64 devices
    takes about 90 s, at 128 several minutes (docs/howto/autoshard.md).
    """

    def __init__(self, args: argparse.Namespace, devices: int, hint: str = "") -> None:
        """`hint`: said after the first line's figure (how to wait less)."""
        self.what = f"{args.network} on {counted(devices, 'device')}" + (", training" if args.training else "")
        self.hint = hint
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._say, daemon=True, name="autoshard progress")

    def _say(self) -> None:
        waited = 0.0
        while not self.done.wait(PATIENCE_S):
            waited += PATIENCE_S
            hint, self.hint = self.hint, ""
            print(f"spmdsim: still pricing {self.what} after {waited:.0f} s{hint}", file=sys.stderr, flush=True)

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
