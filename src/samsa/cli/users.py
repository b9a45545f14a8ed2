"""``samsa users add|list|delete``: SCRAM users in a broker's data directory.

Works whether or not the broker has started (the first super user has to come from
somewhere, as with ``kafka-storage format --add-scram``); a running broker rereads the file,
so the change counts at once. Passwords come from ``--password``, ``--password-file`` or a
prompt, and are never printed; only the salted keys are stored.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from samsa.broker.sasl import CredentialError, ScramCredentials
from samsa.protocol.sasl import (
    SCRAM_MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    SCRAM_MIN_ITERATIONS,
    make_credential,
)


def _password(args: argparse.Namespace) -> str:
    if args.password is not None:
        return str(args.password)
    if args.password_file is not None:
        lines = Path(args.password_file).read_text().splitlines()
        return lines[0] if lines else ""
    return getpass.getpass(f"password for {args.name}: ")


def _mechanisms(args: argparse.Namespace) -> list[str]:
    return [args.mechanism] if args.mechanism else sorted(SCRAM_MECHANISMS)


def _users(args: argparse.Namespace) -> int:
    store = ScramCredentials(Path(args.data_dir))
    try:
        if args.action == "list":
            print("USER\tMECHANISM\tITERATIONS")
            for user, mechs in store.users().items():
                if args.name is None or user == args.name:
                    for mech, iterations in mechs.items():
                        print(f"{user}\t{mech}\t{iterations}")
            return 0
        if args.name is None:
            return _error(f"{args.action} needs a user name")
        if args.action == "add":
            password = _password(args)
            if not password:
                return _error("the password is empty")
            for mech in _mechanisms(args):
                store.put(args.name, mech, make_credential(mech, password, args.iterations))
                print(f"added {args.name} ({mech}, {args.iterations} iterations)")
            return 0
        if not store.delete(args.name, args.mechanism):
            what = f" with {args.mechanism}" if args.mechanism else ""
            return _error(f"no user {args.name!r}{what}")
        print(f"deleted {args.name}" + (f" ({args.mechanism})" if args.mechanism else ""))
        return 0
    except (OSError, CredentialError, ValueError) as exc:
        return _error(str(exc))


def _error(message: str) -> int:
    print(f"samsa users: error: {message}", file=sys.stderr)
    return 1


def register(sub: Any) -> None:
    p = sub.add_parser("users", help="SCRAM users of a broker (in its data directory)")
    p.add_argument("action", choices=["add", "list", "delete"])
    p.add_argument("name", nargs="?", help="user name (list: show only this user)")
    p.add_argument("--data-dir", required=True, help="the broker's data directory")
    p.add_argument(
        "--mechanism",
        choices=sorted(SCRAM_MECHANISMS),
        help="add: only this mechanism (default both); delete: only this one (default all)",
    )
    secret = p.add_mutually_exclusive_group()
    secret.add_argument("--password", help="the password (visible to ps; prefer a file)")
    secret.add_argument("--password-file", metavar="FILE", help="first line is the password")
    p.add_argument(
        "--iterations",
        type=int,
        default=SCRAM_MIN_ITERATIONS,
        help=f"SCRAM iterations, {SCRAM_MIN_ITERATIONS}-{SCRAM_MAX_ITERATIONS} "
        f"(default {SCRAM_MIN_ITERATIONS})",
    )
    p.set_defaults(func=_users)
