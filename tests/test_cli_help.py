"""Every argument of every subcommand says what it does in ``--help``."""

import argparse

from autocurricula.cli import build_parser


def test_every_argument_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {'/'.join(action.option_strings) or action.dest}"
               for name, command in sub.choices.items() for action in command._actions
               if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()]
    assert not missing, "arguments without help text: " + ", ".join(missing)
    assert "check-model" in parser.format_help()
