#!/usr/bin/env bash
# A Debian 11 (bullseye: glibc 2.31, Python 3.9) root made with debootstrap, for the test that
# installs probing's manylinux wheel on a glibc older than this machine's and debugs a job
# there (tests/integration/test_wheel_old_glibc.py). About 270 MB, made in a minute or two.
#
#   tools/old_glibc_root.sh          # into $PROBING_OLD_GLIBC_ROOT, or .old-glibc-root/ in the checkout
#
# As root (debootstrap unpacks packages owned by root): debootstrap itself is installed with
# apt-get where missing. A second run with the root complete does nothing (a stamp holds this
# script's hash).
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
root="${PROBING_OLD_GLIBC_ROOT:-$checkout/.old-glibc-root}"
mirror="${PROBING_OLD_GLIBC_MIRROR:-http://deb.debian.org/debian}"
deadline_s="${PROBING_OLD_GLIBC_TIMEOUT:-600}"
stamp="$root/.installed"
want_stamp="$(sha256sum "$0" | cut -c1-16)"

# shellcheck source=tools/common.sh
. "$checkout/tools/common.sh"
if stamp_current "$stamp" "$want_stamp"; then
    exit 0
fi
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap)"
install_tool debootstrap "$deadline_s"
fresh_folder "$root" .probing-old-glibc-root PROBING_OLD_GLIBC_ROOT
timeout "$deadline_s" debootstrap --variant=minbase --include=python3,python3-venv \
    bullseye "$root" "$mirror" > "$root.log" 2>&1 \
    || fail "debootstrap of bullseye from $mirror failed (its log: $root.log)"
rm -f "$root.log"
echo "$want_stamp" > "$stamp"
