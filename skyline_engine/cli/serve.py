"""`skyline serve`: its arguments, and starting the service they describe.

    skyline serve --stdio                      the editor starts it and talks on stdin/stdout
    skyline serve --listen [HOST:]PORT         a TCP service (default host 127.0.0.1), token required

Binding to an address other than loopback needs `--allow-remote`: whoever reaches the port with
the token runs code as this user. An SSH tunnel to a loopback service is the safer way.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import re
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyline_engine.cli.arguments import DEVICE_HELP, SETTLE_RUNTIME_HELP, parse_size, positive_float, positive_int
from skyline_engine.errors import SkylineError
from skyline_engine.service.config import BudgetOverrides, ServiceConfig

if TYPE_CHECKING:
    from skyline_engine.service.engine import EngineService

DEFAULT_HOST = "127.0.0.1"
QUICK_MIN_RUN_S = 0.02
QUICK_MAX_RUN_S = 0.2


def _default(name: str) -> Any:
    """ServiceConfig's default of field `name`: the options state no defaults of their own."""
    return next(f.default for f in dataclasses.fields(ServiceConfig) if f.name == name)


def add_serve_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the engine as a service for the editor (msgpack-RPC over stdio or TCP)",
        description="Run the analysis engine as a long-lived service speaking msgpack-RPC "
        "(docs/protocol.md). User code runs in worker processes; the service survives their crashes.",
    )
    transport = serve.add_mutually_exclusive_group(required=True)
    transport.add_argument("--stdio", action="store_true", help="talk on stdin/stdout; exit when stdin closes")
    transport.add_argument(
        "--listen",
        metavar="[HOST:]PORT",
        type=parse_listen,
        help=f"accept TCP clients (default host {DEFAULT_HOST}; port 0 picks a free one and prints it)",
    )
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --listen on an address other than loopback (the service runs code: prefer an SSH tunnel)",
    )
    serve.add_argument(
        "--token-file",
        metavar="PATH",
        help="where --listen writes its token, readable by you alone (default: $XDG_STATE_HOME/skyline/token)",
    )
    serve.add_argument(
        "--project-root", default=None, help="the project's root folder (default: the working directory)"
    )
    serve.add_argument("--device", default=_default("device"), help=DEVICE_HELP)
    serve.add_argument(
        "--time-limit",
        type=positive_float("the time limit"),
        default=_default("time_limit_s"),
        metavar="SECONDS",
        help=f"stop an analysis that runs longer (default {_default('time_limit_s'):g}; `analyze` may set its own)",
    )
    serve.add_argument(
        "--worker-memory-limit",
        type=parse_size,
        metavar="SIZE",
        help="address-space limit of each worker, e.g. 8G (CPU analyses only: CUDA cannot start under it, so it "
        "is refused with a GPU)",
    )
    serve.add_argument(
        "--max-frame-bytes",
        type=positive_int("the largest request"),
        default=_default("max_frame_bytes"),
        metavar="N",
        help=f"largest request accepted (default {_default('max_frame_bytes')})",
    )
    serve.add_argument(
        "--handshake-timeout",
        type=positive_float("the handshake timeout"),
        default=_default("handshake_timeout_s"),
        metavar="SECONDS",
        help=f"TCP clients must send `initialize` within this time (default {_default('handshake_timeout_s'):g})",
    )
    serve.add_argument(
        "--min-run-s",
        type=positive_float("--min-run-s"),
        metavar="SECONDS",
        help="time each batch size at least this long",
    )
    serve.add_argument(
        "--max-run-s",
        type=positive_float("--max-run-s"),
        metavar="SECONDS",
        help="time the batch sizes (together, interleaved) at most this long",
    )
    serve.add_argument(
        "--quick",
        action="store_true",
        help=f"short timings ({QUICK_MIN_RUN_S}-{QUICK_MAX_RUN_S} s): fast, less precise",
    )
    serve.add_argument("--settle-runtime", action="store_true", help=SETTLE_RUNTIME_HELP)
    serve.add_argument("--verbose", action="store_true", help="log more on stderr")
    serve.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from skyline_engine.service.engine import EngineService

    logging.basicConfig(
        stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.INFO, format="skyline serve: %(message)s"
    )
    config = build_config(args)
    engine = EngineService(config)
    signal.signal(signal.SIGTERM, lambda *_: engine.request_shutdown())
    try:
        if args.stdio:
            from skyline_engine.service.server import run_stdio

            return run_stdio(engine)
        return _run_tcp(engine, args)
    finally:
        engine.close()


def build_config(args: argparse.Namespace) -> ServiceConfig:
    root = Path(args.project_root) if args.project_root else Path.cwd()
    if not root.is_dir():
        raise SkylineError(f"the project root {str(root)!r} is not a directory.")
    min_run_s, max_run_s = args.min_run_s, args.max_run_s
    if args.quick:
        min_run_s = QUICK_MIN_RUN_S if min_run_s is None else min_run_s
        max_run_s = QUICK_MAX_RUN_S if max_run_s is None else max_run_s
    if min_run_s is not None and max_run_s is not None and min_run_s > max_run_s:
        raise SkylineError("--min-run-s is larger than --max-run-s.")
    if args.worker_memory_limit is not None:
        check_memory_limit_fits_the_device(args.device)
    return ServiceConfig(
        project_root=root.resolve(),
        device=args.device,
        time_limit_s=args.time_limit,
        worker_memory_limit_bytes=args.worker_memory_limit,
        budget=BudgetOverrides(min_run_s=min_run_s, max_run_s=max_run_s),
        max_frame_bytes=args.max_frame_bytes,
        handshake_timeout_s=args.handshake_timeout,
        settle_runtime=args.settle_runtime,
    )


def check_memory_limit_fits_the_device(device_spec: str) -> None:
    """CUDA cannot start under an address-space limit: with a GPU, `auto` would quietly measure
    on the CPU, and `cuda` would fail at its first use. Say so instead."""
    from skyline_engine.measure import nvml  # NVML only when a limit is asked for

    spec = device_spec.strip().lower()
    if spec.startswith("cuda") or (spec == "auto" and nvml.visible_gpu_count() > 0):
        raise SkylineError(
            "--worker-memory-limit caps each worker's address space, and CUDA cannot start under such a cap"
            + (
                ": this machine has an NVIDIA GPU, which --device auto would quietly leave unused."
                if spec == "auto"
                else "."
            )
            + " Give --device cpu to analyse on the CPU under the limit, or leave the limit out to use the GPU."
        )


def _run_tcp(engine: EngineService, args: argparse.Namespace) -> int:
    from skyline_engine.service import tokens
    from skyline_engine.service.server import TcpServer, print_line

    host, port = args.listen
    if not is_loopback(host):
        if not args.allow_remote:
            raise SkylineError(
                f"refusing to listen on {host}, which is not a loopback address: this service runs code "
                "for whoever holds its token.",
                hint="Pass --allow-remote to do it anyway, or listen on 127.0.0.1 and use an SSH tunnel "
                "(ssh -L PORT:127.0.0.1:PORT host).",
            )
        logging.getLogger("skyline.service").warning(
            "WARNING: listening on %s, reachable from other machines; anyone with the token can run code "
            "as this user. Traffic is not encrypted: prefer an SSH tunnel.",
            host,
        )
    token = tokens.new_token()
    token_path = Path(args.token_file) if args.token_file else tokens.default_token_path()
    if token_path.exists() and not token_path.is_file():
        # Written and then removed at exit: a device or a FIFO put there would be replaced, then deleted.
        raise SkylineError(f"cannot write the token file {str(token_path)!r}: it is not a regular file.")
    try:
        tokens.write_token_file(token_path, token)
    except OSError as exc:
        raise SkylineError(f"cannot write the token file {str(token_path)!r}: {exc.strerror or exc}.") from None
    try:
        server = TcpServer(engine, host, port, token)
    except OSError as exc:
        tokens.remove_token_file(token_path, token)
        raise SkylineError(f"cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    bound_host, bound_port = server.address
    print_line(f"skyline serve: listening on {_format_host(bound_host)}:{bound_port}")
    print_line(f"skyline serve: token {token} (also in {token_path})")
    try:
        return server.run()
    finally:
        tokens.remove_token_file(token_path, token)


def parse_listen(text: str) -> tuple[str, int]:
    """`PORT`, `:PORT`, `HOST:PORT` or `[IPV6]:PORT` → (host, port)."""
    match = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d+)|(?P<only>\d+)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not [HOST:]PORT")
    host = match.group("v6") or match.group("host") or DEFAULT_HOST
    port = int(match.group("port") or match.group("only"))
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not between 0 and 65535")
    return host, port


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    # str(): an address is (host, port…), but typeshed also allows the (int, bytes) of an IPv6-less build.
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
