#!/bin/sh
# The producer's scripted agent, run inside its sandbox (lw-sandbox exec).
# It changes the contract and its own side of it, commits, and announces the
# change through the mediated mailbox.
set -eu
cd /work/repo
sed -i 's/"name"/"full_name"/g' contract/user.schema.json
sed -i 's/"name"/"full_name"/' producer/emit.sh
git commit -qam "contract: user.name is now user.full_name"
lw-post --kind contract-change \
    --subject "user.name is now user.full_name" \
    --ref contract/user.schema.json \
    "The user record's field 'name' is renamed to 'full_name' (commit $(git rev-parse --short HEAD)). Consumers must read the new field."
