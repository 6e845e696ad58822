"""`serve`: the steered, self-checking model as an OpenAI-compatible service (topl_core/serve/): /v1/models,
/v1/completions and /v1/chat/completions, λ per request in the body's `steering`, the adapter's p(good) on every
token. Loopback only unless --host says otherwise, and then only with --api-key (docs/serve.md)."""

from __future__ import annotations

import argparse
import ipaddress
import os

import uvicorn

from ..analysis.lora_a.probe import STEERING_TOKEN_RECORDS
from ..runtime.session import SteeringSession
from ..serve.app import LOOPBACK_HOSTS, create_app
from ..serve.batch import PROMPT_CACHE_MB
from ..serve.engine import ServeEngine
from ..serve.protocol import ALIAS_MARK, ServeError, alias_steering
from . import COMMANDS
from .common import (
    ADAPTER_HELP,
    add_adapter_args,
    add_precision_arg,
    announce_precision,
    open_adapter_arg,
)
from .vectors_args import add_vectors_args, vectors_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help=COMMANDS["serve"].help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_adapter_args(p, ADAPTER_HELP + " (served merged, steered per request)")
    add_vectors_args(p)
    p.set_defaults(limit=STEERING_TOKEN_RECORDS)  # the Steering page's token set: its vectors, shipped for the demos
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (not loopback: needs --api-key)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=os.environ.get("TOPL_API_KEY"),
        help="the Bearer token every request must carry (default: $TOPL_API_KEY; none on loopback)",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=16,
        help="rows decoded as one batch (a steered request on an adapter with a head takes two: at least 2)",
    )
    p.add_argument("--queue", type=int, default=32, help="requests that may wait for a slot; more get 429")
    p.add_argument("--max-body", type=int, default=1_000_000, help="the largest request body, in bytes")
    p.add_argument("--max-prompt-tokens", type=int, default=4096, help="the longest prompt, in tokens")
    p.add_argument(
        "--prompt-cache-mb",
        type=int,
        default=PROMPT_CACHE_MB,
        help="memory for the forwards of recent prompts: one asked for again decodes at once (0: none)",
    )
    p.add_argument(
        "--expose",
        action="append",
        default=[],
        metavar="MODE:LAMBDA[,SETTING=VALUE...]",
        help=f"list the steering alias ADAPTER{ALIAS_MARK}MODE:LAMBDA in /v1/models, for clients that send no "
        "`steering` field (lm-eval's multiple-choice tasks), e.g. vector:2 or gated:2,tau=0.9; repeat for more "
        "(any such alias is served; these are listed)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host header name served besides the loopback names and --host (a proxy's name); on a non-loopback "
        "--host, where the API key guards, any Host is served",
    )
    add_precision_arg(p)
    p.set_defaults(func=run)


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    if not loopback(args.host) and not args.api_key:
        raise SystemExit(
            f"error: --host {args.host} serves beyond this machine: give --api-key KEY (or set TOPL_API_KEY), which "
            "every request must then carry as `Authorization: Bearer KEY`."
        )
    if args.slots < 1 or args.queue < 0:
        raise SystemExit("error: --slots takes 1 or more (2 or more for an adapter with a head), --queue 0 or more.")
    adapter = open_adapter_arg(args)
    exposed = [f"{adapter.name}{ALIAS_MARK}{spelled}" for spelled in args.expose]
    for alias in exposed:
        try:
            alias_steering(alias).config("model")
        except ServeError as e:
            raise SystemExit(f"error: --expose: {e.message}") from None
    precision = announce_precision(args.precision, adapter.device)
    vectors = vectors_from_args(args, adapter, precision)
    session = SteeringSession.from_run(adapter, vectors, adapter.base_model)
    try:
        engine = ServeEngine(session, args.precision, args.slots, args.queue, args.prompt_cache_mb)
    except ValueError as e:
        raise SystemExit(f"error: --slots/--queue: {e}") from None
    allowed = None if not loopback(args.host) else [*LOOPBACK_HOSTS, args.host, *args.allowed_host]
    app = create_app(engine, adapter.name, args.api_key, args.max_body, args.max_prompt_tokens, exposed, allowed)
    names = ", ".join([adapter.name, f"{adapter.name}:merged", f"{adapter.name}:base", *exposed])
    print(f"serving {adapter.name} (models {names}) on http://{args.host}:{args.port}/v1", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        engine.close()
    return 0
