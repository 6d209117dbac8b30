#!/bin/sh
# lw-egress-entry: start squid in the foreground with the configuration
# given in LW_EGRESS_CONF.
#
# The root file system is read-only; the configuration goes to /dev/shm,
# the one writable place the engine makes afresh, with the same mode, on
# every start (a --tmpfs mount comes back root-owned 0755 on a restart with
# Docker 20.10, which would keep a restarted proxy from starting).  Squid
# runs as the unprivileged `proxy` user with every capability dropped; it
# logs each request to stdout (the engine keeps it: that is where denials
# are read from) and its own diagnostics to stderr.
# Without a configuration it refuses to start rather than fall back to
# squid's defaults.
set -eu
dir=/dev/shm/lw-egress
conf=$dir/squid.conf
if [ -z "${LW_EGRESS_CONF:-}" ]; then
    echo "lw-egress-entry: LW_EGRESS_CONF is empty; refusing to start without an allow-list configuration" >&2
    exit 78
fi
umask 077
mkdir -p "$dir"
printf '%s\n' "$LW_EGRESS_CONF" >"$conf"
squid -k parse -f "$conf" >/dev/null 2>"$dir/parse.log" || {
    cat "$dir/parse.log" >&2
    echo "lw-egress-entry: squid refused its configuration" >&2
    exit 78
}
exec squid -N -f "$conf"
