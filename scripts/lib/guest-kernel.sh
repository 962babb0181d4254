# shellcheck shell=bash
# Sourced by the guest suite's builders (scripts/build-guest-modules.sh,
# tests/guest/build-initramfs.sh, scripts/guest-test.sh): which kernel the
# guest runs.
#
# The series is $SQCQ_GUEST_KERNEL (scripts/guest-test.sh --kernel):
#   6.1   Debian 12's default kernel (linux-image-amd64), the default
#   6.12  Debian 12's 6.12 line (linux-image-6.12-amd64)

# guest_series: the series asked for
guest_series() {
    case "${SQCQ_GUEST_KERNEL:-6.1}" in
        6.1|6.12) echo "${SQCQ_GUEST_KERNEL:-6.1}" ;;
        *) echo "unknown guest kernel series '${SQCQ_GUEST_KERNEL}' (6.1 or 6.12)" >&2; return 1 ;;
    esac
}

# guest_image_package SERIES: Debian's package of that series' kernel
guest_image_package() {
    case "$1" in 6.1) echo linux-image-amd64 ;; *) echo "linux-image-$1-amd64" ;; esac
}

# guest_kver SERIES: the newest installed kernel release of SERIES with
# both a vmlinuz and a module tree, or nothing
guest_kver() {
    local d kver=""
    # shellcheck disable=SC2012 # kernel release names
    for d in $(ls -1 /lib/modules 2>/dev/null | sort -V); do
        case "$d" in "$1".*) ;; *) continue ;; esac
        [ -r "/boot/vmlinuz-$d" ] && [ -r "/lib/modules/$d/modules.dep" ] && kver="$d"
    done
    echo "$kver"
}
