"""HOST:PORT as protocol/endpoints.py reads and writes it: the one parser behind the agent's
PROBING_LISTEN, `probing run --listen` and every tcp:// endpoint."""

from __future__ import annotations

from typing import Tuple

import pytest

from probing.agent.listener.acceptor import peer_text
from probing.client.tcp import endpoint_url, split_endpoint
from probing.errors import ExitCode, UsageError
from probing.protocol.endpoints import AddressError, format_endpoint, parse_endpoint, parse_listen_address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto", ("0.0.0.0", 0)),
        (" AUTO ", ("0.0.0.0", 0)),
        ("47001", ("0.0.0.0", 47001)),
        (":47001", ("0.0.0.0", 47001)),
        ("127.0.0.2:0", ("127.0.0.2", 0)),
        ("[::1]:5000", ("::1", 5000)),
        ("node1:80", ("node1", 80)),
    ],
)
def test_listen_addresses(text: str, expected: Tuple[str, int]) -> None:
    assert parse_listen_address(text) == expected


def test_a_fixed_listen_port_moves_by_the_offset_and_port_0_stays_0() -> None:
    assert parse_listen_address("47001", 3) == ("0.0.0.0", 47004)
    assert parse_listen_address("127.0.0.1:0", 3) == ("127.0.0.1", 0)
    with pytest.raises(AddressError, match=r"port 65536 is out of range \(0 to 65535\)"):
        parse_listen_address("65535", 1)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("python", "is not [HOST:]PORT or auto"),
        ("host:port", "is not [HOST:]PORT or auto"),
        ("", "is not [HOST:]PORT or auto"),
        ("127.0.0.1:", "is not [HOST:]PORT or auto"),
        ("٣٣", "is not [HOST:]PORT or auto"),
        ("::1:5000", "write an IPv6 host in brackets, [::1]:PORT"),
        ("70000", "port 70000 is out of range"),
    ],
)
def test_a_bad_listen_address_says_what_form_it_takes(text: str, why: str) -> None:
    with pytest.raises(AddressError, match=f"listen address {text!r:.80}.*{why}".replace("[", r"\[")):
        parse_listen_address(text)


def test_endpoints_need_a_host_and_a_port_above_0() -> None:
    assert parse_endpoint("node-3.cluster.local:65535") == ("node-3.cluster.local", 65535)
    assert parse_endpoint("[fe80::1]:1") == ("fe80::1", 1)
    for bad in ("", "host", "host:", ":80", "h:0", "h:65536", "h:8x", "a b:1", "h/x:1", "::1:80", "[::1]"):
        with pytest.raises(AddressError, match="an endpoint is HOST:PORT"):
            parse_endpoint(bad)


def test_one_way_of_writing_host_and_port_on_both_sides() -> None:
    assert format_endpoint("10.0.0.1", 80) == "10.0.0.1:80"
    assert format_endpoint("::1", 80) == "[::1]:80"
    assert endpoint_url("::1", 80) == "tcp://[::1]:80"
    assert peer_text(("::1", 80, 0, 0)) == "[::1]:80" and peer_text(("10.0.0.1", 80)) == "10.0.0.1:80"
    assert peer_text("unix") == "unix"
    for host, port in (("::1", 5), ("node1", 29500), ("127.0.0.1", 1)):
        assert split_endpoint(endpoint_url(host, port)) == (host, port)
        assert parse_listen_address(format_endpoint(host, port)) == (host, port)


def test_a_malformed_tcp_target_is_a_usage_error_that_names_the_form() -> None:
    with pytest.raises(UsageError, match=r"write an IPv6 host in brackets.*\(tcp://HOST:PORT as a target\)"):
        split_endpoint("tcp://::1:80")


def test_run_listen_refuses_a_bad_address_before_starting_the_job(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--listen python train.py` takes `python` for ADDR: exit 2 naming the forms, nothing run."""
    from probing.cli import main
    from probing.launch.launcher import Launcher

    def started(*args: object) -> None:
        raise AssertionError("the job was started")

    monkeypatch.setattr(Launcher, "start", started)
    monkeypatch.setenv("PROBING_TOKEN", "the-cli-token-0123456789")
    assert main(["run", "--listen", "python", "train.py"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--listen: listen address 'python' is not [HOST:]PORT or auto" in err
    assert "put `--` before the command: probing run --listen -- python train.py" in err


def test_a_name_that_does_not_resolve_in_time_costs_the_timeout_and_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resolver has no timeout of its own: a name is looked up in a thread waited on until the
    command's deadline; an address is never looked up at all."""
    import socket
    import threading
    import time

    from probing.client import tcp
    from probing.errors import AgentTimeout, AgentUnreachable

    real = socket.getaddrinfo
    release = threading.Event()
    looked_up = []

    def resolver(host: str, port: object, *args: object) -> object:
        numeric = len(args) >= 4 and int(args[3]) & socket.AI_NUMERICHOST  # type: ignore[call-overload]
        if not numeric:
            looked_up.append(host)
            release.wait(10)  # a DNS server that never answers
        return real(host, port, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    started = time.monotonic()
    with pytest.raises(AgentTimeout, match=r"cannot resolve the host of tcp://slow\.invalid:1 within 0\.3 s"):
        tcp._connect("slow.invalid", 1, "tcp://slow.invalid:1", started + 0.3, 0.3)
    assert time.monotonic() - started < 1.0
    release.set()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(AgentUnreachable, match="nothing listens on"):
        tcp._connect("127.0.0.1", port, f"tcp://127.0.0.1:{port}", time.monotonic() + 5, 5)
    assert looked_up == ["slow.invalid"]
