"""``downpour sandbox slurm up|status|down``: the Slurm of ``sandbox/slurm.py``, on one node or on N
emulated hosts (``--nodes N``, links shaped with ``--bandwidth``)."""

from __future__ import annotations

import argparse

from ..sandbox.slurm import DEFAULT_DIR, DOWN_TIMEOUT_S, UP_TIMEOUT_S
from . import summary


def add_sandbox_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help=summary("sandbox"))
    kinds = p.add_subparsers(dest="sandbox", required=True)
    slurm = kinds.add_parser("slurm", help="munge + slurmctld + slurmd under a private directory")
    slurm.add_argument("action", choices=("up", "status", "down"))
    slurm.add_argument("--dir", default=str(DEFAULT_DIR),
                       help=f"the sandbox's directory (default: {DEFAULT_DIR}, or $DOWNPOUR_SLURM_DIR)")
    slurm.add_argument("--no-system-conf", action="store_true",
                       help="do not link /etc/slurm/slurm.conf to the sandbox's slurm.conf; Slurm "
                            "commands then need SLURM_CONF")
    slurm.add_argument("--nodes", type=int, default=None,
                       help="up: compute nodes, each a separate host (network namespace) on a private "
                            "bridge (default: 1, this machine itself; or as many as the sandbox has)")
    slurm.add_argument("--bandwidth", default=None, metavar="RATE",
                       help="up: every node's link at RATE both ways, e.g. 10gbit, 1gbit, 100mbit, or none; "
                            "on a running sandbox this changes the rate")
    slurm.add_argument("--timeout", type=float, default=None,
                       help=f"seconds to wait (default: {UP_TIMEOUT_S:g} for up, {DOWN_TIMEOUT_S:g} "
                            "for down)")
    slurm.set_defaults(func=cmd_slurm)


def cmd_slurm(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..sandbox.slurm import SlurmSandbox
    from ..sandbox.status import SandboxError

    try:
        if args.action != "up" and (args.nodes is not None or args.bandwidth is not None):
            raise ConfigError("--nodes/--bandwidth", args.nodes or args.bandwidth,
                              f"they belong to `up`, not `{args.action}`")
        if args.timeout is not None and not args.timeout > 0:
            raise ConfigError("--timeout", args.timeout, "seconds to wait, > 0")
        if args.action == "up":  # it writes its config, keys and logs there
            from ..paths import check_output_dir

            check_output_dir("--dir", args.dir)
        sandbox = SlurmSandbox(args.dir, link_system_conf=not args.no_system_conf, nodes=args.nodes)
        waits = {} if args.timeout is None else {"timeout_s": args.timeout}  # else up's and down's own
        if args.action == "up":
            status = sandbox.up(bandwidth=args.bandwidth, **waits)
        elif args.action == "down":
            status = sandbox.down(**waits)
        else:
            status = sandbox.status()
    except ConfigError as exc:
        print(f"downpour sandbox slurm {args.action}: error: {exc}")
        return 2
    except SandboxError as exc:
        print(f"downpour sandbox slurm {args.action}: error: {exc}")
        return 1
    print(status)
    if args.action == "up" and not status.running:
        return 1
    if args.action == "down" and not status.stopped:
        return 1
    return 0
