"""``downpour sandbox slurm up|status|down``: the one-node Slurm of ``sandbox/slurm.py``."""

from __future__ import annotations

import argparse

from .slurm import DEFAULT_DIR


def add_sandbox_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="a real one-node Slurm for tests and demos (as root)")
    kinds = p.add_subparsers(dest="sandbox", required=True)
    slurm = kinds.add_parser("slurm", help="munge + slurmctld + slurmd under a private directory")
    slurm.add_argument("action", choices=("up", "status", "down"))
    slurm.add_argument("--dir", default=str(DEFAULT_DIR),
                       help=f"the sandbox's directory (default: {DEFAULT_DIR}, or $DOWNPOUR_SLURM_DIR)")
    slurm.add_argument("--no-system-conf", action="store_true",
                       help="do not link /etc/slurm/slurm.conf to the sandbox's slurm.conf; Slurm "
                            "commands then need SLURM_CONF")
    slurm.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default: 60)")
    slurm.set_defaults(func=cmd_slurm)


def cmd_slurm(args: argparse.Namespace) -> int:
    from .slurm import SandboxError, SlurmSandbox

    sandbox = SlurmSandbox(args.dir, link_system_conf=not args.no_system_conf)
    try:
        if args.action == "up":
            status = sandbox.up(args.timeout)
        elif args.action == "down":
            status = sandbox.down(args.timeout)
        else:
            status = sandbox.status()
    except SandboxError as exc:
        print(f"downpour sandbox slurm {args.action}: error: {exc}")
        return 1
    print(status)
    if args.action == "up" and not status.running:
        return 1
    if args.action == "down" and not status.stopped:
        return 1
    return 0
