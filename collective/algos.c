/*
 * collective/algos.c: the table of all-reduce algorithms (name, scratch,
 * schedule builders, cost) that name lookup, parsing, AUTO's choice and the
 * communicator's runs all go through, and the cost model's latency term.
 * The builders and their costs live in one file per family (ring.c,
 * tree.c, rd.c, baselines.c).
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

const struct coll_algo coll_algos[] = {
    {
        .id = MESH_ALGO_RING,
        .name = "ring",
        .scratch = coll_ring_scratch,
        .allreduce = coll_build_ring_allreduce,
        .broadcast = coll_build_chain_broadcast,
        .cost = coll_ring_cost,
    },
    {
        .id = MESH_ALGO_TREE,
        .name = "tree",
        .scratch = coll_tree_scratch,
        .allreduce = coll_build_tree_allreduce,
        .broadcast = coll_build_tree_broadcast,
        .cost = coll_tree_cost,
    },
    {.id = MESH_ALGO_AUTO, .name = "auto"},
    {
        .id = MESH_ALGO_PS,
        .name = "ps",
        .scratch = coll_ps_scratch,
        .allreduce = coll_build_ps_allreduce,
    },
    {
        .id = MESH_ALGO_DIRECT,
        .name = "direct",
        .scratch = coll_direct_scratch,
        .allreduce = coll_build_direct_allreduce,
        .cost = coll_direct_cost,
    },
    {
        .id = MESH_ALGO_RD,
        .name = "rd",
        .scratch = coll_rd_scratch,
        .allreduce = coll_build_rd_allreduce,
        .cost = coll_rd_cost,
    },
    {
        .id = MESH_ALGO_RHD,
        .name = "rhd",
        .scratch = coll_rd_scratch, /* two slots of count, as rd's */
        .allreduce = coll_build_rhd_allreduce,
        .cost = coll_rhd_cost,
    },
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
