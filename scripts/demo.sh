#!/bin/sh
# scripts/demo.sh: the first real job on a fresh machine. Starts a local
# 4-peer mesh with meshrun and runs meshbench (ping-pong latency and
# streaming throughput between pairs of ranks, every byte checked), then
# prints rank 0's table. Run it from the build directory, or set
# MESHTRAIN_BUILDDIR. Extra arguments go to meshbench.
#   scripts/demo.sh [MESHBENCH-ARGS...]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
builddir=${MESHTRAIN_BUILDDIR:-}
if [ -z "$builddir" ]; then
    if [ -x ./meshrun ]; then builddir=.; else builddir=$here; fi
fi
meshrun=$builddir/meshrun
meshbench=$builddir/meshbench
for p in "$meshrun" "$meshbench"; do
    [ -x "$p" ] || { echo "demo.sh: $p is not built (run make first)" >&2
                     exit 1; }
done

# A base port with 4 free ports after it (the default 29400 if free).
port=29400
if command -v /usr/bin/python3 >/dev/null 2>&1; then
    port=$(/usr/bin/python3 - <<'PY'
import random, socket
for base in [29400] + [random.randrange(20000, 60000) for _ in range(100)]:
    try:
        socks = []
        for p in range(base, base + 4):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks: s.close()
    print(base); break
PY
)
fi

echo "demo: 4 peers on this machine, meshrun -np 4 -- meshbench --port $port"
echo "demo: each rank pairs with another (0-1, 2-3); every byte is verified"
"$meshrun" -np 4 -- "$meshbench" --port "$port" --op all -b 8 -e 16M -f 4 \
    -n 10 -w 2 "$@"
rc=$?
if [ $rc -eq 0 ]; then
    echo "demo: ok: 4 peers joined an authenticated mesh (secret made by"
    echo "      meshrun for this job) and exchanged checked data"
else
    echo "demo: FAILED with exit code $rc (see meshbench(1), EXIT STATUS)" >&2
fi
exit $rc
