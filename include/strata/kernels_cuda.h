// The CUDA kernels: the same ops, names and contracts as kernels_cpu.h, on DEVICE pointers
// (kernels/cuda/<family>.cu). GEMMs go through cuBLAS(Lt), convolutions through cuDNN,
// the rest are strata's own kernels. Every op is enqueued on the one compute stream of this
// process (stream()); the ops that return a host value (losses, counts, norms) wait for it.
// This header needs no CUDA header, so host code compiled by the C++ compiler can include it;
// it exists only in builds with STRATA_CUDA (CMake defines STRATA_HAVE_CUDA for them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/kernels_cpu.h"

namespace strata::cuda {

using cpu::Conv2dShape;

// ---- Context (kernels/cuda/context.cu) -------------------------------------------------
// GPUs this process sees; 0 when the driver or runtime reports any error (a node with the
// toolkit but no GPU says "driver version is insufficient": that is "no GPU"). why, if not
// null, receives the runtime's message then.
int device_count(std::string* why = nullptr);
// Makes `device` current and creates the compute stream, the cuBLAS and cuDNN handles.
// bf16: GEMMs and convolutions compute in bf16 (fp32 storage, master weights and
// accumulation); else strict fp32 (no TF32). Throws std::runtime_error on a CUDA error.
void init(int device, bool bf16);
bool initialized();
int current_device();
std::string device_name();          // e.g. "NVIDIA H100 80GB HBM3"
void* stream();                     // the compute stream (a cudaStream_t)
void synchronize();                 // waits for the compute stream

// ---- Memory ----------------------------------------------------------------------------
void* alloc(size_t bytes);          // cudaMalloc; throws std::runtime_error when out of memory
void release(void* p);              // cudaFree (null is fine)
void upload(void* dst, const void* src, size_t bytes);     // host -> device, stream-ordered;
                                                           // src may be reused on return
void download(void* dst, const void* src, size_t bytes);   // device -> host, waits for it
void copy(void* dst, const void* src, size_t bytes);       // device -> device, stream-ordered
void zero(void* p, size_t bytes);                           // stream-ordered memset
// dst[i] += src[i] (the conv+pool layer sums chunk gradients with it).
void add_inplace(float* dst, const float* src, int64_t n);

// ---- The ops: see kernels_cpu.h for each one's contract --------------------------------
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int I, int O);
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int B, int I, int O, bool accumulate);
void linear_relu_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int I, int O);
void linear_relu_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* out, const float* inp, const float* weight, int B, int I,
                          int O, float* dpre, bool accumulate);
int64_t conv2d_scratch_size(const Conv2dShape& s);  // floats of device workspace
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, float* scratch);
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, const Conv2dShape& s, float* scratch,
                     bool accumulate);
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, int B, int C, int H, int W,
                       int k, int st);
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, int B, int C,
                        int H, int W, int k, int st);
void relu_forward(float* out, const float* inp, int64_t n);
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n);
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
// The same mask as the CPU kernel, bit for bit (the same counter-based hash, strata/rng.h).
void dropout_forward(float* out, float* mask, const float* inp, int B, int64_t per_sample,
                     float p, uint64_t seed, uint64_t step, int64_t first_sample);
void dropout_backward(float* dinp, const float* dout, const float* mask, int64_t n);
// labels are device int32. Returns the sum over the batch (waits for the stream).
double softmax_xent_forward(float* probs, const float* logits, const int32_t* labels, int B,
                            int C);
void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* labels, int B,
                           int C, float scale);
int64_t count_correct(const float* logits, const int32_t* labels, int B, int C);
void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step);
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t);
double sum_squares(const float* x, int64_t n);  // waits for the stream
void scale_inplace(float* x, int64_t n, float s);

// ---- GPT-2 transformer ops (kernels/cuda/{embedding,layernorm,attention}.cu) -----------
// tokens are device int32 in [0,V): the caller checks them on the host (a kernel cannot
// throw); an id outside gives NaN rows in forward and is skipped in backward. Backward sums
// are deterministic (no float atomics): embedding_backward adds the CPU's terms in the CPU's
// order, bit for bit; layernorm_backward's parameter sums chunk rows as the CPU does.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int V);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int V, bool accumulate);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, bool accumulate);
void residual_forward(float* out, const float* a, const float* b, int64_t n);
// The score and value products are cuBLAS batched GEMMs in the context's precision (strict
// fp32, or bf16 tensor cores with fp32 accumulation); softmax is fp32. Uses a device workspace
// of this op (forward 4*B*T*C floats, backward 7*B*T*C + B*NH*T*T), kept between calls.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);

}  // namespace strata::cuda
