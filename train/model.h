/*
 * train/model.h: what the training step needs of a model, so that nn's
 * ResNet and the simulated compute (train/simulate.h) run the same
 * accumulate loop and feed the same gradient buckets (train/gradsync.h).
 *
 * A struct mesh_train_model is an ops table and the object it acts on.
 * The ops mirror nn's calls (nn/nn.h): forward, loss, backward with a
 * gradient-ready callback and the tensor list (params first, in slab
 * order); the gradient slab (device memory for a device backend) and the
 * tensor count do not change and come as fields.
 */
#ifndef MESH_TRAIN_MODEL_H
#define MESH_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nn/nn.h"

struct mesh_train_model_ops {
    /* Forward n images (host, NCHW); train: batch statistics. */
    int (*forward)(void *m, int n, const float *images, int train);
    /* The mean loss of the last forward against labels (n int32). */
    int (*loss)(void *m, const int32_t *labels, float smoothing, float *loss);
    /* Backward; accumulate: add to the slab; cb may be NULL. */
    int (*backward)(void *m, int accumulate, mesh_nn_grad_ready_fn cb,
                    void *arg);
    /* Tensor i of ntensors (params first, in slab order). */
    const struct mesh_nn_tensor *(*tensor)(const void *m, int i);
};

struct mesh_train_model {
    const struct mesh_train_model_ops *ops;
    void *m;      /* the struct mesh_nn_model or struct mesh_sim */
    float *grads; /* the gradient slab (the backend's memory) */
    int ntensors;
};

/* nn's model m as the trainer's model. */
void mesh_train_model_nn(struct mesh_nn_model *m, struct mesh_train_model *out);

#endif
