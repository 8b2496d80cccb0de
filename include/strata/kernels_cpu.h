// The fp32 CPU kernels: the reference every other backend is checked against.
// Plain functions over raw row-major pointers, forward and backward of an op side by side
// (kernels/cpu/<family>.cpp). Activations are NCHW. "B" is the local batch.
// Backward functions OVERWRITE their input gradient; parameter gradients are overwritten, or
// added to when `accumulate` (micro-batches of a pipeline step sum into one gradient in the
// GEMM itself, beta = 1, with no extra pass). A null gradient pointer means "not needed"
// (e.g. dinp of the first layer).
#pragma once
#include <cstdint>

namespace strata::cpu {

// ---- BLAS (kernels/cpu/gemm.cpp) -------------------------------------------------------
// GEMMs run on oneDNN's JIT sgemm (see gemm.cpp for why). blas_init sets the math thread
// count; safe to call more than once.
void blas_init(int threads);
const char* blas_corename();  // the kernels in use, e.g. "oneDNN avx512_core"
// C(M,N) = alpha * op(A) * op(B) + beta * C, row-major; op(A) is (M,K), op(B) is (K,N).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);
// C(M,N) = op(A) * op(B) [+ bias(N) on every row] [then ReLU], row-major, through a oneDNN
// matmul primitive made for this exact shape (cached per thread). Faster than sgemm on the
// larger linear-layer shapes, and bias and ReLU cost no extra pass. bias may be null.
void matmul(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
            const float* B, int ldb, float* C, int ldc, const float* bias, bool relu);
// C(M,N) += op(A) * op(B), row-major, through a matmul primitive with a sum post-op (the
// accumulating weight gradients of micro-batches).
void matmul_accumulate(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                       const float* B, int ldb, float* C, int ldc);

// ---- Linear (kernels/cpu/linear.cpp) ---------------------------------------------------
// out (B,O) = inp (B,I) @ weight(O,I)^T + bias(O). bias may be null.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int I, int O);
// dinp (B,I) = dout @ weight; dweight (O,I) = dout^T @ inp; dbias (O) = sum_b dout.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int B, int I, int O, bool accumulate);
// Linear followed by ReLU as one op: out (B,O) = relu(inp @ weight^T + bias), bias and ReLU
// applied in the GEMM's epilogue where the shape allows (see linear.cpp).
void linear_relu_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int I, int O);
// dout (B,O) is the gradient at the ReLU's output, out (B,O) that output; dpre (B,O) is
// scratch that receives the gradient before the ReLU. dinp, dweight, dbias as linear_backward.
void linear_relu_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* out, const float* inp, const float* weight, int B, int I,
                          int O, float* dpre, bool accumulate);

// ---- Conv2d (kernels/cpu/conv.cpp) -----------------------------------------------------
struct Conv2dShape {
  int B, C, H, W;      // input
  int OC, KH, KW;      // weight is (OC, C, KH, KW)
  int stride, pad;     // same in both spatial dims
  int OH() const { return (H + 2 * pad - KH) / stride + 1; }
  int OW() const { return (W + 2 * pad - KW) / stride + 1; }
};
// Scratch (floats) the conv kernels need for a shape; caller owns the buffer.
int64_t conv2d_scratch_size(const Conv2dShape& s);
// out (B,OC,OH,OW) = conv(inp (B,C,H,W), weight) + bias(OC). bias may be null.
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, float* scratch);
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, const Conv2dShape& s, float* scratch,
                     bool accumulate);

// ---- MaxPool2d (kernels/cpu/pool.cpp) --------------------------------------------------
// Window k, stride st, no padding; out (B,C,OH,OW) with OH=(H-k)/st+1. argmax (same size as out)
// records the flat index within the (H,W) plane of each max, for backward.
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, int B, int C, int H, int W,
                       int k, int st);
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, int B, int C,
                        int H, int W, int k, int st);

// ---- Activations (kernels/cpu/activation.cpp); n elements ------------------------------
void relu_forward(float* out, const float* inp, int64_t n);
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n);  // uses out
// Exact GELU, x * Phi(x) (PyTorch's default approximate='none'), on W lanes at once (AVX-512,
// AVX2 or SSE, picked at run time) with a branch-free erfc: within ~2e-7 * max(1, |x|) of the
// scalar std::erf form (activation.cpp says why and how).
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
// The scalar std::erf / std::exp forms, one libm call per element: the tests' reference.
void gelu_forward_reference(float* out, const float* inp, int64_t n);
void gelu_backward_reference(float* dinp, const float* dout, const float* inp, int64_t n);
// out += bias over rows: x (rows, cols), bias (cols).
void add_bias_rows(float* x, const float* bias, int rows, int cols);

// ---- Dropout (kernels/cpu/dropout.cpp) -------------------------------------------------
// Inverted dropout. The keep decision of element j of global sample g is a pure function of
// (seed, step, g, j): the same mask whatever the number of ranks. Sample b of this batch is
// global sample first_sample + b. mask (B*per_sample) holds 0 or 1/(1-p).
void dropout_forward(float* out, float* mask, const float* inp, int B, int64_t per_sample,
                     float p, uint64_t seed, uint64_t step, int64_t first_sample);
void dropout_backward(float* dinp, const float* dout, const float* mask, int64_t n);

// ---- Softmax cross-entropy (kernels/cpu/softmax_xent.cpp) ------------------------------
// logits (B,C), labels (B). Returns the SUM over the batch of -log p[label] (double for a
// rank-count-independent total); probs (B,C) is written for backward.
double softmax_xent_forward(float* probs, const float* logits, const int32_t* labels, int B,
                            int C);
// dlogits = (probs - onehot(label)) * scale; scale = 1/global_batch makes an allreduce-sum of
// rank gradients equal the mean gradient.
void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* labels, int B,
                           int C, float scale);
// Number of rows whose argmax equals the label.
int64_t count_correct(const float* logits, const int32_t* labels, int B, int C);

// ---- Optimizers (kernels/cpu/optimizer.cpp); n parameters ------------------------------
// PyTorch SGD semantics: g += wd*p; buf = momentum*buf + g (buf = g on the first step);
// p -= lr * (nesterov ? g + momentum*buf : buf).
void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step);
// PyTorch AdamW: p *= 1 - lr*wd; m,v moments; bias-corrected with step t (1-based).
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t);
// dst[i] += src[i] (the conv+pool layer sums its chunks' gradients).
void add_inplace(float* dst, const float* src, int64_t n);
// Sum of squares in double (for global-norm clipping), and in-place scaling.
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float s);

}  // namespace strata::cpu

// ---- GPT-2 transformer ops -------------------------------------------------------------
// Token embedding (kernels/cpu/embedding.cpp), LayerNorm and the residual add
// (kernels/cpu/layernorm.cpp), causal self-attention (kernels/cpu/attention.cpp).
// Activations are (B,T,C) row-major, i.e. N = B*T rows of C. These kernels split their work
// over OpenMP threads (cpu::blas_init sets the count) and give bitwise the same results for
// any thread count: every sum runs in an order fixed by the shapes (and, for the row sums of
// layernorm and softmax, by the machine's vector width: AVX-512, AVX2 or SSE).
namespace strata::cpu {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]. tokens (B*T), each in [0,V) or a UserError is
// thrown; wte (V,C); wpe (maxT,C) with T <= maxT (only its first T rows are read).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int V);
// dwte (V,C): row v = sum of dout[b,t] over the (b,t) whose token is v, added in row order;
// rows of tokens that do not occur are 0 (or left as they are when accumulate).
// dwpe (maxT,C): row t = sum_b dout[b,t], b in order; only rows [0,T) are written, rows from
// T on are not touched (zero them once, or pass T = maxT). Either gradient may be null.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int V, bool accumulate);

// LayerNorm over the last dimension, as PyTorch's nn.LayerNorm(C) (eps 1e-5, biased variance):
// out (N,C) = (inp - mean) * rstd * weight + bias, rstd = 1/sqrt(var + 1e-5). mean (N) and
// rstd (N) are saved for backward; either may be null when no backward follows.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
// dout (N,C), inp (N,C), weight (C), mean and rstd (N) from forward -> dinp (N,C),
// dweight (C) = sum_rows dout * xhat, dbias (C) = sum_rows dout. The row sums run in chunks
// of 64 rows, in order, then chunk by chunk in order.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, bool accumulate);

// out (n) = a + b; out may be a or b. (Its backward is dout to both branches: no kernel.)
void residual_forward(float* out, const float* a, const float* b, int64_t n);

// Causal multi-head self-attention, GPT-2's: qkv (B,T,3C) is the c_attn output [q | k | v],
// head h of q (and of k, v) the columns h*hs..(h+1)*hs, hs = C/NH (C % NH == 0).
// att (B,NH,T,T) = softmax(q k^T / sqrt(hs)) over keys t2 <= t1, in fp32 with the row maximum
// subtracted; entries t2 > t1 are written as 0. out (B,T,C) = att @ v with the heads side by
// side (head h in columns h*hs..(h+1)*hs, nanoGPT's y.transpose(1,2).view(B,T,C)).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) as attention_forward wrote it (its zeros above
// the diagonal are read) -> dqkv (B,T,3C). The gradient of att is kept in a per-thread
// scratch of 64*T floats inside the kernel.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);

}  // namespace strata::cpu
