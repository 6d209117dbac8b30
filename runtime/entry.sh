#!/bin/sh
# lw-entry: first process of a loopwright sandbox.
#
# With arguments it runs them (exec, so their status is the container's).
# Without, it waits for commands run through 'docker exec' / 'lw-sandbox exec'
# and exits 0 on SIGTERM, so 'lw-sandbox stop' is immediate instead of
# waiting out Docker's kill timeout.
if [ "$#" -gt 0 ]; then
    exec "$@"
fi
trap 'exit 0' TERM INT
while :; do
    sleep 3600 &
    wait $!
done
