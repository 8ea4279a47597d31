// optim.cu: gradwire-optim's update rules (rules.rs) element by element, with
// the same f32 operations in the same order, so a GPU step is bitwise the CPU
// step: parameters and gradients in f32, f16 or bf16 (loaded as f32, the
// parameter rounded once on the store), optimizer buffers in f32.
//
// The launcher evaluates the schedules and the f64 bias corrections on the
// host exactly as rules.rs does and passes the resulting f32 values; the
// branches on the options (weight decay, nesterov) are uniform per launch.
//
// Entries, for dt in f32, f16, bf16 (parameter and gradient of that dtype):
//   sgd_<dt>       p, g, buf (null without momentum), n, lr, momentum,
//                  dampening, weight_decay, nesterov
//   rmsprop_<dt>   p, g, square_avg, n, lr, rho, eps, weight_decay
//   adagrad_<dt>   p, g, sum_sq, n, lr, eps, weight_decay
//   adam_<dt>      p, g, m, v, n, step_size, inv_c2, beta1, beta2, eps, l2
//   adamw_<dt>     p, g, m, v, n, apply_shrink, shrink, step_size, inv_c2,
//                  beta1, beta2, eps
// where step_size = (f32)(lr / (1 - beta1^t)), inv_c2 = (f32)(1 / (1 - beta2^t))
// computed in f64, shrink = (f32)(1 - lr * wd) in f64 (0 < wd; with wd = 0
// pass shrink = 1 and `apply_shrink` = 0).

#include "gradwire.cuh"

__device__ __forceinline__ float decayed(float g, float p, float wd) { return g + wd * p; }

// SINGA's SGD: with momentum (mu != 0 and a buffer) buf = mu buf + (1 - d) g,
// then p -= lr buf (or lr (g + mu buf) with nesterov); without, p -= lr g.
// L2 decay is added to the gradient only when wd != 0, as on the CPU.
template <typename T>
__device__ void sgd_impl(T* p, const T* g, float* buf, gw_u64 n, float lr, float mu,
                         float dampening, float wd, int nesterov) {
    const float keep = 1.0f - dampening;
    const bool with_momentum = buf != 0 && mu != 0.0f;
    GW_FOR_EACH(i, n) {
        float pi = gw_load(p, i);
        float gi = gw_load(g, i);
        if (with_momentum) {
            if (wd != 0.0f) {
                gi = decayed(gi, pi, wd);
            }
            const float b = mu * buf[i] + keep * gi;
            buf[i] = b;
            if (nesterov) {
                pi = pi - lr * (gi + mu * b);
            } else {
                pi = pi - lr * b;
            }
        } else if (wd != 0.0f) {
            pi = pi - lr * decayed(gi, pi, wd);
        } else {
            pi = pi - lr * gi;
        }
        gw_store(p, i, pi);
    }
}

// SINGA's RMSProp: r = rho r + (1 - rho) g^2; p -= lr g / sqrt(r + eps).
template <typename T>
__device__ void rmsprop_impl(T* p, const T* g, float* r, gw_u64 n, float lr, float rho,
                             float eps, float wd) {
    const float fresh = 1.0f - rho;
    GW_FOR_EACH(i, n) {
        float pi = gw_load(p, i);
        float gi = gw_load(g, i);
        if (wd != 0.0f) {
            gi = decayed(gi, pi, wd);
        }
        const float ri = rho * r[i] + fresh * gi * gi;
        r[i] = ri;
        pi = pi - lr * gi / sqrtf(ri + eps);
        gw_store(p, i, pi);
    }
}

// SINGA's AdaGrad: h += g^2; p -= lr g / sqrt(h + eps).
template <typename T>
__device__ void adagrad_impl(T* p, const T* g, float* h, gw_u64 n, float lr, float eps,
                             float wd) {
    GW_FOR_EACH(i, n) {
        float pi = gw_load(p, i);
        float gi = gw_load(g, i);
        if (wd != 0.0f) {
            gi = decayed(gi, pi, wd);
        }
        const float hi = h[i] + gi * gi;
        h[i] = hi;
        pi = pi - lr * gi / sqrtf(hi + eps);
        gw_store(p, i, pi);
    }
}

// Adam's step on one element already loaded as f32 (rules.rs adam_apply).
__device__ __forceinline__ float adam_step(float pi, float gi, float* m, float* v, gw_u64 i,
                                           float step_size, float inv_c2, float b1, float b2,
                                           float eps, float l2) {
    const float f1 = 1.0f - b1;
    const float f2 = 1.0f - b2;
    if (l2 != 0.0f) {
        gi = decayed(gi, pi, l2);
    }
    const float mi = b1 * m[i] + f1 * gi;
    const float vi = b2 * v[i] + f2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    return pi - step_size * mi / (sqrtf(vi * inv_c2) + eps);
}

template <typename T>
__device__ void adam_impl(T* p, const T* g, float* m, float* v, gw_u64 n, float step_size,
                          float inv_c2, float b1, float b2, float eps, float l2) {
    GW_FOR_EACH(i, n) {
        const float pi = gw_load(p, i);
        const float gi = gw_load(g, i);
        gw_store(p, i, adam_step(pi, gi, m, v, i, step_size, inv_c2, b1, b2, eps, l2));
    }
}

// AdamW: p *= shrink (when the weight decay is not 0), then Adam with the raw
// gradient; the parameter is rounded once, after both.
template <typename T>
__device__ void adamw_impl(T* p, const T* g, float* m, float* v, gw_u64 n, int apply_shrink,
                           float shrink, float step_size, float inv_c2, float b1, float b2,
                           float eps) {
    GW_FOR_EACH(i, n) {
        float pi = gw_load(p, i);
        if (apply_shrink) {
            pi = pi * shrink;
        }
        const float gi = gw_load(g, i);
        gw_store(p, i, adam_step(pi, gi, m, v, i, step_size, inv_c2, b1, b2, eps, 0.0f));
    }
}

#define GW_OPTIM(SUFFIX, T)                                                                 \
    extern "C" __global__ void sgd_##SUFFIX(T* p, const T* g, float* buf, gw_u64 n, float lr, \
                                            float momentum, float dampening,                \
                                            float weight_decay, int nesterov) {             \
        sgd_impl<T>(p, g, buf, n, lr, momentum, dampening, weight_decay, nesterov);         \
    }                                                                                       \
    extern "C" __global__ void rmsprop_##SUFFIX(T* p, const T* g, float* square_avg,        \
                                                gw_u64 n, float lr, float rho, float eps,   \
                                                float weight_decay) {                       \
        rmsprop_impl<T>(p, g, square_avg, n, lr, rho, eps, weight_decay);                   \
    }                                                                                       \
    extern "C" __global__ void adagrad_##SUFFIX(T* p, const T* g, float* sum_sq, gw_u64 n,  \
                                                float lr, float eps, float weight_decay) {  \
        adagrad_impl<T>(p, g, sum_sq, n, lr, eps, weight_decay);                            \
    }                                                                                       \
    extern "C" __global__ void adam_##SUFFIX(T* p, const T* g, float* m, float* v, gw_u64 n, \
                                             float step_size, float inv_c2, float beta1,    \
                                             float beta2, float eps, float l2) {            \
        adam_impl<T>(p, g, m, v, n, step_size, inv_c2, beta1, beta2, eps, l2);              \
    }                                                                                       \
    extern "C" __global__ void adamw_##SUFFIX(T* p, const T* g, float* m, float* v,         \
                                              gw_u64 n, int apply_shrink, float shrink,     \
                                              float step_size, float inv_c2, float beta1,   \
                                              float beta2, float eps) {                     \
        adamw_impl<T>(p, g, m, v, n, apply_shrink, shrink, step_size, inv_c2, beta1, beta2, \
                      eps);                                                                 \
    }

GW_OPTIM(f32, float)
GW_OPTIM(f16, gw_f16)
GW_OPTIM(bf16, gw_bf16)
