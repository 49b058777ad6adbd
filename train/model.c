/*
 * train/model.c: nn's models behind the trainer's model ops (see
 * train/model.h).
 */
#include "config.h"

#include "train/model.h"

static int nn_forward(void *m, int n, const float *images, int train)
{
    return mesh_nn_model_forward(m, n, images, train);
}

static int nn_loss(void *m, const int32_t *labels, float smoothing, float *loss)
{
    return mesh_nn_model_loss(m, labels, smoothing, loss);
}

static int nn_backward(void *m, int accumulate, mesh_nn_grad_ready_fn cb,
                       void *arg)
{
    return mesh_nn_model_backward(m, accumulate, cb, arg);
}

static int nn_num_tensors(const void *m)
{
    return mesh_nn_model_num_tensors(m);
}

static const struct mesh_nn_tensor *nn_tensor(const void *m, int i)
{
    return mesh_nn_model_tensor(m, i);
}

static float *nn_grads(void *m)
{
    return mesh_nn_model_grads(m);
}

const struct mesh_train_model_ops mesh_train_model_nn = {
    .forward = nn_forward,
    .loss = nn_loss,
    .backward = nn_backward,
    .num_tensors = nn_num_tensors,
    .tensor = nn_tensor,
    .grads = nn_grads,
};
