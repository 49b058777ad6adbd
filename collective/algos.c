/*
 * collective/algos.c: the table of all-reduce algorithms (name, scratch,
 * schedule builders, cost) that name lookup, parsing, AUTO's choice and the
 * communicator's runs all go through, and the cost model's latency term.
 * The builders and their costs live in one file per family (ring.c,
 * tree.c, rd.c, baselines.c, hier.c, local.c).
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

/* id, name, scratch, all-reduce, broadcast (NULL: the chain), cost (NULL:
 * not AUTO's), work (NULL: no bound); see struct coll_algo. */
const struct coll_algo coll_algos[] = {
    {MESH_ALGO_RING, "ring", coll_ring_scratch, coll_build_ring_allreduce,
     coll_build_chain_broadcast, coll_ring_cost, coll_ring_work},
    {MESH_ALGO_TREE, "tree", coll_tree_scratch, coll_build_tree_allreduce,
     coll_build_tree_broadcast, coll_tree_cost, coll_tree_work},
    {MESH_ALGO_AUTO, "auto", NULL, NULL, NULL, NULL, NULL},
    {MESH_ALGO_PS, "ps", coll_ps_scratch, coll_build_ps_allreduce, NULL, NULL,
     NULL},
    {MESH_ALGO_DIRECT, "direct", coll_direct_scratch,
     coll_build_direct_allreduce, NULL, coll_direct_cost, coll_direct_work},
    {MESH_ALGO_RD, "rd", coll_rd_scratch, coll_build_rd_allreduce, NULL,
     coll_rd_cost, coll_rd_work},
    /* rd's scratch: two slots of count */
    {MESH_ALGO_RHD, "rhd", coll_rd_scratch, coll_build_rhd_allreduce, NULL,
     coll_rhd_cost, coll_rhd_work},
    {MESH_ALGO_HIER, "hier", coll_hier_scratch, coll_build_hier_allreduce, NULL,
     coll_hier_cost, NULL},
    {MESH_ALGO_HTREE, "htree", coll_htree_scratch, coll_build_htree_allreduce,
     NULL, coll_htree_cost, NULL},
    {MESH_ALGO_HRD, "hrd", coll_hrd_scratch, coll_build_hrd_allreduce, NULL,
     coll_hrd_cost, NULL},
    {MESH_ALGO_LOCAL, "local", coll_local_scratch, coll_build_local_allreduce,
     NULL, coll_local_cost, NULL},
};
const size_t coll_nalgos = MESH_ARRAY_SIZE(coll_algos);

const struct coll_algo *coll_algo_get(int id)
{
    for (size_t i = 0; i < coll_nalgos; i++)
        if (coll_algos[i].id == id)
            return &coll_algos[i];
    return NULL;
}

double coll_lat(const struct coll_shape *c, int algo, double hops)
{
    double l = c->model->lat_s[algo];

    return l > 0 ? l : hops * c->model->alpha_s;
}

double coll_model_cost(const struct coll_shape *c, const struct coll_algo *e,
                       double bytes)
{
    double cost = e->cost(c, bytes), share = c->model->ranks_per_cpu;

    /* not where hosts hold several ranks each: there the hierarchical
     * forms and local run too, whose work (shared memory, in place) is
     * not modelled; bounding the others alone would favour them */
    if (share > 1 && e->work && cost < 1e29 &&
        !(c->hosts && c->hosts->local >= 2))
        cost = MESH_MAX(cost, e->work(c, bytes) / c->size * share);
    return cost;
}

int coll_model_choice(const struct coll_shape *c, double bytes)
{
    double best_cost = 0;
    int best = -1;

    for (size_t i = 0; i < coll_nalgos; i++) {
        const struct coll_algo *e = &coll_algos[i];
        double cost;

        if (!e->cost)
            continue;
        cost = coll_model_cost(c, e, bytes);
        if (best < 0 || cost < best_cost) {
            best = e->id;
            best_cost = cost;
        }
    }
    return best;
}
