#!/bin/sh
# tests/train_bind.sh: more --threads than the CPUs --bind-to gave a rank is
# warned about (the threads take turns on the bound CPUs: 15 times slower
# with 2 threads on 1 CPU), and not when they fit. Rank 0 of a world of 2
# binds before it reads its data; a data folder that does not exist then
# ends it at once, so no peer and no training are needed.
. "${top_srcdir:-$(dirname "$0")/..}/tests/train_lib.sh"

t_plan 3
take_ports 2 || exit 99
ARGS="-H localhost:2 --rank 0 --port $PORT --insecure \
--data cifar10:$TMP/none"
ncpu=$(nproc)
online=$(getconf _NPROCESSORS_ONLN)

# shellcheck disable=SC2086
timeout 20 "$MESHTRAIN" $ARGS --bind-to cores --threads $((ncpu + 1)) \
    > "$TMP/cores.log" 2>&1
grep -q "bound to CPU" "$TMP/cores.log" &&
    grep -Eq "warning: --threads $((ncpu + 1)), but --bind-to cores bound" \
        "$TMP/cores.log"
t_ok $? "--bind-to cores, --threads $((ncpu + 1)): warned"
grep -E "warning: --threads" "$TMP/cores.log" | sed 's/^/# /'

# --bind-to auto (the default) binds 2 ranks when all CPUs are ours.
if [ "$ncpu" -ge 2 ] && [ "$ncpu" -eq "$online" ]; then
    # shellcheck disable=SC2086
    timeout 20 "$MESHTRAIN" $ARGS --threads 2 > "$TMP/auto.log" 2>&1
    grep -Eq "warning: --threads 2, but --bind-to auto bound this rank to" \
        "$TMP/auto.log"
    t_ok $? "--bind-to auto (default), --threads 2: warned"
    grep -E "warning: --threads" "$TMP/auto.log" | sed 's/^/# /'
else
    t_skip "--bind-to auto binds nothing here ($ncpu of $online CPUs ours)"
fi

# A share that fits: no warning.
# shellcheck disable=SC2086
timeout 20 "$MESHTRAIN" $ARGS --bind-to cores --threads 1 \
    > "$TMP/fits.log" 2>&1
! grep -q "warning: --threads" "$TMP/fits.log"
t_ok $? "--bind-to cores, --threads 1: no warning"
t_done
