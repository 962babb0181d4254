# Sourced by tests/guest/run.sh (--blk) and scripts/libvirt-test.sh.

# blk_toml DIR NUM_QUEUES [rbd|file]: the configuration of the guest suite's
# two blk devices, sockets DIR/blk0.sock and DIR/blk1.sock: 64 MiB RAM
# disks, vda read-write with 512-byte blocks (serial sqcq-vda), vdb
# read-only with 4096-byte blocks (serial sqcq-vdb). With "rbd", the disks
# are the 64 MiB images $rbd_prefix-vda and $rbd_prefix-vdb of the Ceph
# test cluster instead (tests/guest/lib.sh, rbd_setup); with "file", the
# files DIR/vda.img and DIR/vdb.img (the harness creates them, 64 MiB).
blk_toml() {
    local i ro bs name
    for i in 0 1; do
        if [ "$i" = 0 ]; then ro=false bs=512; else ro=true bs=4096; fi
        name="vd$(echo "$i" | tr 01 ab)"
        printf '[[device]]\ntype = "blk"\nsocket-path = "%s/blk%s.sock"\nnum-queues = %s\n' "$1" "$i" "$2"
        if [ "${3:-}" = rbd ]; then
            printf '[[device.lun]]\nkind = "rbd"\npool = "%s"\nimage = "%s"\nconf = "%s"\nid = "%s"\nkeyring = "%s"\n' \
                "$SQCQ_CEPH_POOL" "$rbd_prefix-$name" "$CEPH_CONF" "$SQCQ_CEPH_ID" "$SQCQ_CEPH_KEYRING"
        elif [ "${3:-}" = file ]; then
            printf '[[device.lun]]\nkind = "file"\npath = "%s/%s.img"\n' "$1" "$name"
        else
            printf '[[device.lun]]\nkind = "ram"\nsize = "64M"\n'
        fi
        printf 'block-size = %s\nread-only = %s\nserial = "sqcq-%s"\n' "$bs" "$ro" "$name"
    done
}
