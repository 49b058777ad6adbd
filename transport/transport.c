/* transport/transport.c: what every transport shares (names, options,
 * waits). */
#include "config.h"

#include "transport/transport.h"
#include "transport/base.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

const char *mesh_peer_name(const struct mesh_world *w, int r, char *buf,
                           size_t len)
{
    const struct mesh_peer *p;

    if (!w || r < 0 || r >= w->size) {
        snprintf(buf, len, "?");
        return buf;
    }
    p = &w->peers[r];
    if (strchr(p->host, ':'))
        snprintf(buf, len, "[%s]:%u", p->host, (unsigned)p->port);
    else
        snprintf(buf, len, "%s:%u", p->host, (unsigned)p->port);
    return buf;
}

int mesh_world_digest(const struct mesh_world *w, uint8_t md[32])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    char name[MESH_HOST_MAX + 16];
    unsigned int mdlen = 0;
    int ok;

    if (!ctx)
        return mesh_err(-ENOMEM, "EVP_MD_CTX_new failed");
    ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
    for (int r = 0; r < w->size && ok; r++) {
        mesh_peer_name(w, r, name, sizeof(name));
        ok = EVP_DigestUpdate(ctx, name, strlen(name) + 1) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == 32;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : mesh_err(-EIO, "SHA-256 of the rank layout failed");
}

const char *mesh_op_name(int op)
{
    static const char *names[] = {"none",           "p2p",       "allreduce",
                                  "reduce_scatter", "allgather", "broadcast",
                                  "barrier",        "ps"};

    if (op < 0 || op >= (int)MESH_ARRAY_SIZE(names))
        return "unknown-op";
    return names[op];
}

void mesh_frame_p2p(struct mesh_frame *f, uint64_t seq, uint32_t tag,
                    size_t len)
{
    memset(f, 0, sizeof(*f));
    f->seq = seq;
    f->tag = tag;
    f->op = MESH_OP_P2P;
    f->dtype = MESH_DT_BYTE;
    f->count = len;
    f->length = len;
}

const char *mesh_seq_str(uint64_t seq, char *buf, size_t len)
{
    if (seq >= MESH_SEQ_OWN_BASE)
        snprintf(buf, len, "transport message (seq 2^64-%" PRIu64 ")",
                 UINT64_MAX - seq + 1);
    else if (seq >= MESH_SEQ_COLL_BASE)
        snprintf(buf, len, "collective #%" PRIu64,
                 seq - MESH_SEQ_COLL_BASE + 1);
    else
        snprintf(buf, len, "message #%" PRIu64, seq);
    return buf;
}

const char *mesh_frame_str(const struct mesh_frame *f, char *buf, size_t len)
{
    char sq[48];

    snprintf(buf, len,
             "%s (%s) tag %" PRIu32 " %s count %" PRIu64 " offset %" PRIu64
             " length %" PRIu64,
             mesh_op_name(f->op), mesh_seq_str(f->seq, sq, sizeof(sq)), f->tag,
             mesh_dtype_name(f->dtype), f->count, f->offset, f->length);
    return buf;
}

void mesh_failure_msg(char *out, size_t len, const char *reason,
                      const struct mesh_frame *f, int is_send, int peer,
                      const char *peer_name)
{
    char fs[200];

    if (!f) {
        snprintf(out, len, "%s; no operation in flight", reason);
        return;
    }
    snprintf(out, len, "%s; operation in flight: %s %s %s rank %d (%s)", reason,
             is_send ? "send" : "receive", mesh_frame_str(f, fs, sizeof(fs)),
             is_send ? "to" : "from", peer, peer_name);
}

void mesh_transport_opts_init(struct mesh_transport_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->streams = 1;
    o->join_timeout_s = 60.0;
    o->peer_timeout_s = 10.0;
    snprintf(o->job_id, sizeof(o->job_id), "meshtrain");
    o->ib_port = -1;
    o->gid_index = -1;
    o->listen_fd = -1;
}

int mesh_transport_wait(const struct mesh_transport_ops *ops,
                        mesh_transport_t *t, mesh_req_t *req)
{
    int done = 0, rc;

    for (;;) {
        rc = ops->test(t, req, &done);
        if (rc < 0 || done)
            return rc;
        rc = ops->wait_any(t, &req, 1, -1.0);
        if (rc < 0 && rc != -ETIMEDOUT) {
            /* The job failed: test reports it and frees req. */
            ops->test(t, req, &done);
            return rc;
        }
    }
}

int mesh_cond_sleep(pthread_cond_t *cond, pthread_mutex_t *lock,
                    uint64_t deadline_ns)
{
    struct timespec ts;

    if (deadline_ns == MESH_NO_DEADLINE) {
        pthread_cond_wait(cond, lock);
        return 0;
    }
    if (mesh_now_ns() >= deadline_ns)
        return -ETIMEDOUT;
    ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
    ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
    pthread_cond_timedwait(cond, lock, &ts);
    return 0;
}

int mesh_cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t ca;
    int rc;

    rc = pthread_condattr_init(&ca);
    if (rc)
        return -rc;
    rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &ca);
    pthread_condattr_destroy(&ca);
    return -rc;
}

const struct mesh_transport_ops *mesh_transport_find(const char *name)
{
    /* "auto" is shared memory within a host and, between hosts, verbs
     * where every rank has an active port, else TCP (without verbs
     * support, TCP: then it is "shm"). */
    static const struct mesh_transport_ops *const all[] = {
        &mesh_tcp_ops,
        &mesh_shm_ops,
        &mesh_auto_ops,
#ifdef HAVE_VERBS
        &mesh_verbs_ops,
#endif
    };

    if (!name)
        return NULL;
    for (size_t i = 0; i < MESH_ARRAY_SIZE(all); i++)
        if (!strcmp(all[i]->name, name))
            return all[i];
    return NULL;
}

#ifndef HAVE_VERBS
/* Side channels need verbs (transport/verbs/side.c): without them, only
 * the open fails, and nothing else is ever called. */
int mesh_side_dev_open(const struct mesh_transport_opts *o,
                       mesh_side_dev_t **out)
{
    (void)o;
    (void)out;
    return mesh_err(-ENOSYS, "built without verbs (rdma-core)");
}

void mesh_side_dev_close(mesh_side_dev_t *d)
{
    (void)d;
}

const char *mesh_side_dev_name(const mesh_side_dev_t *d)
{
    (void)d;
    return "none";
}

int mesh_side_open(mesh_side_dev_t *d, double peer_timeout_s, mesh_side_t **out)
{
    (void)d;
    (void)peer_timeout_s;
    (void)out;
    return mesh_err(-ENOSYS, "built without verbs (rdma-core)");
}

void mesh_side_addr(const mesh_side_t *s, uint8_t addr[MESH_SIDE_ADDR])
{
    (void)s;
    memset(addr, 0, MESH_SIDE_ADDR);
}

int mesh_side_connect(mesh_side_t *s, const uint8_t addr[MESH_SIDE_ADDR])
{
    (void)s;
    (void)addr;
    return mesh_err(-ENOSYS, "built without verbs (rdma-core)");
}

int mesh_side_reg(mesh_side_t *s, void *buf, size_t len, int remote_read,
                  uint64_t *raddr, uint32_t *rkey)
{
    (void)s;
    (void)buf;
    (void)len;
    (void)remote_read;
    (void)raddr;
    (void)rkey;
    return mesh_err(-ENOSYS, "built without verbs (rdma-core)");
}

int mesh_side_read(mesh_side_t *s, void *dst, size_t len, uint64_t raddr,
                   uint32_t rkey)
{
    (void)s;
    (void)dst;
    (void)len;
    (void)raddr;
    (void)rkey;
    return mesh_err(-ENOSYS, "built without verbs (rdma-core)");
}

int mesh_side_poll(mesh_side_t *s, size_t *done)
{
    (void)s;
    *done = 0;
    return mesh_err(-ENOSYS, "built without verbs (rdma-core)");
}

void mesh_side_close(mesh_side_t *s)
{
    (void)s;
}
#endif
