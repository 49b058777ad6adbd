/*
 * tests/test_coll_model.c: AUTO's choice by the cost model alone, on the
 * built-in numbers meshtrain decides from (collective/algos.c,
 * coll_model_choice), for layouts of H hosts of L ranks and for ranks with
 * no hosts (TCP): the smallest messages across hosts go to a hierarchical
 * form, or below 16 ranks to direct (whose n - 1 messages per rank pile up
 * beyond that); the hierarchical forms are no choice without hosts;
 * the largest messages go to an algorithm that moves the ring's bytes
 * (ring, rhd, hier), never to one that moves the whole message per hop.
 * Then formation's agreement on its timings (coll_meas_agree): the
 * slowest rank's runs, medians, not the least, and ratios within a round.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"
#include "tests/tap.h"

#include <string.h>

/* The numbers mesh_coll_create starts from (collective/coll.c). */
static void builtin(struct mesh_coll_model *m)
{
    memset(m, 0, sizeof(*m));
    m->alpha_s = 50e-6;
    m->beta_s_per_byte = 1e-9;
    m->gamma_s_per_byte = 0.16e-9;
}

/* The shape of H x L ranks in h (H hosts of L ranks), or, with L = 0, of H
 * ranks with no hosts. */
static void shape_of(struct coll_shape *c, const struct mesh_coll_model *m,
                     struct coll_hosts *h, int H, int L)
{
    int n = L > 0 ? H * L : H;

    memset(c, 0, sizeof(*c));
    memset(h, 0, sizeof(*h));
    c->model = m;
    c->size = n;
    coll_tree_shape(n, &c->tree_depth, &c->tree_load);
    c->rd_rounds = coll_rd_rounds(n, &c->rd_extra);
    if (L > 0) {
        h->nhosts = H;
        h->local = L;
    }
    c->hosts = h;
}

static int hierarchical(int id)
{
    return id == MESH_ALGO_HIER || id == MESH_ALGO_HTREE || id == MESH_ALGO_HRD;
}

static int bandwidth(int id)
{
    return id == MESH_ALGO_RING || id == MESH_ALGO_RHD || id == MESH_ALGO_HIER;
}

/*
 * hier's and local's copies inside a host: in place (the buffers in the
 * host's shared memory) fewer than through the windows or messages from
 * COLL_SHARED_MIN bytes, none fewer below it.
 */
static void in_place_checks(const struct mesh_coll_model *m)
{
    static void *wins[8], *heaps[8];
    struct coll_shape c;
    struct coll_hosts h;
    double msg, win, inpl, below_w, below_i, one_w, one_i;
    const double big = 64.0 * (1 << 20), small = COLL_SHARED_MIN / 4.0;

    shape_of(&c, m, &h, 2, 4);
    msg = coll_hier_cost(&c, big);
    h.win = wins;
    win = coll_hier_cost(&c, big);
    below_w = coll_hier_cost(&c, small);
    h.heap = heaps;
    c.in_place = 1;
    inpl = coll_hier_cost(&c, big);
    below_i = coll_hier_cost(&c, small);
    ok(inpl < win && win <= msg && below_i == below_w,
       "hier, 2 hosts x 4, 64 MiB: in place %.2f ms < windows %.2f <= "
       "messages %.2f; the same below %u bytes (%.3f, %.3f)",
       inpl * 1e3, win * 1e3, msg * 1e3, COLL_SHARED_MIN, below_i * 1e3,
       below_w * 1e3);

    shape_of(&c, m, &h, 1, 4);
    h.win = wins;
    one_w = coll_local_cost(&c, big);
    h.heap = heaps;
    c.in_place = 1;
    one_i = coll_local_cost(&c, big);
    ok(one_i < one_w, "local, 4 ranks, 64 MiB: in place %.2f ms < windows %.2f",
       one_i * 1e3, one_w * 1e3);
}

/*
 * Formation's agreement (coll_meas_agree), 2 ranks, 3 algorithms, 5 runs.
 * Algorithm 0 is fast in 2 runs of 5 and slow in the rest (a least far
 * below the others', a median above them); algorithm 1 always takes about
 * the same; algorithm 2 is dropped (not live). Rank 1 is the slower of
 * the two in some runs of algorithm 1: the slowest rank's time counts.
 */
static void meas_agree_checks(void)
{
    enum { R = 2, A = 3, N = 5, S = COLL_MEAS_HEAD + A * N };
    static const float runs[R][A][N] = {
        {{10, 90, 95, 12, 92}, {50, 51, 52, 50, 51}, {1, 1, 1, 1, 1}},
        {{11, 91, 94, 10, 90}, {50, 60, 60, 49, 50}, {1, 1, 1, 1, 1}},
    };
    /*
     * One rank, 2 algorithms whose rounds' load rises 10, 20, ... 50:
     * algorithm 1 always takes 1.05 times the round's load, algorithm 0
     * the load itself but 1.5 times it in round 2 (a burst in its own
     * slot), which sets its median (40 against 31.5): the ratios within
     * the rounds say algorithm 0 is the faster.
     */
    static const float paired[2][N] = {{10, 20, 45, 40, 50},
                                       {10.5f, 21, 31.5f, 42, 52.5f}};
    float all[R * S], v[COLL_MEAS_HEAD + A], again[COLL_MEAS_HEAD + A];
    float one[COLL_MEAS_HEAD + 2 * N], pv[COLL_MEAS_HEAD + 2];
    const int live[A] = {1, 1, 0};

    for (int r = 0; r < R; r++) {
        float *p = all + r * S;

        p[0] = 10.0f * (float)(r + 1); /* alpha: 10 and 20 us */
        p[1] = 1.0f;
        p[2] = (float)r;
        for (int a = 0; a < A; a++)
            memcpy(p + COLL_MEAS_HEAD + a * N, runs[r][a], sizeof(runs[r][a]));
    }
    coll_meas_agree(all, R, live, A, N, v);
    /* per run, the slower rank: 0: 11 91 95 12 92; 1: 50 60 60 50 51
     * (median 51, the reference) */
    ok(v[COLL_MEAS_HEAD + 1] == 51 &&
           v[COLL_MEAS_HEAD] > v[COLL_MEAS_HEAD + 1] &&
           v[COLL_MEAS_HEAD + 2] == 0,
       "formation's time: the slowest rank's runs, the median, not the "
       "least (%.1f, %.1f, %.1f; want 51 for the steady one, more for the "
       "sometimes-fast one, 0 for the dropped one)",
       (double)v[COLL_MEAS_HEAD], (double)v[COLL_MEAS_HEAD + 1],
       (double)v[COLL_MEAS_HEAD + 2]);
    ok(v[0] == 15 && v[1] == 1 && v[2] == 0.5f,
       "formation's head: the ranks' mean (alpha %.1f, beta %.1f, spent "
       "%.2f)",
       (double)v[0], (double)v[1], (double)v[2]);
    /* every rank computes from the same gathered bytes: the same result */
    coll_meas_agree(all, R, live, A, N, again);
    ok(!memcmp(v, again, sizeof(v)), "the same bytes give the same vector");

    memset(one, 0, sizeof(one));
    memcpy(one + COLL_MEAS_HEAD, paired, sizeof(paired));
    coll_meas_agree(one, 1, live, 2, N, pv);
    ok(pv[COLL_MEAS_HEAD] < pv[COLL_MEAS_HEAD + 1] &&
           pv[COLL_MEAS_HEAD + 1] == 31.5f,
       "paired by round: the faster one in every round but one wins "
       "(%.2f against %.2f), though its median is the larger",
       (double)pv[COLL_MEAS_HEAD], (double)pv[COLL_MEAS_HEAD + 1]);
}

/*
 * AUTO's race at an epoch's end (coll_race_decide), 2 ranks (rank 1 a
 * little faster: the slowest rank's time counts), 3 contenders over
 * rounds whose load from elsewhere moves every time by up to 1.6 x: 0
 * the reference, 1 level with it (a median ratio of 1.005), 2 a few %
 * behind (median ratio 1.065) yet faster than 0 in 3 rounds of 10, so
 * never clearly slower. The pattern of 10 rounds repeats for longer
 * races.
 */
enum { RACE_K = 3, RACE_MAX = 40, RACE_S = COLL_MEAS_HEAD + RACE_K * RACE_MAX };
static const float race_load[10] = {100, 140, 90,  160, 110,
                                    120, 95,  150, 105, 130};
static const float race_ratio[RACE_K][10] = {
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {1.01f, 0.99f, 1.02f, 0.995f, 1.00f, 1.01f, 0.985f, 1.02f, 0.99f, 1.01f},
    {1.10f, 0.98f, 1.08f, 1.05f, 0.97f, 1.09f, 1.06f, 1.12f, 0.99f, 1.07f},
};

/* The race's times over runs rounds into all (2 ranks), its agreed
 * vector into v; contender a's times scaled by scale[a]. */
static void race_times(float *all, float *v, int runs, const float *scale)
{
    const int live[RACE_K] = {1, 1, 1};
    size_t stride = (size_t)COLL_MEAS_HEAD + (size_t)RACE_K * (size_t)runs;

    memset(all, 0, 2 * RACE_S * sizeof(*all));
    for (int r = 0; r < 2; r++)
        for (int a = 0; a < RACE_K; a++)
            for (int i = 0; i < runs; i++)
                all[(size_t)r * stride + COLL_MEAS_HEAD +
                    (size_t)a * (size_t)runs + (size_t)i] =
                    race_load[i % 10] * race_ratio[a][i % 10] * scale[a] *
                    (r ? 0.95f : 1.0f);
    coll_meas_agree(all, 2, live, RACE_K, runs, v);
}

static void race_checks(void)
{
    static const float same[RACE_K] = {1, 1, 1};
    static const float clear[RACE_K] = {1, 1.3f, 1.3f}; /* 0 well ahead */
    float all[2 * RACE_S], v[COLL_MEAS_HEAD + RACE_K];
    int on[RACE_K], on2[RACE_K], why = 0, why2 = 0, keep, keep2;

    /* a large size's race after 10 rounds: 2 is out, 0 and 1 race on */
    race_times(all, v, 10, same);
    keep = coll_race_decide(all, v, 2, RACE_K, 10, -1, 1, 0, on, &why);
    ok(keep == -1 && on[0] && on[1] && !on[2],
       "a large size's race, 10 rounds: the one 6.5 %% behind by its "
       "median is out, not clearly slower (on %d %d %d, keep %d)",
       on[0], on[1], on[2], keep);
    /* the same bytes, the same answer (every rank decides alike) */
    keep2 = coll_race_decide(all, v, 2, RACE_K, 10, -1, 1, 0, on2, &why2);
    ok(keep2 == keep && !memcmp(on, on2, sizeof(on)) && why2 == why,
       "the same times give the same decision");

    /* fewer rounds, or a small size before 32: it races on */
    race_times(all, v, 5, same);
    keep = coll_race_decide(all, v, 2, RACE_K, 5, -1, 1, 0, on, &why);
    ok(keep == -1 && on[0] && on[1] && on[2],
       "a large size's race, 5 rounds: all race on (on %d %d %d)", on[0], on[1],
       on[2]);
    race_times(all, v, 20, same);
    keep = coll_race_decide(all, v, 2, RACE_K, 20, -1, 0, 0, on, &why);
    ok(keep == -1 && on[0] && on[1] && on[2],
       "a small size's race, 20 rounds: all race on (on %d %d %d)", on[0],
       on[1], on[2]);
    race_times(all, v, 40, same);
    keep = coll_race_decide(all, v, 2, RACE_K, 40, -1, 0, 0, on, &why);
    ok(keep == -1 && on[0] && on[1] && !on[2],
       "a small size's race, 40 rounds: the one behind is out (on %d %d "
       "%d)",
       on[0], on[1], on[2]);

    /* a re-check of the one behind: it moves to the fastest at 20 rounds,
     * not 10 (a kept one needs more to lose than a contender to drop) */
    race_times(all, v, 10, same);
    keep = coll_race_decide(all, v, 2, RACE_K, 10, 2, 1, 0, on, &why);
    race_times(all, v, 20, same);
    keep2 = coll_race_decide(all, v, 2, RACE_K, 20, 2, 1, 0, on2, &why2);
    ok(keep == -1 && on[2] && keep2 == 0 && why2 == COLL_RACE_BEHIND_IT,
       "a large size's re-check of the one behind races on at 10 rounds "
       "and moves to the fastest at 20 (keep %d, %d, why %d)",
       keep, keep2, why2);
    /* a re-check of one level with the fastest: kept at its last epoch */
    race_times(all, v, 10, same);
    keep = coll_race_decide(all, v, 2, RACE_K, 10, 1, 1, 1, on, &why);
    ok(keep == 1 && why == COLL_RACE_NONE,
       "a re-check of one within 3 %% keeps it at its last epoch (keep %d, "
       "why %d)",
       keep, why);
    /* the race's last epoch: the fastest */
    keep = coll_race_decide(all, v, 2, RACE_K, 10, -1, 1, 1, on, &why);
    ok(keep == 0 && why == COLL_RACE_FASTEST,
       "the race's last epoch keeps the fastest (keep %d, why %d)", keep, why);

    /* a clear winner: kept after one epoch of 5, at any size, and a
     * re-check of it keeps it */
    race_times(all, v, 5, clear);
    keep = coll_race_decide(all, v, 2, RACE_K, 5, -1, 0, 0, on, &why);
    keep2 = coll_race_decide(all, v, 2, RACE_K, 5, 0, 1, 0, on2, &why2);
    ok(keep == 0 && why == COLL_RACE_CLEAR && keep2 == 0 &&
           why2 == COLL_RACE_CLEAR,
       "a clear winner is kept after 5 rounds, and kept by a re-check "
       "(keep %d %d, why %d %d)",
       keep, keep2, why, why2);
}

/*
 * The probe of a race's first epoch (coll_race_probe, then
 * coll_race_decide over its first COLL_RACE_PROBE_RUNS rounds) on
 * synthetic rounds drawn from a seed: R ranks (each 3 % slower than the
 * one before: the slowest rank's time counts), K contenders, each round a
 * load from elsewhere of 1 to 1.6 times (2.5 times about one round in 8)
 * that hits the round's calls alike, and every call its own noise of up
 * to +-noise; contender a's times ratio[a] times the first's.
 */
enum { PR_R = 8, PR_K = 3, PR_RUNS = COLL_MEAS_RUNS_MAX };
enum { PR_S = COLL_MEAS_HEAD + PR_K * PR_RUNS };

static double draw(uint64_t *s) /* splitmix64, in [0, 1) */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static void probe_times(float *all, float *v, int R, int K, int runs,
                        const float *ratio, double noise, uint64_t seed)
{
    const int live[PR_K] = {1, 1, 1};
    size_t stride = (size_t)COLL_MEAS_HEAD + (size_t)K * (size_t)runs;
    uint64_t s = seed * 0x2545f4914f6cdd1dull;

    memset(all, 0, (size_t)R * stride * sizeof(*all));
    for (int i = 0; i < runs; i++) {
        double load = draw(&s) < 0.125 ? 2.5 : 1 + 0.6 * draw(&s);

        for (int a = 0; a < K; a++)
            for (int r = 0; r < R; r++)
                all[(size_t)r * stride + COLL_MEAS_HEAD +
                    (size_t)a * (size_t)runs + (size_t)i] =
                    (float)(500 * load * ratio[a] * (1 - 0.03 * r) *
                            (1 + noise * (2 * draw(&s) - 1)));
    }
    coll_meas_agree(all, R, live, K, runs, v);
}

/*
 * Over seeds 1..PR_SEEDS and the shapes R = 2, 4, 8 ranks, K = 2, 3
 * contenders: the probe comes only in a fresh epoch 0 long enough; a
 * contender 1.35 times the fastest leaves at it (nearly always: the
 * noise can hide it in a round), one level with the fastest seldom (its
 * rounds all slower by chance: 1 / 128 each), the fastest never, and
 * nothing is kept there but the one left when the others are out (no
 * last epoch, no 3 % rule: too few rounds); the same times give the
 * same answer (every rank decides from the same gathered bytes).
 */
#define PR_SEEDS 300
static void probe_checks(void)
{
    static const int Rs[] = {2, 4, 8}, Ks[] = {2, 3};
    static const float clear[PR_K] = {1, 1.35f, 1.35f};
    static const float level[PR_K] = {1, 1, 1};
    static float all[PR_R * PR_S];
    const int P = COLL_RACE_PROBE_RUNS;
    float v[COLL_MEAS_HEAD + PR_K];
    int bad = 0, cases = 0, left = 0, outs = 0, others = 0, wrong = 0;
    int differ = 0;

    for (int rounds = 5; rounds <= 31; rounds++) /* coll.c's epochs */
        for (int e = 0; e < 4; e++) {
            int p = coll_race_probe(rounds, e);

            bad += p != (e == 0 && rounds >= P + COLL_RACE_PROBE_LEFT ? P : 0);
            bad += p > 0 && rounds - p < COLL_RACE_PROBE_LEFT;
        }
    ok(bad == 0 && coll_race_probe(31, 0) == P && coll_race_probe(31, 1) == 0,
       "a probe after %d rounds in a first epoch of %d rounds or more, none "
       "later (%d faults)",
       P, P + COLL_RACE_PROBE_LEFT, bad);

    for (size_t i = 0; i < MESH_ARRAY_SIZE(Rs); i++)
        for (size_t j = 0; j < MESH_ARRAY_SIZE(Ks); j++)
            for (uint64_t seed = 1; seed <= PR_SEEDS; seed++)
                for (int big = 0; big < 2; big++) {
                    int R = Rs[i], K = Ks[j], on[PR_K], on2[PR_K], why = 0;
                    int why2 = 0, keep, keep2, best = 0;

                    /* clearly slower ones leave; the fastest is kept.
                     * Decided twice into flags set apart beforehand:
                     * each contender's flag is written, and alike, as
                     * every rank's must be from the same agreed times */
                    probe_times(all, v, R, K, P, clear, 0.1, seed);
                    for (int a = 0; a < K; a++) {
                        on[a] = -1;
                        on2[a] = -2;
                    }
                    keep =
                        coll_race_decide(all, v, R, K, P, -1, big, 0, on, &why);
                    keep2 = coll_race_decide(all, v, R, K, P, -1, big, 0, on2,
                                             &why2);
                    differ += keep != keep2 || why != why2 ||
                              memcmp(on, on2, (size_t)K * sizeof(*on));
                    cases++;
                    left += keep == 0 && why == COLL_RACE_CLEAR;
                    wrong += !on[0] || (keep >= 0 && keep != 0);

                    /* level ones race on, but for chance */
                    probe_times(all, v, R, K, P, level, 0.1, seed + 7919);
                    keep =
                        coll_race_decide(all, v, R, K, P, -1, big, 0, on, &why);
                    for (int a = 1; a < K; a++)
                        best = v[COLL_MEAS_HEAD + a] < v[COLL_MEAS_HEAD + best]
                                   ? a
                                   : best;
                    wrong += !on[best];
                    for (int a = 0; a < K; a++)
                        outs += !on[a];
                    others += K - 1;
                    wrong += keep >= 0 && why != COLL_RACE_CLEAR;
                    /* a re-check's probe of a level kept one keeps
                     * it racing unless it was clearly slower */
                    keep =
                        coll_race_decide(all, v, R, K, P, 1, big, 0, on, &why);
                    wrong += keep >= 0 && on[1] && why != COLL_RACE_CLEAR;
                    wrong += keep >= 0 && !on[1] && why != COLL_RACE_SLOWER;
                }
    ok(left >= cases * 95 / 100 && wrong == 0 && differ == 0,
       "the probe of %d rounds over %d seeds x 2, 4, 8 ranks x 2, 3 "
       "contenders: the fastest kept where the others ran 1.35 times it in "
       "%d of %d (wrong %d, differing %d)",
       P, PR_SEEDS, left, cases, wrong, differ);
    ok(outs * 100 <= others * 3,
       "the probe: contenders level with the fastest leave in %d of %d "
       "(at most 3 %%; 1 / %d each by chance)",
       outs, others, 1 << P);
}

int main(void)
{
    static const int hosts[] = {2, 3, 4, 5, 8, 16, 32};
    static const int locals[] = {2, 3, 4, 8};
    static const double tiny[] = {4, 8, 100, 1024};
    struct mesh_coll_model m;
    struct coll_shape c;
    struct coll_hosts h;
    int bad = 0, id;

    plan(27);
    builtin(&m);

    /* the seed's topology at 4 GPUs per process: 16 hosts of 2 */
    shape_of(&c, &m, &h, 16, 2);
    id = coll_model_choice(&c, 4);
    ok(id == MESH_ALGO_HRD,
       "16 hosts x 2, 4 bytes (the loss average): %s, not direct",
       mesh_algo_name(id));

    /* tiny messages across hosts: a hierarchical form, whatever H x L;
     * direct too below 16 ranks (3 hosts of 2: recursive doubling
     * between 3 leaders folds one in, 3 hops against direct's one) */
    for (size_t i = 0; i < MESH_ARRAY_SIZE(hosts); i++)
        for (size_t j = 0; j < MESH_ARRAY_SIZE(locals); j++)
            for (size_t k = 0; k < MESH_ARRAY_SIZE(tiny); k++) {
                shape_of(&c, &m, &h, hosts[i], locals[j]);
                id = coll_model_choice(&c, tiny[k]);
                if (!hierarchical(id) &&
                    !(id == MESH_ALGO_DIRECT && hosts[i] * locals[j] < 16)) {
                    bad++;
                    diag("%d hosts x %d, %.0f bytes: %s", hosts[i], locals[j],
                         tiny[k], mesh_algo_name(id));
                }
            }
    ok(bad == 0,
       "tiny messages across hosts of 2 to 8 ranks: a "
       "hierarchical form, or direct below 16 ranks (%d others)",
       bad);

    /* without hosts (TCP between every rank) the hierarchical forms are
     * no choice, and direct gives way to rd as the ranks grow */
    bad = 0;
    for (int n = 2; n <= 128; n++) {
        shape_of(&c, &m, &h, n, 0);
        for (size_t k = 0; k < MESH_ARRAY_SIZE(tiny); k++) {
            id = coll_model_choice(&c, tiny[k]);
            if (hierarchical(id) || id == MESH_ALGO_PS ||
                (n >= 32 && id == MESH_ALGO_DIRECT)) {
                bad++;
                diag("%d ranks without hosts, %.0f bytes: %s", n, tiny[k],
                     mesh_algo_name(id));
            }
        }
    }
    ok(bad == 0,
       "2..128 ranks without hosts: no hierarchical form, no "
       "direct from 32 ranks (%d faults)",
       bad);

    /* the largest messages: the ring's bytes, on every layout */
    bad = 0;
    for (size_t i = 0; i < MESH_ARRAY_SIZE(hosts); i++)
        for (size_t j = 0; j < MESH_ARRAY_SIZE(locals); j++) {
            shape_of(&c, &m, &h, hosts[i], locals[j]);
            id = coll_model_choice(&c, 256.0 * (1 << 20));
            if (!bandwidth(id)) {
                bad++;
                diag("%d hosts x %d, 256 MiB: %s", hosts[i], locals[j],
                     mesh_algo_name(id));
            }
        }
    ok(bad == 0, "256 MiB on every layout: ring, rhd or hier (%d others)", bad);

    /* a measured 32-byte time replaces the latency model: hrd measured
     * slow loses the tiny sizes to another */
    shape_of(&c, &m, &h, 16, 2);
    for (int a = 0; a <= MESH_ALGO_LAST; a++)
        m.lat_s[a] = 1e-3;
    m.lat_s[MESH_ALGO_HRD] = 5e-3;
    m.lat_s[MESH_ALGO_HIER] = 0.5e-3;
    id = coll_model_choice(&c, 4);
    ok(id == MESH_ALGO_HIER, "a measured latency replaces the model's: %s",
       mesh_algo_name(id));

    /* ranks sharing CPUs (N / 2 per CPU, no hosts: one rank per network
     * namespace of one machine, as bench/chaos.sh runs): the middle sizes
     * never go to direct (N - 1 whole messages per rank) nor, from 5
     * ranks, to the ring (2 N (N - 1) messages in all) */
    builtin(&m);
    bad = 0;
    for (int n = 3; n <= 8; n++)
        for (double b = 32 << 10; b <= 512 << 10; b *= 2) {
            shape_of(&c, &m, &h, n, 1);
            m.ranks_per_cpu = n / 2.0;
            id = coll_model_choice(&c, b);
            if (id == MESH_ALGO_DIRECT || (n >= 5 && id == MESH_ALGO_RING)) {
                bad++;
                diag("%d ranks, %.1f per CPU, %.0f bytes: %s", n,
                     m.ranks_per_cpu, b, mesh_algo_name(id));
            }
        }
    ok(bad == 0,
       "3..8 ranks at N / 2 per CPU, 32-512 KiB: no direct, no ring "
       "from 5 ranks (%d others)",
       bad);
    /* the chaos run's bucket in a view of 7: a CPU each, the hops'
     * model's ring; 3.5 ranks per CPU, rd or rhd */
    shape_of(&c, &m, &h, 7, 1);
    m.ranks_per_cpu = 1;
    id = coll_model_choice(&c, 178200);
    m.ranks_per_cpu = 3.5;
    ok(id == MESH_ALGO_RING && (coll_model_choice(&c, 178200) == MESH_ALGO_RD ||
                                coll_model_choice(&c, 178200) == MESH_ALGO_RHD),
       "7 ranks, 178,200 bytes: %s with a CPU each, %s at 3.5 per CPU",
       mesh_algo_name(id), mesh_algo_name(coll_model_choice(&c, 178200)));
    /* the largest messages still move the ring's bytes */
    bad = 0;
    for (int n = 3; n <= 16; n++) {
        shape_of(&c, &m, &h, n, 1);
        m.ranks_per_cpu = n / 2.0;
        id = coll_model_choice(&c, 256.0 * (1 << 20));
        if (!bandwidth(id) && id != MESH_ALGO_TREE) {
            bad++;
            diag("%d ranks at %.1f per CPU, 256 MiB: %s", n, m.ranks_per_cpu,
                 mesh_algo_name(id));
        }
    }
    ok(bad == 0,
       "256 MiB, 3..16 ranks at N / 2 per CPU: ring, rhd or the tree (%d "
       "others)",
       bad);
    /* hosts of several ranks (where hier, htree, hrd and local, which
     * have no work bound, run): the sharing changes no choice */
    bad = 0;
    for (size_t i = 0; i < 3; i++)
        for (double b = 4; b <= 256.0 * (1 << 20); b *= 4) {
            int one;

            shape_of(&c, &m, &h, (int)i + 1, 2 + (int)i);
            m.ranks_per_cpu = 1;
            one = coll_model_choice(&c, b);
            m.ranks_per_cpu = 4;
            id = coll_model_choice(&c, b);
            if (id != one) {
                bad++;
                diag("%d hosts x %d, %.0f bytes: %s at 4 per CPU, %s at 1",
                     (int)i + 1, 2 + (int)i, b, mesh_algo_name(id),
                     mesh_algo_name(one));
            }
        }
    ok(bad == 0,
       "1 x 2, 2 x 3, 3 x 4 (hosts x ranks), 4 B-256 MiB: the same choice "
       "at 4 ranks per CPU as at 1 (%d others)",
       bad);
    builtin(&m);

    in_place_checks(&m);
    meas_agree_checks();
    race_checks();
    probe_checks();
    return done();
}
