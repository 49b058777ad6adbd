#!/bin/sh
# tests/verbs/lib.sh: boot Debian's stock kernel under QEMU (TCG) with
# Soft-RoCE (rdma_rxe), the host's root shared read-only over virtio-9p, and
# run one command inside it. Sourced by the lane's scripts.
#
#   verbs_prepare            fetch + extract the kernel, build the initramfs
#                            (cached in $VERBS_CACHE); 0 ok, else prints why
#   verbs_boot SCRIPT LOG    boot, run "sh SCRIPT" chrooted into the host's
#                            root, write the console to LOG; returns when
#                            the guest powers off (timeout $VERBS_TIMEOUT s,
#                            default 1500: the one-guest lane ran 900+ s
#                            in CI on 2 cores)
#
# The cache lives outside the source tree (default /var/tmp/meshtrain-verbs-
# UID). Only Debian's registry is used: `apt-get download` of the kernel
# package (never installed as the host's kernel).

VERBS_CACHE=${VERBS_CACHE:-/var/tmp/meshtrain-verbs-$(id -u)}
VERBS_TIMEOUT=${VERBS_TIMEOUT:-1500}
VERBS_MEM=${VERBS_MEM:-2048}
VERBS_CPUS=${VERBS_CPUS:-2}

# The modules the guest loads (their dependencies come first, by modinfo).
# crc32_generic: rdma_rxe asks the crypto API for "crc32" at device
# creation, which modinfo depends does not list.
# virtio_net: the link between two guests (the multi-host path).
VERBS_MODULES="virtio_pci 9pnet_virtio 9p dummy veth virtio_net crc32_generic rdma_rxe ib_uverbs"

verbs_why=

# The kernel package's file name (the versioned one linux-image-amd64
# depends on).
verbs_kernel_pkg() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n 1
}

verbs_fetch_kernel() {
    pkg=$(verbs_kernel_pkg)
    if [ -z "$pkg" ]; then
        verbs_why="apt-cache knows no linux-image-amd64 (apt-get update?)"
        return 1
    fi
    mkdir -p "$VERBS_CACHE/deb" || return 1
    if ! ls "$VERBS_CACHE/deb/$pkg"_*.deb >/dev/null 2>&1; then
        (cd "$VERBS_CACHE/deb" && apt-get download "$pkg") \
            >"$VERBS_CACHE/download.log" 2>&1 || {
            verbs_why="apt-get download $pkg failed (see $VERBS_CACHE/download.log)"
            return 1
        }
    fi
    deb=$(ls "$VERBS_CACHE/deb/$pkg"_*.deb | head -n 1)
    if [ ! -d "$VERBS_CACHE/root/boot" ]; then
        rm -rf "$VERBS_CACHE/root"
        dpkg -x "$deb" "$VERBS_CACHE/root" || {
            verbs_why="dpkg -x $deb failed"
            return 1
        }
    fi
    VERBS_KVER=$(ls "$VERBS_CACHE/root/lib/modules" | head -n 1)
    VERBS_KERNEL=$VERBS_CACHE/root/boot/vmlinuz-$VERBS_KVER
    [ -f "$VERBS_KERNEL" ] || { verbs_why="no vmlinuz in $deb"; return 1; }
}

# Path of module $1 (dashes and underscores are the same) in the tree,
# through an index built once ("name path" lines).
verbs_mod_path() {
    idx=$VERBS_CACHE/modules-$VERBS_KVER.idx
    if [ ! -s "$idx" ]; then
        find "$VERBS_CACHE/root/lib/modules/$VERBS_KVER" -name '*.ko' |
            awk '{ n = $0; sub(/.*\//, "", n); sub(/\.ko$/, "", n);
                   gsub(/-/, "_", n); print n, $0 }' >"$idx.tmp" &&
            mv "$idx.tmp" "$idx"
    fi
    awk -v n="$(echo "$1" | tr - _)" '$1 == n { print $2; exit }' "$idx"
}

# Dependencies of a .ko from its modinfo section ("depends=a,b").
verbs_mod_deps() {
    tr '\0' '\n' <"$1" | sed -n 's/^depends=//p' | head -n 1 | tr , ' '
}

# Append module $1 after its dependencies to $VERBS_ORDER (depth first).
verbs_mod_add() {
    case " $VERBS_ORDER " in *" $1 "*) return 0 ;; esac
    p=$(verbs_mod_path "$1")
    [ -n "$p" ] || { verbs_why="module $1 not in the kernel package"; return 1; }
    for d in $(verbs_mod_deps "$p"); do
        verbs_mod_add "$d" || return 1
    done
    VERBS_ORDER="$VERBS_ORDER $1"
}

verbs_build_initramfs() {
    bb=$(command -v busybox)
    [ -n "$bb" ] || { verbs_why="busybox not found (apt-get install busybox-static)"; return 1; }
    if ldd "$bb" >/dev/null 2>&1; then
        verbs_why="$bb is not static (apt-get install busybox-static)"
        return 1
    fi
    # Named after what goes in, so that a changed list rebuilds it.
    sum=$(echo "$VERBS_MODULES init-4" | cksum | cut -d' ' -f1)
    VERBS_INITRD=$VERBS_CACHE/initramfs-$VERBS_KVER-$sum.cpio.gz
    [ -f "$VERBS_INITRD" ] && return 0
    VERBS_ORDER=
    for m in $VERBS_MODULES; do
        verbs_mod_add "$m" || return 1
    done
    d=$VERBS_CACHE/initramfs
    rm -rf "$d"
    mkdir -p "$d/bin" "$d/mod" "$d/proc" "$d/sys" "$d/dev" "$d/mnt" || return 1
    cp "$bb" "$d/bin/busybox"
    for a in sh mount umount insmod mkdir chroot poweroff cat echo sleep; do
        ln -s busybox "$d/bin/$a"
    done
    : >"$d/mod/order"
    for m in $VERBS_ORDER; do
        cp "$(verbs_mod_path "$m")" "$d/mod/$m.ko"
        echo "$m" >>"$d/mod/order"
    done
    cat >"$d/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mod/order); do
    insmod /mod/$m.ko || echo "VERBS-GUEST: insmod $m failed"
done
script=$(sed -n 's/.*verbs_script=\([^ ]*\).*/\1/p' /proc/cmdline)
if mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /mnt; then
    mount -t proc proc /mnt/proc
    mount -t sysfs sys /mnt/sys
    mount -t devtmpfs dev /mnt/dev
    # The guest gets a fresh /tmp, but a tree the lane runs from may live
    # under the host's /tmp (a CI clone): keep those folders visible.
    keep=$(sed -n 's/.*verbs_keep=\([^ ]*\).*/\1/p' /proc/cmdline)
    if [ -n "$keep" ]; then
        mkdir -p /hold
        mount -o bind /mnt/tmp /hold
    fi
    mount -t tmpfs tmp /mnt/tmp
    for k in $(echo "$keep" | tr ',' ' '); do
        mkdir -p "/mnt/tmp/$k"
        mount -o bind "/hold/$k" "/mnt/tmp/$k" ||
            echo "VERBS-GUEST: cannot keep /tmp/$k"
    done
    mount -t tmpfs run /mnt/run
    echo "VERBS-GUEST: running $script ($(cut -d' ' -f1 /proc/uptime) s after boot)"
    chroot /mnt /bin/sh -c "cd / && sh $script"
    echo "VERBS-GUEST: exit $?"
else
    echo "VERBS-GUEST: cannot mount the host root over 9p"
fi
poweroff -f
INIT
    chmod +x "$d/init"
    (cd "$d" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) \
        >"$VERBS_INITRD.tmp" && mv "$VERBS_INITRD.tmp" "$VERBS_INITRD"
}

verbs_prepare() {
    command -v qemu-system-x86_64 >/dev/null 2>&1 || {
        verbs_why="qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
        return 1
    }
    verbs_fetch_kernel || return 1
    verbs_build_initramfs || return 1
}

# verbs_boot SCRIPT LOG [NIC...]: TCG only (KVM guests hang at boot on
# our machines).
verbs_boot() {
    vb_script=$1 vb_log=$2
    shift 2
    [ $# -gt 0 ] || set -- -nic none
    timeout "$VERBS_TIMEOUT" qemu-system-x86_64 -accel tcg -nographic \
        -no-reboot -m "$VERBS_MEM" -smp "$VERBS_CPUS" -cpu max \
        -kernel "$VERBS_KERNEL" -initrd "$VERBS_INITRD" \
        -append "console=ttyS0 panic=-1 verbs_script=$vb_script verbs_keep=${VERBS_KEEP:-}" \
        -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
        -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
        "$@" </dev/null >"$vb_log" 2>&1
}

# verbs_boot_pair SCRIPT0 LOG0 SCRIPT1 LOG1: two guests, two "hosts", with
# one virtio-net link between them (a QEMU socket netdev on loopback): each
# has its own kernel, rxe and IP stack. (Network namespaces inside one guest
# do not work for this: the 6.1 kernel's rdma_rxe routes and listens in the
# initial namespace only.) The link's port comes from take_ports
# (tests/ports.sh, sourced by the caller).
#
# A guest that has not started its job $VERBS_BOOT_WAIT s (default 180)
# after boot began leaves its partner waiting on a peer that never comes
# (seen once in CI, on a loaded machine): both are stopped. verbs_boot_pair
# returns 2, with verbs_why naming the guest, when a guest never started
# its job; 0 otherwise. Each guest's QEMU exit status is in verbs_qrc0 and
# verbs_qrc1.
verbs_boot_pair() {
    take_ports 1 || return 1
    vb_port=$PORT
    verbs_why=
    verbs_qrc0= verbs_qrc1=
    verbs_boot "$3" "$4" -netdev "socket,id=n0,listen=127.0.0.1:$vb_port" \
        -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:02 &
    vb_pid1=$!
    sleep 1
    verbs_boot "$1" "$2" -netdev "socket,id=n0,connect=127.0.0.1:$vb_port" \
        -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:01 &
    vb_pid0=$!
    vb_t0=$(date +%s)
    vb_rc=0
    while kill -0 "$vb_pid0" 2>/dev/null || kill -0 "$vb_pid1" 2>/dev/null; do
        sleep 2
        vb_t=$(($(date +%s) - vb_t0))
        [ "$vb_t" -ge "${VERBS_BOOT_WAIT:-180}" ] || continue
        [ "$vb_rc" = 0 ] || continue
        if ! verbs_started "$2" "$4" "had not started its job after $vb_t s"; then
            vb_rc=2
            # Both go: the partner's job waits on this one.
            pkill -f "verbs_script=$1 "
            pkill -f "verbs_script=$3 "
        fi
    done
    wait "$vb_pid0"
    verbs_qrc0=$?
    wait "$vb_pid1"
    verbs_qrc1=$?
    # One that died early, while the other ran out its waits.
    if [ "$vb_rc" = 0 ] && ! verbs_started "$2" "$4" "never started its job"; then
        vb_rc=2
    fi
    return "$vb_rc"
}

# verbs_started LOG0 LOG1 WHAT: 0 when both guests' consoles show their job
# started; else 1, with "guest R WHAT" in verbs_why for each that did not.
verbs_started() {
    vs_rc=0
    vs_r=0
    for vs_l in "$1" "$2"; do
        if ! grep -q "VERBS-GUEST: \(running\|exit\)" "$vs_l" 2>/dev/null; then
            verbs_why="${verbs_why:+$verbs_why; }guest $vs_r $3"
            vs_rc=1
        fi
        vs_r=$((vs_r + 1))
    done
    return "$vs_rc"
}
