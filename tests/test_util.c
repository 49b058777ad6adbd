/* tests/test_util.c: the error, logging and host-memory helpers. */
#include "config.h"

#include "common/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static void *other_thread(void *arg)
{
    (void)arg;
    /* A fresh thread sees no message from another thread. */
    return (void *)(intptr_t)(strcmp(mesh_err_msg(-EINVAL),
                                     strerror(EINVAL)) == 0);
}

int main(void)
{
    pthread_t th;
    void *res;
    void *p = NULL;
    int rc;

    plan(7);
    rc = mesh_err(-EINVAL, "bad value %d", 42);
    ok(rc == -EINVAL, "mesh_err returns its code");
    ok(strcmp(mesh_err_msg(rc), "bad value 42") == 0, "message recorded");
    mesh_err_prefix(rc, "parsing %s", "x");
    ok(strcmp(mesh_err_msg(rc), "parsing x: bad value 42") == 0,
       "prefix adds context: %s", mesh_err_msg(rc));
    pthread_create(&th, NULL, other_thread, NULL);
    pthread_join(th, &res);
    ok(res != NULL, "messages are thread-local");
    errno = ENOENT;
    rc = mesh_err_errno("open %s", "/nope");
    ok(rc == -ENOENT && strstr(mesh_err_msg(rc), "No such file"),
       "errno message: %s", mesh_err_msg(rc));
    rc = mesh_host_alloc(12345, &p);
    ok(rc == 0 && p && ((uintptr_t)p % (uintptr_t)sysconf(_SC_PAGESIZE)) == 0,
       "host buffer is page-aligned");
    memset(p, 1, 12345);
    mesh_host_free(p, 12345);
    {
        uint64_t a = mesh_now_ns(), b = mesh_now_ns();
        ok(b >= a, "monotonic clock");
    }
    return done();
}
