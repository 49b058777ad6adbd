#!/bin/sh
# tests/mesh_secret.sh: how the job secret reaches the peers.
#  - a secret file more open than 0600 is refused, naming the file;
#  - neither a secret nor --insecure: an error that says how to fix it;
#  - --insecure runs, and says so in the log;
#  - peers started by hand with the same 0600 file join; with different
#    secrets they do not (join failure, exit 2);
#  - under meshrun the per-job secret never shows in argv or environment.
. "${top_srcdir:-$(dirname "$0")/..}/tests/mesh_lib.sh"

t_plan 10
BENCH="--op pingpong -b 8 -e 1K -f 8 -n 2 -w 1"

secret=$TMP/secret
make_secret "$secret"
chmod 644 "$secret"
"$MESHBENCH" -H localhost:2 --rank 0 --secret-file "$secret" $BENCH \
    > "$TMP/perm.log" 2>&1
rc=$?
t_ok $([ $rc -eq 1 ] && grep -q "secret file $secret has mode 0644, more open than 0600" "$TMP/perm.log"; echo $?) \
    "secret file with mode 0644 refused, exit 1, file named (exit $rc)"
t_show "$TMP/perm.log" 2
chmod 600 "$secret"

"$MESHBENCH" -H localhost:2 --rank 0 $BENCH > "$TMP/none.log" 2>&1
rc=$?
t_ok $([ $rc -eq 1 ] && grep -q "no job secret" "$TMP/none.log" &&
       grep -q -- "--secret-file" "$TMP/none.log" &&
       grep -q -- "--insecure" "$TMP/none.log"; echo $?) \
    "no secret and no --insecure: exit 1 with the fix (exit $rc)"
t_show "$TMP/none.log" 2

# pair NAME ARGS0 -- ARGS1: two peers by hand; sets RC0 RC1.
pair() {
    name=$1
    a0=$2
    a1=$3
    take_ports 2 || return 1
    port=$PORT
    # shellcheck disable=SC2086
    bg "$MESHBENCH" -H localhost:2 --rank 0 --port "$port" $a0 $BENCH \
        > "$TMP/$name.0.log" 2>&1
    p0=$BG_PID
    # shellcheck disable=SC2086
    bg "$MESHBENCH" -H localhost:2 --rank 1 --port "$port" $a1 $BENCH \
        > "$TMP/$name.1.log" 2>&1
    p1=$BG_PID
    wait_exit $p0 60
    RC0=$EXIT_CODE
    wait_exit $p1 60
    RC1=$EXIT_CODE
}

pair insecure "--insecure" "--insecure"
t_ok $([ $RC0 -eq 0 ] && [ $RC1 -eq 0 ]; echo $?) \
    "--insecure: both peers run (exit $RC0 $RC1)"
t_ok $(grep -q "without authentication" "$TMP/insecure.0.log" &&
       grep -q "without authentication" "$TMP/insecure.1.log"; echo $?) \
    "--insecure is logged on every peer"

pair same "--secret-file $secret" "--secret-file $secret"
t_ok $([ $RC0 -eq 0 ] && [ $RC1 -eq 0 ]; echo $?) \
    "by hand with the same 0600 secret file: both peers run (exit $RC0 $RC1)"
[ $RC0 -eq 0 ] || t_show "$TMP/same.0.log"
t_ok $(grep -q "without authentication" "$TMP/same.0.log"; [ $? -ne 0 ]; echo $?) \
    "with a secret, nothing says unauthenticated"

other=$TMP/other
make_secret "$other"
pair wrong "--secret-file $secret --join-timeout 3" \
           "--secret-file $other --join-timeout 3"
t_ok $([ $RC0 -eq 2 ] && [ $RC1 -eq 2 ]; echo $?) \
    "different secrets: neither joins, exit 2 (exit $RC0 $RC1)"
cat "$TMP/wrong.0.log" "$TMP/wrong.1.log" | grep -Ei "secret|auth|hmac" |
    head -n 3 | sed 's/^/# /'
t_ok $(cat "$TMP/wrong.0.log" "$TMP/wrong.1.log" | grep -Eqi "secret|auth|hmac"; echo $?) \
    "the refusal is logged as an authentication failure"

# meshrun: a job that lives long enough to look at its ranks.
take_ports 2
port=$PORT
bg "$MESHRUN" -np 2 -- "$MESHBENCH" --port "$port" --op pingpong -b 8 -e 8 \
    -n 1000000000 -w 0 > "$TMP/run.log" 2>&1
mr=$BG_PID
wait_for "$TMP/run.log" '^\[0\] +pingpong|^\[0\] # meshbench' 30
leak=0
n=0
for c in $(ps -o pid= --ppid "$mr"); do
    n=$((n + 1))
    if tr '\0' '\n' < "/proc/$c/cmdline" | grep -Eq '[0-9a-f]{64}' ||
       tr '\0' '\n' < "/proc/$c/environ" | grep -Eq '[0-9a-f]{64}'; then
        leak=1
    fi
    tr '\0' '\n' < "/proc/$c/environ" | grep -q '^MESHTRAIN_SECRET_FD=' ||
        leak=1
done
t_ok $([ $n -eq 2 ] && [ $leak -eq 0 ]; echo $?) \
    "meshrun: the secret is in no rank's argv or environment, only a pipe \
fd ($n ranks looked at)"
kill -TERM "$mr"
wait_exit "$mr" 15
t_ok $([ "$EXIT_CODE" -eq 143 ] && ! grep -Eq '[0-9a-f]{64}' "$TMP/run.log"; echo $?) \
    "meshrun forwards SIGTERM and exits 143; no secret in its output \
(exit $EXIT_CODE)"
t_done
