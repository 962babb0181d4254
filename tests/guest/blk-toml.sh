# Sourced by tests/guest/run.sh (--blk) and scripts/libvirt-test.sh.

# blk_toml DIR NUM_QUEUES: the configuration of the guest suite's two blk
# devices, sockets DIR/blk0.sock and DIR/blk1.sock: 64 MiB RAM disks, vda
# read-write with 512-byte blocks (serial sqcq-vda), vdb read-only with
# 4096-byte blocks (serial sqcq-vdb).
blk_toml() {
    local i ro bs
    for i in 0 1; do
        if [ "$i" = 0 ]; then ro=false bs=512; else ro=true bs=4096; fi
        printf '[[device]]\ntype = "blk"\nsocket-path = "%s/blk%s.sock"\nnum-queues = %s\n' "$1" "$i" "$2"
        printf '[[device.lun]]\nkind = "ram"\nsize = "64M"\nblock-size = %s\nread-only = %s\nserial = "sqcq-vd%s"\n' \
            "$bs" "$ro" "$(echo "$i" | tr 01 ab)"
    done
}
