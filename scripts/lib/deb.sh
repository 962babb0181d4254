# shellcheck shell=bash
# Sourced by scripts/build-deb.sh and scripts/deb-test.sh: where the
# Debian package is, run from the top of the work tree.

# deb_target_dir: cargo's target directory (CARGO_TARGET_DIR or the
# configuration's, as cargo itself resolves it).
deb_target_dir() {
    cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

# deb_version: the workspace's version, as Debian writes it (a '-' of a
# pre-release becomes '~', which sorts before the release).
deb_version() {
    local v
    v=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
    [ -n "$v" ] || return 1
    echo "${v//-/\~}"
}

# deb_path TARGET_DIR: the package build-deb.sh makes.
deb_path() {
    echo "$1/deb/sqcq_$(deb_version)_$(dpkg --print-architecture).deb"
}
