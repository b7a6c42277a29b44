#!/usr/bin/env bash
# Fetch the drawing libraries of probing/cli/pictures/vendor/ again from the npm registry and check
# them against the digests in its README (a new version: change the table, then run this).
set -euo pipefail
vendor="$(cd "$(dirname "$0")/../probing/cli/pictures/vendor" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fetch() {  # PACKAGE@VERSION FILE-IN-PACKAGE LICENSE-IN-PACKAGE NAME
    (cd "$work" && npm pack --silent "$1" > /dev/null)
    mkdir -p "$work/$4"
    tar xzf "$work"/*.tgz -C "$work/$4" && rm "$work"/*.tgz
    cp "$work/$4/package/$2" "$vendor/"
    cp "$work/$4/package/$3" "$vendor/$4.LICENSE"
}
fetch d3@7.9.2 dist/d3.min.js LICENSE d3
fetch d3-flame-graph@5.0.0 dist/d3-flamegraph.umd.min.js LICENSE d3-flame-graph
fetch chart.js@4.6.1 dist/chart.umd.min.js LICENSE.md chart.js
cd "$vendor"
grep -E '^\| [a-z0-9.-]+\.js \|' README.md | awk -F'|' '{gsub(/ /, "", $2); gsub(/ /, "", $5); print $5 "  " $2}' | sha256sum -c -
