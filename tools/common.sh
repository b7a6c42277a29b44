# Sourced by the tools/ scripts that make something once for the tests (pythons.sh,
# old_glibc_root.sh): their failure said with their name, the stamp that makes a second run do
# nothing, and a Debian package's tool installed where missing, every apt-get step bounded.
script="tools/$(basename "$0")"

fail() {
    echo "$script: $*" >&2
    exit 1
}

# stamp_current STAMP_FILE WANTED: whether a previous run finished with the same stamp.
stamp_current() {
    [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]
}

# install_tool TOOL DEADLINE_S [ELSE]: the Debian package TOOL, as root, where TOOL is missing
# (apt-get update only when the install fails without it); ELSE: another way, said to a non-root user.
install_tool() {
    command -v "$1" > /dev/null && return 0
    [ "$(id -u)" = 0 ] || fail "needs $1: as root, apt-get install $1${3:+ ($3)}"
    echo "$script: installing $1" >&2
    timeout "$2" apt-get install -y -q "$1" > /dev/null \
        || { timeout "$2" apt-get update -q > /dev/null \
             && timeout "$2" apt-get install -y -q "$1" > /dev/null; } \
        || fail "apt-get install $1 failed"
}

# fresh_folder DIR MARKER VARIABLE: DIR emptied and made anew, with MARKER in it, only when this
# script made it before (MARKER) or it is empty: never wipe a folder someone named by mistake.
fresh_folder() {
    if [ -e "$1" ] && [ ! -e "$1/$2" ] && [ -n "$(ls -A "$1")" ]; then
        fail "$1 exists and was not made by this script: remove it or choose $3"
    fi
    rm -rf "$1"
    mkdir -p "$1" && touch "$1/$2"
}
