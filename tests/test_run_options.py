"""Run-option flags come from RunConfig's fields (sim/commands/run_options.py): one list of options,
so sim run (and every command reusing them) offers each with RunConfig's default and help."""

from __future__ import annotations

import typer
import typer.main

from sim.cli import app
from sim.commands.run_options import WIDER_FLAGS, flag_name, flagged_options, run_option, with_run_options
from sim.engine.config import RunConfig


def _command(name: str):
    return typer.main.get_command(app).commands[name]


def test_sim_run_offers_every_flagged_run_option_with_its_default_and_help():
    params = {p.name: p for p in _command("run").params}
    flagged = flagged_options()
    assert set(flagged) == {n for n, f in RunConfig.model_fields.items() if n not in ("knobs", "overrides")}
    for name in flagged:
        field = RunConfig.model_fields[name]
        assert params[name].opts == [flag_name(name)]
        if name in WIDER_FLAGS:  # --decode-tokens also takes auto: the default as text, its own help
            assert params[name].default == str(field.default) and params[name].help == WIDER_FLAGS[name][1]
            continue
        assert params[name].default == field.default and params[name].help == field.description
    # the run options come first, in RunConfig's order, then the command's own
    assert [p.name for p in _command("run").params][:len(flagged)] == list(flagged)


def test_a_command_reuses_an_option_with_its_own_default_or_help():
    params = {p.name: p for p in _command("validate").params}
    assert params["decode_tokens"].opts == ["--decode-tokens"]
    # one default run length everywhere (sim.engine.config.DEFAULT_DECODE_TOKENS), its own help
    assert params["decode_tokens"].default == RunConfig.model_fields["decode_tokens"].default
    assert params["decode_tokens"].help != RunConfig.model_fields["decode_tokens"].description
    plan = {p.name: p for p in _command("plan").params}
    assert plan["memory_budget"].required and plan["device"].help == RunConfig.model_fields["device"].description


def test_a_decorated_command_receives_the_run_options_as_keywords():
    got = {}
    sub = typer.Typer()

    @sub.command()
    @with_run_options(exclude=("trace",))
    def probe(extra: int = typer.Option(1, "--extra"), **options) -> None:
        got.update(options, extra=extra)

    sub(["--decode-tokens", "7", "--extra", "3", "--offload", "0.5"], standalone_mode=False)
    assert got.pop("extra") == 3 and "trace" not in got
    assert RunConfig.of(**got) == RunConfig(decode_tokens=7, offload=0.5)


def test_a_flagless_option_has_no_flag():
    for name in set(RunConfig.model_fields) - set(flagged_options()):
        try:
            run_option(name)
        except ValueError:
            continue
        raise AssertionError(f"{name} got a flag")
