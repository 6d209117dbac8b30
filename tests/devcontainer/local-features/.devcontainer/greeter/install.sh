#!/bin/sh
set -eu
mkdir -p "$TARGET_DIR"
echo "$GREETING" > "$TARGET_DIR/greeting"
