#!/bin/sh
# Both sides agree on the contract when the greeting names the user.
out=$(./producer/emit.sh | ./consumer/greet.sh)
[ "$out" = "Hello, Ada Lovelace" ] || { echo "contract broken: got '$out'" >&2; exit 1; }
echo "ok: $out"
