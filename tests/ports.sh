# shellcheck shell=sh disable=SC2034
# tests/ports.sh: TCP ports for the scenario scripts (sourced), by the rules
# of tests/ports.h that the C tests follow too: blocks of 16 ports below the
# kernel's ephemeral range (not meshtrain's default 29400..29655), each
# owned by whoever holds an flock on ${TMPDIR:-/tmp}/meshtrain-test-ports/
# FIRSTPORT. Two of our tests, run side by side, never get the same port;
# no outgoing connection takes one.
#
# take_ports N: set PORT to a base port P such that P..P+N-1 (N <= 16) were
# free when picked; the block stays ours (file descriptor 9 of this shell,
# inherited by the programs it starts) until the next call or the script's
# end, and while any program started on it still runs. Returns 1, PORT
# empty, when no block is free.
take_ports() {
    PORT=
    _fp_dir=${TMPDIR:-/tmp}/meshtrain-test-ports
    if [ ! -d "$_fp_dir" ]; then
        mkdir -p "$_fp_dir" 2>/dev/null && chmod 1777 "$_fp_dir" 2>/dev/null
    fi
    exec 9>&-
    # The probe finds a block nobody holds whose ports bind and lets go of
    # it; this shell then takes it unless another test was quicker.
    # Each probe starts one block on from the last (from where this shell's
    # pid points), so that a scenario never gets the ports of the one
    # before it.
    for _fp_try in 1 2 3 4 5 6 7 8 9 10; do
        _fp_calls=$((${_fp_calls:-0} + 1))
        # python3 from PATH where /usr/bin has none (a CUDA image's
        # Python may live in a virtual environment: tests/gpu/run.sh)
        _fp_py=/usr/bin/python3
        [ -x "$_fp_py" ] || _fp_py=python3
        _fp_out=$("$_fp_py" - "$1" "$_fp_dir" "$$" "$_fp_calls" <<'EOF'
import fcntl, os, socket, sys

n, folder = int(sys.argv[1]), sys.argv[2]
pid, calls = int(sys.argv[3]), int(sys.argv[4])
if not 1 <= n <= 16:
    sys.exit(1)

def span():
    lo, hi = 20000, 60000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            elo, ehi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return lo, hi
    above = (ehi + 16) // 16 * 16
    if elo >= lo + 64 * 16:
        return lo, elo
    if above + 64 * 16 <= 65536:
        return above, 65536
    return lo, hi

def free(port):
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        addr = ("::", port)
    except OSError:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        addr = ("0.0.0.0", port)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        return True
    except OSError:
        return False
    finally:
        s.close()

lo, hi = span()
nblocks = (hi - lo) // 16
k = (pid * 7919 + calls) % nblocks
for _ in range(nblocks):
    base = lo + k * 16
    k = (k + 1) % nblocks
    if base + 16 > 29400 and base < 29400 + 256:
        continue  # meshtrain's default ports: runs started by hand
    try:
        fd = os.open(os.path.join(folder, str(base)),
                     os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError:
            pass
    try:
        if all(free(p) for p in range(base, base + n)):
            print(base, "lock" if fd >= 0 else "nolock")
            sys.exit(0)
    finally:
        if fd >= 0:
            os.close(fd)
sys.exit(1)
EOF
        ) || return 1
        _fp_base=${_fp_out% *}
        # Where the lock folder or flock(1) is missing, the bind check
        # alone picks.
        if [ "${_fp_out#* }" != lock ] || ! command -v flock >/dev/null; then
            PORT=$_fp_base
            return 0
        fi
        exec 9>>"$_fp_dir/$_fp_base"
        if flock -n 9; then
            PORT=$_fp_base
            return 0
        fi
        exec 9>&-
    done
    return 1
}

# free_ports N: print such a base port, for callers that write
# port=$(free_ports N): the command substitution's subshell lets go of the
# block when it ends, so another test may pick it before the peers bind;
# take_ports keeps it.
free_ports() {
    take_ports "$1" && echo "$PORT"
}
