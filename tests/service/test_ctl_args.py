"""hixlctl's command line: its common options go before or after the command."""

from __future__ import annotations

import pytest

from hixl_service import ctl


@pytest.mark.parametrize("argv", [
    ["-o", "json", "--daemon", "unix:/x.sock", "--timeout", "3", "links"],
    ["links", "-o", "json", "--daemon", "unix:/x.sock", "--timeout", "3"],
    ["--daemon", "unix:/x.sock", "links", "--output", "json", "--timeout", "3"],
])
def test_options_go_before_or_after_the_command(argv: list[str]) -> None:
    args = ctl._parse_args(argv)
    assert (args.command, args.output, args.daemon, args.timeout) == (
        "links", "json", "unix:/x.sock", 3.0)


def test_defaults_hold_when_no_option_is_given() -> None:
    args = ctl._parse_args(["doctor", "--peer", "10.0.0.5:26000"])
    assert (args.output, args.daemon, args.config, args.timeout, args.peer) == (
        "table", None, None, 10.0, ["10.0.0.5:26000"])


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ctl._parse_args(["--help"])
    assert "hixlctl links -o json" in capsys.readouterr().out
