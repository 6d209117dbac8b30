#!/bin/sh
# The producer's scripted agent, run inside its sandbox (lw-sandbox exec).
# It changes the contract (its scope: it owns contract/**) and its own side
# of it, commits, and announces the change to the consumer through the
# mediated mailbox.
set -eu
cd /work/repo
sed -i 's/"name"/"full_name"/g' contract/user.schema.json
sed -i 's/"name"/"full_name"/' producer/emit.sh
git commit -qam "contract: user.name is now user.full_name"
printf 'producer: renamed name to full_name in the contract and in producer/emit.sh, committed %s\n' "$(git rev-parse --short HEAD)"
id=$(lw-post --kind contract-change --to consumer \
    --subject "user.name is now user.full_name" \
    --ref contract/user.schema.json \
    "The user record's field 'name' is renamed to 'full_name' (commit $(git rev-parse --short HEAD)). Consumers must read the new field.")
printf 'producer: posted contract-change %s\n' "$id"
