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
 * not AUTO's); see struct coll_algo. */
const struct coll_algo coll_algos[] = {
    {MESH_ALGO_RING, "ring", coll_ring_scratch, coll_build_ring_allreduce,
     coll_build_chain_broadcast, coll_ring_cost},
    {MESH_ALGO_TREE, "tree", coll_tree_scratch, coll_build_tree_allreduce,
     coll_build_tree_broadcast, coll_tree_cost},
    {MESH_ALGO_AUTO, "auto", NULL, NULL, NULL, NULL},
    {MESH_ALGO_PS, "ps", coll_ps_scratch, coll_build_ps_allreduce, NULL, NULL},
    {MESH_ALGO_DIRECT, "direct", coll_direct_scratch,
     coll_build_direct_allreduce, NULL, coll_direct_cost},
    {MESH_ALGO_RD, "rd", coll_rd_scratch, coll_build_rd_allreduce, NULL,
     coll_rd_cost},
    /* rd's scratch: two slots of count */
    {MESH_ALGO_RHD, "rhd", coll_rd_scratch, coll_build_rhd_allreduce, NULL,
     coll_rhd_cost},
    {MESH_ALGO_HIER, "hier", coll_hier_scratch, coll_build_hier_allreduce, NULL,
     coll_hier_cost},
    {MESH_ALGO_HTREE, "htree", coll_htree_scratch, coll_build_htree_allreduce,
     NULL, coll_htree_cost},
    {MESH_ALGO_HRD, "hrd", coll_hrd_scratch, coll_build_hrd_allreduce, NULL,
     coll_hrd_cost},
    {MESH_ALGO_LOCAL, "local", coll_local_scratch, coll_build_local_allreduce,
     NULL, coll_local_cost},
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

int coll_model_choice(const struct coll_shape *c, double bytes)
{
    double best_cost = 0;
    int best = -1;

    for (size_t i = 0; i < coll_nalgos; i++) {
        const struct coll_algo *e = &coll_algos[i];
        double cost;

        if (!e->cost)
            continue;
        cost = e->cost(c, bytes);
        if (best < 0 || cost < best_cost) {
            best = e->id;
            best_cost = cost;
        }
    }
    return best;
}
