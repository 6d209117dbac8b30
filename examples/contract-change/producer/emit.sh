#!/bin/sh
# The producer side of the contract: prints one user record.
printf '{"id": 1, "name": "Ada Lovelace"}\n'
