#!/bin/sh
# tests/mesh_launch.sh: peers started by other launchers join the same way.
# The rank and size come from the environment each launcher sets: Open MPI's
# mpirun (OMPI_COMM_WORLD_RANK/SIZE; skipped without mpirun), Slurm's srun
# (SLURM_PROCID/NTASKS/JOB_ID, set by hand here as srun would) and PMI
# (PMI_RANK/SIZE). A hostfile in Horovod syntax, a shared 0600 secret file.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 5
BENCH="--op all -b 7 -e 70K -f 10 -n 2 -w 1"
secret=$TMP/secret
make_secret "$secret"

# env_pair NAME RANKVAR SIZEVAR [EXTRA=VAL]: two peers by hand, the rank
# and size only in the environment.
env_pair() {
    name=$1
    take_ports 2
    port=$PORT
    printf 'localhost:2 # Horovod syntax\n' > "$TMP/hosts"
    for r in 0 1; do
        env "$2=$r" "$3=2" ${4:+"$4"} "$MESHBENCH" --hostfile "$TMP/hosts" \
            --port "$port" --secret-file "$secret" $BENCH \
            > "$TMP/$name.$r.log" 2>&1 &
        eval "p$r=\$!"
        T_PIDS="$T_PIDS $!"
    done
    wait_exit "$p0" 60
    RC0=$EXIT_CODE
    wait_exit "$p1" 60
    RC1=$EXIT_CODE
}

env_pair slurm SLURM_PROCID SLURM_NTASKS SLURM_JOB_ID=4242
t_ok $([ $RC0 -eq 0 ] && [ $RC1 -eq 0 ] &&
       grep -q "rank 1 of 2 .*job slurm-4242" "$TMP/slurm.1.log"; echo $?) \
    "Slurm-style environment: both ranks join and run, job id from \
SLURM_JOB_ID (exit $RC0 $RC1)"
[ $RC0 -eq 0 ] || t_show "$TMP/slurm.0.log"

env_pair pmi PMI_RANK PMI_SIZE
t_ok $([ $RC0 -eq 0 ] && [ $RC1 -eq 0 ]; echo $?) \
    "PMI environment: both ranks join and run (exit $RC0 $RC1)"

# A size that disagrees with the hostfile is refused before joining.
SLURM_PROCID=0 SLURM_NTASKS=3 "$MESHBENCH" -H localhost:2 \
    --secret-file "$secret" $BENCH > "$TMP/size.log" 2>&1
rc=$?
t_ok $([ $rc -eq 1 ] && grep -q "world size mismatch.*SLURM_NTASKS=3" \
       "$TMP/size.log"; echo $?) \
    "SLURM_NTASKS=3 against 2 slots: exit 1, mismatch named (exit $rc)"

if command -v mpirun >/dev/null 2>&1; then
    take_ports 2
    port=$PORT
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 \
        "$MESHBENCH" -H localhost:2 --port "$port" --secret-file "$secret" \
        $BENCH > "$TMP/mpirun.log" 2>&1
    rc=$?
    t_ok $rc "mpirun -np 2: both ranks join and run (exit $rc)"
    [ $rc -eq 0 ] || t_show "$TMP/mpirun.log"
    rows=$(grep -Ec '^ +(pingpong|stream) ' "$TMP/mpirun.log")
    t_ok $([ "$rows" -eq 10 ]; echo $?) "mpirun: rank 0's table has 10 rows \
($rows)"
else
    t_skip "mpirun not installed (openmpi-bin)"
    t_skip "mpirun not installed (openmpi-bin)"
fi
t_done
