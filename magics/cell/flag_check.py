"""Check a magic line's words before argparse does, so a typo is named as a typo.

argparse reads an unknown flag's value as the next positional argument, so
``%%accelerate --mixed-precison bf16`` would say ``invalid choice: 'bf16'`` about
the line magic's command. Here the unknown flag itself is named, with the
closest known one (``did you mean --mixed-precision?``).
"""

from __future__ import annotations

import argparse
import difflib
import functools

from IPython.core.error import UsageError
from IPython.utils.process import arg_split

# Flags users bring from other launchers (torchrun, accelerate launch, mpirun).
_FAMILIAR = {
    "--nproc": "--num-processes", "--nproc-per-node": "--num-processes",
    "--nprocs": "--num-processes", "--np": "--num-processes", "--num-proc": "--num-processes",
    "--processes": "--num-processes", "--precision": "--mixed-precision",
    "--main-process-port": "--port", "--master-port": "--port", "--config-file": "--config",
}


def _suggest(word: str, known: list[str]) -> str:
    """`` (did you mean --x?)`` for the closest known flag, or ``""``."""
    name = word.replace("_", "-").lower()
    if name in known:
        return f" (did you mean {name}?)"
    if name in _FAMILIAR:
        return f" (did you mean {_FAMILIAR[name]}?)"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, (argparse._StoreConstAction, argparse._HelpAction))  # noqa: SLF001


@functools.lru_cache(maxsize=64)  # a line that passed is not checked again (errors: not kept)
def check_words(parser: argparse.ArgumentParser, line: str, cell: bool,
                commands: tuple[str, ...], with_argument: tuple[str, ...] = ()) -> None:
    """Refuse unknown flags and stray words in a magic line, naming them.

    Args:
        parser: the magic's parser (``magic_arguments`` puts it on the function).
        line: the magic line after the magic's name.
        cell: True for the cell magic (no command allowed), False for the line magic.
        commands: the line magic's commands.
        with_argument: the commands that take one word after them (``snapshots DIR``).
    Raises:
        UsageError: an unknown flag (with the closest known one), or a word that
            is neither a flag, a flag's value nor (line magic) a command.
    """
    words = arg_split(line) if line.strip() else []
    if not any(word.startswith("-") for word in words):  # no flag to check (a bare cell)
        _check_positionals(words, cell, commands, with_argument)
        return
    actions = {option: action for action in parser._actions  # noqa: SLF001
               for option in action.option_strings}
    known = sorted(option for option in actions if option.startswith("--"))
    positionals: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            positionals += words[index:]
            break
        if not word.startswith("-") or _is_number(word):
            positionals.append(word)
            continue
        attached = "=" in word or (not word.startswith("--") and len(word) > 2)  # -n2
        name = word.split("=", 1)[0] if word.startswith("--") else word[:2]
        matches = [o for o in known if o.startswith(name)] if name.startswith("--") else []
        action = actions.get(name) or (actions[matches[0]] if len(matches) == 1 else None)
        if action is None:
            magic = "%%accelerate" if cell else "%accelerate"
            raise UsageError(f"{magic}: unknown flag {name}{_suggest(name, known)}; "
                             f"flags: {', '.join(known)} (-n is --num-processes)")
        if _takes_value(action) and not attached:
            index += 1
    _check_positionals(positionals, cell, commands, with_argument)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _check_positionals(words: list[str], cell: bool, commands: tuple[str, ...],
                       with_argument: tuple[str, ...]) -> None:
    if cell and words:
        raise UsageError(f"%%accelerate: unexpected {words[0]!r}: the cell magic takes only flags "
                         f"(e.g. -n 2); {', '.join(commands)} are line magics (%accelerate env)")
    if not cell and words and words[0] not in commands:
        close = difflib.get_close_matches(words[0], commands, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UsageError(f"%accelerate: unknown command {words[0]!r}{hint}; "
                         f"commands: {', '.join(commands)}")
    if words and len(words) > 1 + (words[0] in with_argument):
        extra = words[2] if words[0] in with_argument else words[1]
        if words[0] in with_argument:
            what = ("one directory (quoted if it has spaces)" if words[0] == "snapshots"
                    else "one detached pool's name")
            raise UsageError(f"%accelerate {words[0]}: unexpected {extra!r}; give {what}")
        raise UsageError(f"%accelerate {words[0]}: unexpected {words[1]!r}; give one command "
                         "followed by flags")
