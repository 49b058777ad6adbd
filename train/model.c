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

static const struct mesh_nn_tensor *nn_tensor(const void *m, int i)
{
    return mesh_nn_model_tensor(m, i);
}

static const struct mesh_train_model_ops nn_ops = {
    .forward = nn_forward,
    .loss = nn_loss,
    .backward = nn_backward,
    .tensor = nn_tensor,
};

void mesh_train_model_nn(struct mesh_nn_model *m, struct mesh_train_model *out)
{
    out->ops = &nn_ops;
    out->m = m;
    out->grads = mesh_nn_model_grads(m);
    out->ntensors = mesh_nn_model_num_tensors(m);
}
