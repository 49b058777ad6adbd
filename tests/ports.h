/*
 * tests/ports.h: TCP ports for the tests that start peers on 127.0.0.1 (or
 * ::1), picked so that tests running side by side (`make -j2 check`) never
 * share one.
 *
 * The rules, which tests/ports.sh follows too for the scenario scripts:
 *   - ports come from below the kernel's ephemeral range
 *     (/proc/sys/net/ipv4/ip_local_port_range), so that no outgoing
 *     connection of another test can take one between picking and binding;
 *   - never meshtrain's default port and the 255 after it (runs started
 *     by hand, benchmarks);
 *   - in blocks of TEST_PORTS_MAX ports whose first port is a multiple of
 *     TEST_PORTS_MAX; a block belongs to whoever holds an flock(2) on the
 *     file ${TMPDIR:-/tmp}/meshtrain-test-ports/FIRSTPORT;
 *   - a block is taken only when every port asked for binds (wildcard
 *     address, IPv4 and IPv6) at the time of picking.
 * A process that ignores the rules (not one of ours) can still take a port.
 */
#ifndef MESH_TESTS_PORTS_H
#define MESH_TESTS_PORTS_H

#include <stdint.h>

#define TEST_PORTS_MAX 16

/*
 * n (1..TEST_PORTS_MAX) consecutive free ports; returns the first, or 0 when
 * no block is free. The block stays this process's until the next call or
 * its exit (forked children share the hold; exec'd programs do not).
 */
uint16_t test_ports_pick(int n);

/*
 * 1 when msg (an error message of a rank's start) says that a port was in
 * use: another process took it after the pick.
 */
int test_ports_clash(const char *msg);

#endif
