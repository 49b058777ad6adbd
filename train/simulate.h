/*
 * train/simulate.h: simulated compute for meshtrain's scaling benchmark
 * (--simulate-compute, --simulate-scale) and per-layer timing of real
 * compute (--profile-layers).
 *
 * The layer list is built from the model description alone (arch, width,
 * stem, classes, channels, image size): no slabs, no plans, no activations,
 * so that 128 simulated peers fit in a few GiB. Its parameter tensors have
 * nn's names, order, offsets and counts (tests/test_simulate.c checks them
 * against mesh_nn_model_create), divided by the scale k:
 *
 *   count'(tensor) = ceil(count / k),  offsets cumulative in slab order.
 *
 * A step's compute is then a forward wait (the sum of the layers' forward
 * times) and a backward that walks the layers in reverse, waits until each
 * layer's simulated end (absolute deadlines from the start of backward, so
 * a late wake-up does not add up) and reports its parameter ranges to the
 * gradient-ready callback, from the end of the slab down, as nn does.
 *
 * Profiles (seconds per layer at the run's batch):
 *   k80   the seed's 45.4 img/s at batch 32 (0.705 s per step at N = 1),
 *         spread over the layers in proportion to their forward FLOPs,
 *         backward = 2 x forward; scaled linearly to other batch sizes;
 *   h200  an assumption, not a measurement: 2500 img/s at batch 32
 *         (12.8 ms per step), spread the same way;
 *   FILE  a CSV written by --profile-layers: "layer,forward_ms,backward_ms"
 *         rows (and "# batch B"), one per layer name, used as measured.
 */
#ifndef MESH_SIMULATE_H
#define MESH_SIMULATE_H

#include <stddef.h>
#include <stdint.h>

#include "nn/nn.h"
#include "train/model.h"

struct mesh_sim;
struct mesh_sim_prof;

/* Seconds per step of the built-in profiles at batch 32. */
#define MESH_SIM_K80_STEP_S  0.705
#define MESH_SIM_H200_STEP_S 0.0128

/*
 * Build the simulation of cfg's model (defaults filled in as nn does) for
 * profile ("k80", "h200" or a CSV path), batch per peer, and scale k >= 1.
 * Errors name the profile, file and line.
 */
int mesh_sim_create(const struct mesh_nn_model_cfg *cfg, const char *profile,
                    int batch, double scale, struct mesh_sim **out);
void mesh_sim_destroy(struct mesh_sim *s);

/* Parameter tensors (scaled offsets and counts), in slab order. */
int mesh_sim_num_tensors(const struct mesh_sim *s);
const struct mesh_nn_tensor *mesh_sim_tensor(const struct mesh_sim *s, int i);
/* Floats in the scaled gradient slab, and the slab (host, zeroed). */
size_t mesh_sim_num_params(const struct mesh_sim *s);
size_t mesh_sim_real_params(const struct mesh_sim *s);
float *mesh_sim_grads(struct mesh_sim *s);
/*
 * --simulate-gpus G: this process stands for G GPUs of one host, global
 * indices first .. first + G - 1 (rank x G). GPU g's gradients are a fixed
 * pattern, (g % 64) + 1 + (i % 8) at element i (small integers, so that
 * every sum of them is exact in float); backward fills each range of the
 * slab with their mean (a real sum over G slabs in GPU order, then x 1/G)
 * just before reporting it, the intra-process part of the host's
 * reduction. G = 1 (the default) leaves the slab as it is (zeros).
 */
#define MESH_SIM_MAX_GPUS 64
int mesh_sim_set_gpus(struct mesh_sim *s, int gpus, long first);
/* FNV-1a (64 bits) of the slab's bytes: replicas compare it. */
uint64_t mesh_sim_grads_hash(const struct mesh_sim *s);
/* The filled-in model configuration. */
const struct mesh_nn_model_cfg *mesh_sim_config(const struct mesh_sim *s);
/* Total simulated forward and backward seconds per step. */
void mesh_sim_step_time(const struct mesh_sim *s, double *fwd, double *bwd);

/* Wait the forward time. */
int mesh_sim_forward(struct mesh_sim *s);
/* Wait layer by layer in reverse, reporting ranges to cb (may be NULL). */
int mesh_sim_backward(struct mesh_sim *s, mesh_nn_grad_ready_fn cb, void *arg);

/*
 * The simulation s as the trainer's model (train/model.h): forward waits
 * mesh_sim_forward (no images), the loss is 0, backward is
 * mesh_sim_backward (the slab is written only by --simulate-gpus' mean),
 * the tensors and slab are the scaled ones above.
 */
void mesh_sim_model(struct mesh_sim *s, struct mesh_train_model *out);

/*
 * Saturation figures since the last call (then reset): the median over
 * steps of the stretch (the step's simulated compute took this much longer
 * than profiled: what a late wake-up costs t_iter, as later deadlines
 * catch up), the median and maximum over steps of the worst lateness of
 * any one wait (seconds past its deadline; delays gradient-ready
 * callbacks), and the process CPU seconds per step.
 */
struct mesh_sim_stats {
    uint64_t steps;
    double stretch_median_s;
    double late_median_s, late_max_s;
    double cpu_per_step_s;
};
void mesh_sim_stats_take(struct mesh_sim *s, struct mesh_sim_stats *out);
/* Mark the start and end of a measured step (CPU time). */
void mesh_sim_step_begin(struct mesh_sim *s);
void mesh_sim_step_end(struct mesh_sim *s);

/* ---- --profile-layers: per-layer times of real compute ----------------- */

/*
 * Backward per layer is measured from nn's gradient-ready callbacks: the
 * time from the previous callback (or the start of backward) to a
 * tensor's callback is charged to that tensor's layer. nn reports nothing
 * during forward, so the measured forward total is split over the layers in
 * proportion to their measured backward times.
 */
int mesh_sim_prof_create(const struct mesh_nn_model_cfg *cfg, int batch,
                         struct mesh_sim_prof **out);
void mesh_sim_prof_destroy(struct mesh_sim_prof *p);
void mesh_sim_prof_forward(struct mesh_sim_prof *p, double seconds);
void mesh_sim_prof_backward_begin(struct mesh_sim_prof *p);
/* From the gradient-ready callback: the range starting at offset is final. */
void mesh_sim_prof_grad(struct mesh_sim_prof *p, size_t offset);
void mesh_sim_prof_backward_end(struct mesh_sim_prof *p);
/* Write the CSV (averages over the recorded steps after the first). */
int mesh_sim_prof_write(const struct mesh_sim_prof *p, const char *path);

#endif
