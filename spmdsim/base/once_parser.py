"""OnceParser: the ArgumentParser of spmdsim's commands (the CLI, python -m spmdsim.models.nets, the scripts).

A module of its own, below the packages: spmdsim.models.nets uses it without importing spmdsim.tools.cli,
which imports spmdsim.models.nets (docs/explanation/architecture.md: packages import downwards).
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import IO, Any

from .output import output_error, quiet_stdout
from .suggest import did_you_mean, did_you_mean_each
from .threads import after_rank0_says, launcher_rank
from ..errors import fold_message

#: The namespace attribute where a parse keeps which single-valued options it has seen (dest -> (flag, value));
#: parse_known_args removes it before returning, so no command sees it.
_GIVEN = "_once_given"
#: The namespace attribute naming the deepest parser that left words it does not know (a subcommand's: its
#: parse returns first, and argparse copies its namespace up); the outermost parse removes it, as `_GIVEN`.
#: The top parser does not know a subcommand's flags: `--hiden` is matched against the parser that read it.
_LEFT_BY = "_once_left_by"


def _once(base: type[argparse.Action]) -> type[argparse.Action]:
    """`base` (store, store_const, store_true, store_false), refusing a second, different value for its dest.

    argparse keeps the last of `--shape 8,8 --shape 4,4` without a word: a flag repeated by mistake (a long
    command line edited) answered a question the user did not ask. The same value twice changes nothing and
    is accepted; options meant to repeat (action="append", "count", "extend") are not wrapped.
    """

    class Once(base):  # type: ignore[misc, valid-type]
        def __call__(self, parser, namespace, values, option_string=None) -> None:
            given = vars(namespace).setdefault(_GIVEN, {})
            value = values if self.nargs != 0 else self.const
            if self.dest in given:
                flag, first = given[self.dest]
                if first != value:
                    parser.error(_twice(flag, first, option_string, value, self.nargs != 0))
            given[self.dest] = (option_string, value)
            super().__call__(parser, namespace, values, option_string)

    Once.__name__ = Once.__qualname__ = f"Once{base.__name__}"
    return Once


def _shown(value: object) -> str:
    """A value as the user typed it: a string quoted, a list of strings space-separated, a number plain."""
    if isinstance(value, list):
        return " ".join(_shown(v) for v in value)
    return repr(value)


def _unrecognized(parser: argparse.ArgumentParser, extra: list) -> str:
    """argparse's "unrecognized arguments: ..." for the words `parser` left, and the flags of its own close to
    each unknown one: its other spelling (`--device_matrix`: --device-matrix) or a typo's (`--hiden`); a flag of
    another program's (the parser's `elsewhere`) is said to be that program's instead."""
    flags = [flag for action in parser._actions if action.help != argparse.SUPPRESS for flag in action.option_strings]
    unknown = [word.split("=", 1)[0] for word in extra]
    unknown = [name for name in unknown if name.startswith("-") and not parser._negative_number_matcher.match(name)]
    elsewhere = getattr(parser, "elsewhere", {})  # another program's flag: where it runs, not a close match
    notes = [f"{name} is {elsewhere[name]}" for name in dict.fromkeys(unknown) if name in elsewhere]
    hint = did_you_mean_each([name for name in unknown if name not in elsewhere], flags, quoted=False)
    return "; ".join([f"unrecognized arguments: {' '.join(extra)}", *notes, *([hint] if hint else [])])


def _twice(flag: str, first: object, again: str, value: object, takes_value: bool) -> str:
    """The one line for a single-valued option given two different values."""
    if not takes_value:  # two switches of one setting: --gather-out and --no-gather-out stored alike
        return f"{flag} and {again} set the same option two ways; expected one of them"
    if flag == again:
        return f"{flag} given twice, {_shown(first)} then {_shown(value)}; expected it once"
    return f"{flag} {_shown(first)} and {again} {_shown(value)} name one option; expected one of them"


def note_no_ranks(parser: argparse.ArgumentParser, command: str, gives: str) -> None:
    """Have the parser of a command that runs no ranks say, of ``--ranks 8`` given to it, what gives its ranks
    (`gives`: "--device-matrix"), where argparse alone says only "unrecognized arguments: --ranks" and reads its 8
    as a case file."""
    parser.elsewhere = {**getattr(parser, "elsewhere", {}),
                        "--ranks": f"for the commands that run ranks (run, collective, demo); {command} runs none: "
                                   f"{gives} gives its ranks"}


class Choices(tuple):
    """An option's choices, and for a value another of spmdsim's commands takes instead (`notes`: value -> words),
    what its refusal says in place of a close match: `estimate --precision fp32` is the trainer's, not a typo."""

    notes: dict

    def __new__(cls, names: Any, notes: dict) -> "Choices":
        made = super().__new__(cls, names)
        made.notes = dict(notes)
        return made


class OnceParser(argparse.ArgumentParser):
    """An ArgumentParser that prints usage, help and errors on rank 0 only.

    Every rank parses the same command line, so each would print the same
    message: under ``mpiexec -n 8`` a typo gave eight usage blocks. The other
    ranks still exit with the same code, without MPI (nothing has started).
    """

    #: Flags another program takes (flag -> "examples/train_moe_gpt.py's ..."): an unknown one is said to be its.
    elsewhere: dict = {}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # A single-valued option given twice with two values is refused, naming both (_once): for every
        # parser and subparser alike (subparsers are OnceParsers: add_subparsers' default parser class).
        for name, base in ((None, argparse._StoreAction), ("store", argparse._StoreAction),
                           ("store_const", argparse._StoreConstAction), ("store_true", argparse._StoreTrueAction),
                           ("store_false", argparse._StoreFalseAction)):
            self.register("action", name, _once(base))
        # `--shape -8,8`, `--flops -1e9` and `--size -1K`: a value that starts with a minus and a digit is a
        # value (then refused by its own check, which names it), not an unknown option (no option of spmdsim's
        # starts so). argparse alone takes "-1K" for an option ("argument --size: expected one argument", the
        # value unnamed), and -inf and -nan too (`--timeout -inf`), which float() reads as numbers.
        self._negative_number_matcher = re.compile(r"^-(\.?\d|inf|nan)", re.IGNORECASE)

    #: Whether this parser reads a subcommand (made by `add_subparsers`): its parse runs inside its command's,
    #: which reports the words left over.
    nested = False

    def add_subparsers(self, **kwargs):  # type: ignore[override]
        """argparse's; the subcommands' parsers are OnceParsers that know they are nested."""
        kwargs.setdefault("parser_class", _SubcommandParser)
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extra, _ = self._parse_known(args, namespace)
        return parsed, extra

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, an unknown flag refused by the (sub)command that read it: its usage, and the flags of
        its own close to it (`--hiden`: did you mean --hidden?)."""
        parsed, extra, by = self._parse_known(args, namespace)
        if extra:
            (by or self).error(_unrecognized(by or self, extra))
        return parsed

    def _parse_known(self, args: Any, namespace: Any) -> tuple[argparse.Namespace, list, Any]:
        """argparse's parse_known_args, and the deepest parser that left words (None when none is left, or
        where this parse is a subcommand's: its command's parse reports it)."""
        parsed, extra = super().parse_known_args(args, namespace)
        vars(parsed).pop(_GIVEN, None)  # the record of one parse: gone before a subcommand's is copied up
        if extra:
            vars(parsed).setdefault(_LEFT_BY, self)
        return parsed, extra, (None if self.nested else vars(parsed).pop(_LEFT_BY, None))

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's refusal of a value not among `action`'s choices, with the choices close to it first."""
        choices = action.choices
        if choices is None or value in choices:
            return
        hint = getattr(choices, "notes", {}).get(value) or (  # a value another command takes: where it runs
            did_you_mean(value, choices) if isinstance(value, str) and all(isinstance(c, str) for c in choices) else "")
        listed = ", ".join(map(repr, choices))
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{'; ' + hint if hint else ''} "
                                             f"(choose from {listed})")

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        """argparse's, on rank 0 only, and where argparse drops a write that failed: the help printed into a full
        disk (``--help > file``) is one line and exit 1, not silence and 0; a reader gone (``| head``) ends the
        output quietly."""
        if launcher_rank() != 0 or not message:
            return
        out = file or sys.stderr
        try:
            out.write(message)
            if out is sys.stdout:
                out.flush()
        except BrokenPipeError:
            quiet_stdout()
        except OSError as exc:
            if out is not sys.stdout:  # stderr itself failed: nowhere to say it, as argparse
                return
            quiet_stdout()
            print(f"{self.prog}: error: {output_error(exc)}", file=sys.stderr)
            sys.exit(1)
        except AttributeError:  # no stream at all (stdout None), as argparse
            pass

    def error(self, message: str):  # type: ignore[override]
        """The error as one line (folded within 100 columns), naming the value and what was expected; no usage
        block above it (up to 4 lines of flags, whose error came last). Where argparse's message says
        only which words it missed or did not know, a hint after it says where the flags are listed."""
        hint = f"; see: {self.prog} --help" if _NAMES_NO_FLAGS.search(message) else ""
        self.exit(2, fold_message(f"{self.prog}: error: {message}{hint}") + "\n")

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        """argparse's, an error's exit on a rank other than 0 held till rank 0 has said it (after_rank0_says)."""
        if message:
            self._print_message(message, sys.stderr)
        sys.exit(after_rank0_says(status))

    def _get_value(self, action: argparse.Action, text: str) -> Any:
        """argparse's, a value that is not an integer (a number) refused naming the flag, the value and that:
        "argument --stages: invalid int value: 'x'" said the type by Python's name for it."""
        try:
            return super()._get_value(action, text)
        except argparse.ArgumentError as exc:
            kind = _KINDS.get(getattr(action.type, "__name__", ""))
            if kind is None or not exc.message.startswith("invalid "):
                raise
            name = action.option_strings[0] if action.option_strings else exc.argument_name  # -n, not -n/-np/--np
            raise argparse.ArgumentError(None, f"{name} {text!r} must be {kind}") from None


#: argparse's messages that name no value: words left over, a flag or positional left out, a flag without its
#: value. Each ends with where `--help` lists the flags (the usage printed above them before).
_NAMES_NO_FLAGS = re.compile(r"^(unrecognized arguments: [^;]*$|the following arguments are required: "
                             r"|argument \S+: expected (one|at least one|\d+) arguments?$)")

#: What a value of each argparse type must be, by the type's name (flag_float is named "float").
_KINDS = {"int": "an integer", "float": "a number"}


class _SubcommandParser(OnceParser):
    """A subcommand's OnceParser (`OnceParser.add_subparsers`): its command's parse reports the words it leaves."""

    nested = True
