"""``gmi-drl switch serve`` (and ``python -m gmi_drl.comm.switch serve``): run one switch.

Prints ``listening on IP:PORT`` once bound, then every ``--stats-interval`` seconds one line of
rates over the interval (`Rates`: packets in and out, aggregated bytes and drops per second, the
daemon's CPU use) followed by the counters, and the final counters as JSON on SIGTERM/SIGINT
(exit 0).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

from gmi_drl.comm.switch.daemon import (FALLBACK_MTU, MAX_DEFAULT_MTU, SwitchConfig,
                                        SwitchDaemon, parse_addr)
from gmi_drl.comm.switch.dataplane import PLANES


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_addr(text)
    except ValueError as e:  # (argparse shows an ArgumentTypeError's text, not a ValueError's)
        raise argparse.ArgumentTypeError(str(e)) from None


def _parent_address(text: str) -> tuple[str, int]:
    """``--parent``: a switch one can send to: a port, and one host (no broadcast, multicast or
    unspecified address, which the kernel refuses or spreads)."""
    import ipaddress
    import socket

    host, port = _address(text)
    if port == 0:
        raise argparse.ArgumentTypeError(f"{text}: the parent's port, not 0")
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(host))
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text}: {host} does not resolve ({e})") from None
    if ip.is_multicast or ip.is_unspecified or ip == ipaddress.ip_address("255.255.255.255"):
        raise argparse.ArgumentTypeError(f"{text}: not one host's address (a parent switch "
                                         "is one daemon's HOST:PORT)")
    return host, port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gmi-drl switch", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run an aggregation switch daemon",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = SwitchConfig()
    s.add_argument("--bind", required=True, type=_address, default=argparse.SUPPRESS,
                   help="ADDR:PORT to listen on (port 0: any free port; required)")
    s.add_argument("--parent", type=_parent_address, default=None,
                   help="HOST:PORT of the upper-level switch (hierarchical aggregation)")
    s.add_argument("--threshold", type=int, default=d.threshold,
                   help="aggregation threshold H (0: the number of members); a Join that "
                        "would make more members than H is refused, as gmi-drl's workers take "
                        "part in every round")
    s.add_argument("--drop-rate", type=float, default=d.drop_rate,
                   help="inject loss: drop each packet in and out with this probability")
    s.add_argument("--dup-rate", type=float, default=d.dup_rate,
                   help="inject duplicates: handle/send each packet twice with this probability")
    s.add_argument("--delay-ms", type=float, default=d.delay_ms,
                   help="inject delay on every packet sent, milliseconds")
    s.add_argument("--mtu", type=int, default=None,
                   help="path MTU, bytes (segment size); default: the MTU of the interface of "
                        "the --bind address (0.0.0.0: the smallest of the up interfaces other "
                        "than loopback), at most %d (loopback: %d), else %d"
                        % (MAX_DEFAULT_MTU, MAX_DEFAULT_MTU, FALLBACK_MTU))
    s.add_argument("--slots", type=int, default=d.slots, help="aggregation slots (power of 2)")
    s.add_argument("--window-bytes", type=int, default=d.window_bytes,
                   help="bytes a member may have in flight (the window in segments follows)")
    s.add_argument("--max-members", type=int, default=d.max_members,
                   help="most members this switch accepts (rows per slot)")
    s.add_argument("--member-timeout", type=float, default=d.member_timeout_s,
                   help="drop a member silent this long, seconds")
    s.add_argument("--help-after", type=float, default=d.help_after_s,
                   help="ask missing members of a slot waiting this long, seconds")
    s.add_argument("--switch-id", type=int, default=d.switch_id,
                   help="this switch's id (the parent id its members see)")
    s.add_argument("--member-id", type=int, default=d.member_id,
                   help="this switch's member id at its parent (orders the parent's sum)")
    s.add_argument("--job-id", default=d.job_id, help="serve only this job (default %(default)r: "
                   "the first Join's); gmi-drl train names its job with --gmi.switch-job")
    s.add_argument("--token", default=d.token, help="shared secret every Join must carry "
                   "(default %(default)r: none); gmi-drl train gives it with "
                   "--gmi.switch-token")
    s.add_argument("--seed", type=int, default=None, help="seed of the fault injection")
    s.add_argument("--data-plane", choices=PLANES, default=d.data_plane,
                   help="native: C++ with recvmmsg/sendmmsg batches; python: the reference; "
                        "auto: native where it is built")
    s.add_argument("--stats-interval", type=float, default=5.0,
                   help="print counters every this many seconds (0: never)")
    s.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    return p


DROPS = ("injected_drops", "malformed_dropped", "non_member_dropped", "foreign_job_dropped",
         "not_ready_dropped", "stale_dropped", "busy_dropped")
"""the counters of packets the daemon received and did not use"""


class Rates:
    """Per-second rates of a daemon's counters between two calls of `line`, and the CPU the
    process used in between (``process_time``: every thread, in cores: 1.0 = one core busy)."""

    def __init__(self) -> None:
        self._last: dict | None = None
        self._t, self._cpu = time.monotonic(), time.process_time()

    def line(self, counters: dict) -> str:
        """``rates: ...`` over the interval since the previous call (or since creation)."""
        now, cpu = time.monotonic(), time.process_time()
        dt = max(now - self._t, 1e-9)
        last = self._last or {k: 0 for k in counters}
        delta = {k: counters[k] - last.get(k, 0) for k in ("packets_in", "packets_out",
                                                            "bytes_aggregated")}
        drops = sum(counters[k] - last.get(k, 0) for k in DROPS)
        text = (f"rates over {dt:.1f} s: packets in {delta['packets_in'] / dt:,.0f}/s, out "
                f"{delta['packets_out'] / dt:,.0f}/s, aggregated "
                f"{delta['bytes_aggregated'] / dt / 1e6:,.2f} MB/s, drops {drops / dt:,.1f}/s, "
                f"CPU {(cpu - self._cpu) / dt:.2f} cores")
        self._last, self._t, self._cpu = dict(counters), now, cpu
        return text


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``argv`` without the program name (``["serve", "--bind", ...]``)."""
    args = build_parser().parse_args(argv)
    level = logging.getLevelName(args.log_level.upper())
    if not isinstance(level, int):
        print(f"gmi-drl switch: --log-level {args.log_level}: use DEBUG, INFO, WARNING or ERROR",
              file=sys.stderr)
        return 2
    if not 0 <= args.stats_interval < float("inf"):
        print(f"gmi-drl switch: --stats-interval {args.stats_interval} must be >= 0 and finite "
              "(0: never)", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the switch's own loggers: `gmi-drl` may have configured the root logger (INFO) first
    logging.getLogger("gmi_drl.comm.switch").setLevel(level)
    rates = Rates()
    def say(text: str) -> None:
        try:
            print(text, flush=True)
        except OSError:  # a closed pipe (`| head`): a running job's aggregation must go on,
            sys.stdout = open(os.devnull, "w")  # unprinted (and Python's flush at exit too)

    def report(c) -> None:
        say(rates.line(c.as_dict()))
        say(" ".join(f"{k}={v}" for k, v in c.as_dict().items()))

    try:
        cfg = SwitchConfig(bind=args.bind, parent=args.parent, threshold=args.threshold,
                           drop_rate=args.drop_rate, dup_rate=args.dup_rate,
                           delay_ms=args.delay_ms, slots=args.slots,
                           mtu=args.mtu,
                           window_bytes=args.window_bytes, max_members=args.max_members,
                           member_timeout_s=args.member_timeout, help_after_s=args.help_after,
                           switch_id=args.switch_id, member_id=args.member_id,
                           job_id=args.job_id, token=args.token, seed=args.seed,
                           data_plane=args.data_plane)
        daemon = SwitchDaemon(cfg, report, args.stats_interval)
    except ValueError as e:  # an option out of range; --data-plane native where it is not built
        print(f"gmi-drl switch: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the address: in use, not this host's, or not resolvable
        where = f"--bind {args.bind[0]}:{args.bind[1]}" + (
            f" / --parent {args.parent[0]}:{args.parent[1]}" if args.parent else "")
        print(f"gmi-drl switch: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    say("listening on {}:{}".format(*daemon.address))
    print(f"data plane: {daemon.data_plane}", file=sys.stderr, flush=True)
    print(f"mtu: {daemon.mtu}", file=sys.stderr, flush=True)
    try:
        daemon.serve_forever()
    finally:
        say(json.dumps(daemon.stats(), sort_keys=True))
        daemon.close()
    return 0
