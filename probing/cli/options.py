"""click's side of the shared options: cli/spec.py declares them (click-free, for the fast path);
this turns them into click options, and hands each command the global options it was given."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import click

from .invocation import Invocation
from .spec import Option

Command = TypeVar("Command", bound=Callable[..., Any])


def click_option(option: Option) -> Callable[[Command], Command]:
    names = [option.short, option.name] if option.short else [option.name]
    if option.flag:
        return click.option(*names, is_flag=True, default=option.default, help=option.help)
    if option.choices is not None:
        return click.option(
            *names, type=click.Choice(option.choices), default=option.default,
            show_default=True, help=option.help,
        )  # fmt: skip
    value_type: Any = click.FloatRange(min=0, min_open=True) if option.value_type is float else str
    return click.option(
        *names, type=value_type, default=option.default, metavar=option.metavar,
        show_default=option.default is not None, help=option.help,
    )  # fmt: skip


def carrier_threads(function: Command) -> Command:
    """--thread NAME, repeatable, on `hang` and `run --hang-timeout`: the threads that carry the
    job (analysis.progress), passed as `carriers`."""
    return click.option(
        "--thread", "carriers", multiple=True, metavar="NAME",
        help="A thread that carries the job (its name, or a glob: 'worker-*'; repeatable): the named "
        "threads alone decide whether it progresses. Default: the main thread, with the threads it "
        "joins or supervises while it only waits or loops on a wait.",
    )(function)  # fmt: skip


def apply(*options: Option) -> Callable[[Command], Command]:
    """Declarations of cli/spec.py as click options, in the order given."""

    def decorate(function: Command) -> Command:
        for option in reversed(options):
            function = click_option(option)(function)
        return function

    return decorate


def pass_invocation(function: Callable[..., int]) -> Callable[..., int]:
    """Give the command the global options (the Invocation) as its first argument."""

    @click.pass_context
    @functools.wraps(function)
    def command(ctx: click.Context, *args: Any, **kwargs: Any) -> int:
        invocation = ctx.find_object(Invocation)
        assert invocation is not None
        invocation.command = ctx.info_name
        return function(invocation, *args, **kwargs)

    return command
