#!/usr/bin/env bash
# Prints the guest suite's per-I/O figures (tests/guest/run.sh --measure)
# as a table: kicks (the daemon's count), interrupts and CPU time (the
# guest's) per I/O, under fio randread 4k at QD1 and QD32, per
# configuration. TCG figures: count them, do not time them.
set -euo pipefail
f="${1:-target/guest/measure.txt}"
[ -s "$f" ] || { echo "guest-report: no figures in $f"; exit 0; }
echo
echo "Notifications per I/O in the guest (QEMU TCG; fio randread 4k, RAM LUN):"
printf '  %-10s %-5s %12s %12s %18s\n' config QD kicks/IO irqs/IO "guest CPU us/IO"
while read -r label qd rest; do
    k=$(echo "$rest" | sed -n 's/.*kicks_per_io=\([0-9.]*\).*/\1/p')
    i=$(echo "$rest" | sed -n 's/.*irqs_per_io=\([0-9.]*\).*/\1/p')
    c=$(echo "$rest" | sed -n 's/.*guest_cpu_us_per_io=\([0-9.]*\).*/\1/p')
    printf '  %-10s %-5s %12s %12s %18s\n' "$label" "${qd#qd}" "$k" "$i" "$c"
done < "$f"
