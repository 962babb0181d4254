#!/usr/bin/env bash
# Installs what the build and the tests need, idempotently: when
# everything is present this costs a few dpkg queries and nothing else.
set -euo pipefail

# Debian packages the test suite uses: spin (the models), gcc,
# qemu-system-common for qemu-storage-daemon, the vhost-user-blk peer of
# sqcq-bench's blk tests, qemu-utils for qemu-io (the image lock tests:
# QEMU and sqcqd must see each other's locks), python3-prometheus-client, Prometheus'
# reference parser that the metrics tests check sqcqd's endpoint with,
# systemd for systemd-socket-activate (the service tests pass sockets
# as a service manager does; util-linux's setpriv and unshare are always
# there), and librbd-dev, which the RBD backstore links (cargo feature
# rbd, on by default; scripts/ceph-cluster.sh installs the cluster's
# daemons when the tests start one); for the Debian package
# (scripts/build-deb.sh, scripts/deb-test.sh) dpkg-dev (dpkg-shlibdeps,
# strip), lintian, man-db (man -l), curl (a scrape of the metrics socket)
# and adduser (the package's postinst).
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "$0")/lib/packages.sh"
ensure_packages setup spin gcc qemu-system-common qemu-utils python3-prometheus-client systemd librbd-dev \
    dpkg-dev lintian man-db curl adduser

command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust (rustup) first" >&2; exit 1; }
