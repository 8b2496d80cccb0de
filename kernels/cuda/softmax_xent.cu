// Softmax + cross-entropy, fused, one warp per row (the class count is small: 10..1000), and
// count_correct. The loss is a double per row, summed on the device in a fixed order.
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

constexpr int kRowsPerBlock = kThreads / 32;

struct XentResult {
  double loss;        // sum over the batch
  int32_t bad_row;    // first row whose label is outside [0, C), or -1
  int32_t bad_label;
};

__device__ inline float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// logits (B,C), labels (B) -> probs (B,C), row_loss (B) = -log softmax(logits_b)[label_b]
// (0 for a label outside [0, C): the reduction reports it). As the CPU: p = exp(x - max) (no
// overflow), normalised by their sum; -log p[label] = log(sum) - (x[label] - max) in double.
__global__ void softmax_xent_forward_kernel(float* probs, double* row_loss, const float* logits,
                                            const int32_t* labels, int B, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= B) return;  // the whole warp: row is per warp
  const float* x = logits + int64_t(row) * C;
  float* p = probs + int64_t(row) * C;
  float mx = -INFINITY;
  for (int c = lane; c < C; c += 32) mx = fmaxf(mx, x[c]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float e = expf(x[c] - mx);
    p[c] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  const float inv = 1.f / sum;
  for (int c = lane; c < C; c += 32) p[c] *= inv;
  if (lane == 0) {
    const int32_t label = labels[row];
    row_loss[row] = label >= 0 && label < C
                        ? log(double(sum)) - (double(x[label]) - double(mx))
                        : 0.0;
  }
}

__device__ inline int block_min(int v) {
  __shared__ int partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : INT_MAX;
  if (warp == 0)
    for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// One block: the batch's loss (fixed order: deterministic) and the first bad label. The launch
// bound makes nvcc keep to 64 registers a thread, so 1024 threads fit one SM's 64 Ki registers.
constexpr int kReduceThreads = 1024;
__global__ void __launch_bounds__(kReduceThreads) xent_reduce_kernel(XentResult* res, const double* row_loss,
                                   const int32_t* labels, int B, int C) {
  double s = 0.0;
  int bad = INT_MAX;
  for (int b = threadIdx.x; b < B; b += blockDim.x) {
    s += row_loss[b];
    const int32_t l = labels[b];
    if ((l < 0 || l >= C) && b < bad) bad = b;
  }
  s = block_sum(s);
  bad = block_min(bad);
  if (threadIdx.x == 0) {
    res->loss = s;
    res->bad_row = bad == INT_MAX ? -1 : bad;
    res->bad_label = bad == INT_MAX ? 0 : labels[bad];
  }
}

// probs (B,C), labels (B) -> dlogits (B,C) = (probs - onehot(labels)) * scale. A label outside
// [0, C) (forward has already thrown for it) adds no one-hot.
template <typename I>
__global__ void softmax_xent_backward_kernel(float* dlogits, const float* probs,
                                             const int32_t* labels, I n, int C, float scale) {
  STRATA_GRID_STRIDE_T(I, i, n) {
    const I b = i / C;
    const int c = int(i - b * C);
    const float p = probs[i];
    dlogits[i] = c == labels[b] ? (p - 1.f) * scale : p * scale;
  }
}

// One warp per row: the CPU's argmax, x[c] > x[best] scanning from best = 0, is the first
// index of the largest non-NaN value, or 0 when x[0] is NaN. Lanes take their own (value,
// index) candidates, then the warp keeps the larger value, the smaller index on ties
// (INT_MAX = no candidate yet). Integer atomics: the count is exact whatever the order.
__global__ void count_correct_kernel(unsigned long long* count, const float* logits,
                                     const int32_t* labels, int B, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= B) return;
  const float* x = logits + int64_t(row) * C;
  float best = 0.f;
  int best_i = INT_MAX;
  for (int c = lane; c < C; c += 32) {
    const float v = x[c];
    if (v == v && (best_i == INT_MAX || v > best)) {
      best = v;
      best_i = c;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    if (oi != INT_MAX && (best_i == INT_MAX || ov > best || (ov == best && oi < best_i))) {
      best = ov;
      best_i = oi;
    }
  }
  if (lane == 0) {
    const float x0 = x[0];
    const int pred = x0 != x0 ? 0 : best_i;
    if (pred == labels[row]) atomicAdd(count, 1ull);
  }
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

// logits (B,C), labels (B) -> probs (B,C); returns sum_b -log softmax(logits_b)[label_b]
double softmax_xent_forward(float* probs, const float* logits, const int32_t* labels, int B,
                            int C) {
  if (B <= 0) return 0.0;
  if (C <= 0) throw std::invalid_argument("strata::cuda::softmax_xent_forward: no classes");
  cudaStream_t s = ctx().stream;
  char* scratch = static_cast<char*>(reduce_scratch(align256(sizeof(XentResult)) + sizeof(double) * size_t(B)));
  auto* res = reinterpret_cast<XentResult*>(scratch);
  auto* row_loss = reinterpret_cast<double*>(scratch + align256(sizeof(XentResult)));
  softmax_xent_forward_kernel<<<(B + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(
      probs, row_loss, logits, labels, B, C);
  STRATA_CUDA_LAUNCHED();
  xent_reduce_kernel<<<1, kReduceThreads, 0, s>>>(res, row_loss, labels, B, C);
  STRATA_CUDA_LAUNCHED();
  const auto r = *static_cast<const XentResult*>(fetch_result(res, sizeof(XentResult)));
  if (r.bad_row >= 0)
    throw std::runtime_error("label " + std::to_string(r.bad_label) + " of batch row " +
                             std::to_string(r.bad_row) + " is outside [0, " + std::to_string(C) +
                             ")");
  return r.loss;
}

// probs (B,C), labels (B) -> dlogits (B,C)
void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* labels, int B,
                           int C, float scale) {
  const int64_t n = int64_t(B) * C;
  if (n <= 0) return;
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    softmax_xent_backward_kernel<I><<<blocks_for(n), kThreads, 0, ctx().stream>>>(
        dlogits, probs, labels, I(n), C, scale);
  });
  STRATA_CUDA_LAUNCHED();
}

// logits (B,C), labels (B) -> number of rows whose first maximum is at the label
int64_t count_correct(const float* logits, const int32_t* labels, int B, int C) {
  if (B <= 0 || C <= 0) return 0;
  cudaStream_t s = ctx().stream;
  auto* count = static_cast<unsigned long long*>(reduce_scratch(sizeof(unsigned long long)));
  STRATA_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof *count, s));
  count_correct_kernel<<<(B + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(
      count, logits, labels, B, C);
  STRATA_CUDA_LAUNCHED();
  return int64_t(*static_cast<const unsigned long long*>(fetch_result(count, sizeof *count)));
}

}  // namespace strata::cuda
