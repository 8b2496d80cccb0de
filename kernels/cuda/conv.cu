// Conv2d on cuDNN's convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter),
// NCHW, cross-correlation like the CPU kernel. Per shape and precision a plan holds the
// descriptors and the three algorithms, chosen once by cuDNN's heuristic
// (cudnnGet*Algorithm_v7): the first that succeeds, is deterministic (bitwise-repeatable runs,
// so a resumed run matches) and fits max_workspace_bytes(). The heuristic, unlike cudnnFind*,
// does not time anything, so every run and rank picks the same algorithms.
//
// Precision. fp32: fp32 tensors, CUDNN_FMA_MATH (no TF32). bf16: cuDNN's legacy API needs x,
// w and y of one type, so input, weight and dout are rounded to bf16 copies in the scratch,
// cuDNN computes with fp32 accumulation (PSEUDO_BFLOAT16: bf16 data, FLOAT compute type) into
// a bf16 result, which is widened to fp32 into the caller's buffer (adding the bias, or into
// dweight when accumulating). So the results carry one more bf16 rounding than a GEMM with
// fp32 output, as in PyTorch's bf16 autocast. The bias and its gradient are fp32 in both.
//
// Scratch (the caller's buffer, conv2d_scratch_size floats): a 256-byte aligned base, then in
// bf16 mode X (B,C,H,W) | Wt (OC,C,KH,KW) | Y (B,OC,OH,OW) as bf16, then cuDNN's workspace.
// Backward reuses X for dinp's bf16 result once the filter gradient no longer needs the input,
// and Wt for the weight after the filter gradient has been widened.
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

// Algorithms needing more workspace than this are passed over (FFT ones can want GiBs): 1/32
// of the device's memory, within [256 MiB, 2 GiB]. (A fixed 256 MiB passed over the tensor-op
// algorithms of a 256 x 64 x 56 x 56 bf16 convolution, which want 294 MiB: its backward ran
// 5x slower than fp32 on an H200.) The same on every rank of a run: the total, not the free,
// memory decides.
size_t max_workspace_bytes() {
  static const size_t limit = [] {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      (void)cudaGetLastError();
      total_b = 0;
    }
    return std::clamp(total_b / 32, size_t(256) << 20, size_t(2) << 30);
  }();
  return limit;
}
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct ConvKey {
  int B, C, H, W, OC, KH, KW, stride, pad;
  bool bf16;
  auto tie() const { return std::tie(B, C, H, W, OC, KH, KW, stride, pad, bf16); }
  bool operator<(const ConvKey& o) const { return tie() < o.tie(); }
};

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  // One convolution descriptor per direction: each carries its algorithm's math type.
  cudnnConvolutionDescriptor_t fwd_desc = nullptr, data_desc = nullptr, filter_desc = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t data{};
  cudnnConvolutionBwdFilterAlgo_t filter{};
  size_t ws_bytes = 0;                        // the largest of the three workspaces
  std::string passed_fwd, passed_data, passed_filter;  // the heuristic's better-ranked, refused
  size_t x_off = 0, w_off = 0, y_off = 0, ws_off = 0, total_bytes = 0;  // scratch layout
};

std::mutex g_conv_mutex;
std::map<ConvKey, ConvPlan> g_conv_plans;  // lives until exit (see context.cu)

cudnnConvolutionDescriptor_t make_conv_desc(const Conv2dShape& s) {
  cudnnConvolutionDescriptor_t d;
  STRATA_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&d));
  STRATA_CUDA_CHECK(cudnnSetConvolution2dDescriptor(d, s.pad, s.pad, s.stride, s.stride, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  return d;
}

// Picks from the heuristic's ranked list: the first result that succeeded, is deterministic
// and whose workspace (queried with the math type set on `desc`) fits. fp32 forces
// CUDNN_FMA_MATH on every candidate (as PyTorch does without TF32); bf16 uses the math type
// the heuristic reports with the algorithm. `workspace(algo, &bytes)` returns a cudnnStatus_t.
// Algorithms that sum in a transformed domain (FFT, Winograd) rather than directly: their
// transforms add rounding of their own (~1.7e-4 relative at 256 x 64 x 56 x 56, measured on an
// H200, against ~2e-6 for direct sums).
bool is_transform(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool is_transform(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool is_transform(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// One direction's algorithm: cuDNN's heuristic ranks the candidates (`rank`: its
// Get*Algorithm_v7 call) under the math type asked on the descriptor, and the first that
// passes is taken. `passed` gets the candidates passed over before the one taken, each with
// why ("1 tensor op: not deterministic"), for bench_cuda_ops' report.
template <typename Perf, typename RankFn, typename WorkspaceFn>
auto pick_algo(cudnnConvolutionDescriptor_t desc, bool bf16, RankFn rank, WorkspaceFn workspace,
               size_t* ws_bytes, const char* direction, const Conv2dShape& s,
               std::string* passed) -> decltype(Perf::algo) {
  constexpr int kMaxAlgos = 16;
  STRATA_CUDA_CHECK(cudnnSetConvolutionMathType(desc, bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  Perf perf[kMaxAlgos];
  int count = 0;
  STRATA_CUDA_CHECK(rank(kMaxAlgos, &count, perf));
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[i];
    const std::string name = std::to_string(int(r.algo)) +
                             (r.mathType == CUDNN_TENSOR_OP_MATH ? " tensor op" : "");
    auto skip = [&](const std::string& why) { *passed += (passed->empty() ? "" : "; ") + name + ": " + why; };
    if (r.status != CUDNN_STATUS_SUCCESS) { skip("not supported"); continue; }
    if (r.determinism != CUDNN_DETERMINISTIC) { skip("not deterministic"); continue; }
    // fp32 is strict fp32: direct sums only (see is_transform).
    if (!bf16 && is_transform(r.algo)) { skip("FFT or Winograd (fp32 keeps to direct sums)"); continue; }
    const cudnnMathType_t math = bf16 ? r.mathType : CUDNN_FMA_MATH;
    if (cudnnSetConvolutionMathType(desc, math) != CUDNN_STATUS_SUCCESS) { skip("math type refused"); continue; }
    size_t bytes = 0;
    if (workspace(r.algo, &bytes) != CUDNN_STATUS_SUCCESS) { skip("no workspace size"); continue; }
    if (bytes > max_workspace_bytes()) { skip(std::to_string(bytes >> 20) + " MiB of workspace"); continue; }
    *ws_bytes = bytes;
    return r.algo;
  }
  throw std::runtime_error(std::string("strata::cuda::conv2d: cuDNN offers no deterministic ") +
                           direction + " algorithm for input (" + std::to_string(s.B) + "," +
                           std::to_string(s.C) + "," + std::to_string(s.H) + "," +
                           std::to_string(s.W) + "), weight (" + std::to_string(s.OC) + "," +
                           std::to_string(s.C) + "," + std::to_string(s.KH) + "," +
                           std::to_string(s.KW) + "), stride " + std::to_string(s.stride) +
                           ", pad " + std::to_string(s.pad) + (bf16 ? ", bf16" : ", fp32"));
}

ConvPlan make_plan(const Conv2dShape& s, bool bf16) {
  cudnnHandle_t h = ctx().cudnn;
  const cudnnDataType_t dt = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  ConvPlan p;
  STRATA_CUDA_CHECK(cudnnCreateTensorDescriptor(&p.x));
  STRATA_CUDA_CHECK(cudnnCreateTensorDescriptor(&p.y));
  STRATA_CUDA_CHECK(cudnnCreateFilterDescriptor(&p.w));
  STRATA_CUDA_CHECK(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, dt, s.B, s.C, s.H, s.W));
  STRATA_CUDA_CHECK(
      cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NCHW, s.OC, s.C, s.KH, s.KW));
  p.fwd_desc = make_conv_desc(s);
  p.data_desc = make_conv_desc(s);
  p.filter_desc = make_conv_desc(s);
  int n = 0, c = 0, oh = 0, ow = 0;
  STRATA_CUDA_CHECK(cudnnGetConvolution2dForwardOutputDim(p.fwd_desc, p.x, p.w, &n, &c, &oh, &ow));
  if (n != s.B || c != s.OC || oh != s.OH() || ow != s.OW())
    throw std::logic_error("strata::cuda::conv2d: cuDNN's output shape differs from Conv2dShape's");
  STRATA_CUDA_CHECK(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, dt, n, c, oh, ow));

  size_t ws_fwd = 0, ws_data = 0, ws_filter = 0;
  p.fwd = pick_algo<cudnnConvolutionFwdAlgoPerf_t>(
      p.fwd_desc, bf16,
      [&](int n, int* count, cudnnConvolutionFwdAlgoPerf_t* perf) {
        return cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.fwd_desc, p.y, n, count, perf);
      },
      [&](cudnnConvolutionFwdAlgo_t a, size_t* b) {
        return cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.fwd_desc, p.y, a, b);
      },
      &ws_fwd, "forward", s, &p.passed_fwd);
  p.data = pick_algo<cudnnConvolutionBwdDataAlgoPerf_t>(
      p.data_desc, bf16,
      [&](int n, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.data_desc, p.x, n, count,
                                                           perf);
      },
      [&](cudnnConvolutionBwdDataAlgo_t a, size_t* b) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.data_desc, p.x, a, b);
      },
      &ws_data, "backward-data", s, &p.passed_data);
  p.filter = pick_algo<cudnnConvolutionBwdFilterAlgoPerf_t>(
      p.filter_desc, bf16,
      [&](int n, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.filter_desc, p.w, n,
                                                             count, perf);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* b) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.filter_desc, p.w, a,
                                                              b);
      },
      &ws_filter, "backward-filter", s, &p.passed_filter);
  p.ws_bytes = std::max({ws_fwd, ws_data, ws_filter});

  size_t off = 0;
  if (bf16) {
    const size_t half = sizeof(__nv_bfloat16);
    p.x_off = off;
    off = align_up(off + half * size_t(s.B) * s.C * s.H * s.W);
    p.w_off = off;
    off = align_up(off + half * size_t(s.OC) * s.C * s.KH * s.KW);
    p.y_off = off;
    off = align_up(off + half * size_t(s.B) * s.OC * s.OH() * s.OW());
  }
  p.ws_off = off;
  p.total_bytes = off + p.ws_bytes;
  return p;
}

void check_shape(const Conv2dShape& s) {
  if (s.B < 0 || s.C <= 0 || s.H <= 0 || s.W <= 0 || s.OC <= 0 || s.KH <= 0 || s.KW <= 0 ||
      s.stride <= 0 || s.pad < 0 || s.OH() <= 0 || s.OW() <= 0)
    throw std::invalid_argument("strata::cuda::conv2d: invalid shape");
}

const ConvPlan& plan_for(const Conv2dShape& s) {
  const bool bf16 = ctx().bf16;
  const ConvKey key{s.B, s.C, s.H, s.W, s.OC, s.KH, s.KW, s.stride, s.pad, bf16};
  std::lock_guard lock(g_conv_mutex);
  auto it = g_conv_plans.find(key);
  if (it == g_conv_plans.end()) it = g_conv_plans.emplace(key, make_plan(s, bf16)).first;
  return it->second;  // std::map nodes do not move: the reference stays valid
}

// The scratch's first 256-byte aligned address (conv2d_scratch_size counts the slack).
char* scratch_base(float* scratch) {
  const auto a = reinterpret_cast<uintptr_t>(scratch);
  return reinterpret_cast<char*>((a + kAlign - 1) / kAlign * kAlign);
}

// ---- Conversion and bias kernels -------------------------------------------------------

__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  STRATA_GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

void to_bf16(__nv_bfloat16* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(dst, src, n);
  STRATA_CUDA_LAUNCHED();
}

// dst (n) = (accumulate ? dst : 0) + src
__global__ void widen_kernel(float* dst, const __nv_bfloat16* src, int64_t n, bool accumulate) {
  STRATA_GRID_STRIDE(i, n) {
    const float v = __bfloat162float(src[i]);
    dst[i] = accumulate ? dst[i] + v : v;
  }
}

void widen(float* dst, const __nv_bfloat16* src, int64_t n, bool accumulate) {
  if (n <= 0) return;
  widen_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(dst, src, n, accumulate);
  STRATA_CUDA_LAUNCHED();
}

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// out (B,OC,P) = y (B,OC,P) + bias (OC); y may be out itself (fp32) or the bf16 result.
template <typename T, typename I>
__global__ void output_bias_kernel(float* out, const T* y, const float* bias, I n, I P, I OC) {
  STRATA_GRID_STRIDE_T(I, i, n) {
    float v = to_float(y[i]);
    if (bias) v += bias[(i / P) % OC];
    out[i] = v;
  }
}

template <typename T>
void output_bias(float* out, const T* y, const float* bias, const Conv2dShape& s) {
  const int64_t P = int64_t(s.OH()) * s.OW(), n = int64_t(s.B) * s.OC * P;
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    output_bias_kernel<T, I><<<blocks_for(n), kThreads, 0, ctx().stream>>>(out, y, bias, I(n),
                                                                          I(P), I(s.OC));
  });
  STRATA_CUDA_LAUNCHED();
}

// dbias (OC) (+)= sum over b, p of dout (B,OC,P). Pass 1: block (oc, chunk) sums samples
// [chunk*per, (chunk+1)*per) of channel oc into partial (chunks, OC); pass 2 adds the chunks
// in order (deterministic). With one chunk pass 1 writes dbias.
__global__ void conv_bias_grad_partial_kernel(float* partial, float* dbias, const float* dout,
                                              int B, int OC, int64_t P, int per_chunk,
                                              bool accumulate) {
  const int oc = blockIdx.x;
  const int b0 = blockIdx.y * per_chunk, b1 = min(B, b0 + per_chunk);
  float s = 0.f;
  for (int b = b0; b < b1; ++b) {
    const float* plane = dout + (int64_t(b) * OC + oc) * P;
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) s += plane[p];
  }
  s = block_sum(s);
  if (threadIdx.x == 0) {
    if (gridDim.y == 1)
      dbias[oc] = accumulate ? dbias[oc] + s : s;
    else
      partial[int64_t(blockIdx.y) * OC + oc] = s;
  }
}

__global__ void conv_bias_grad_final_kernel(float* dbias, const float* partial, int chunks,
                                            int OC, bool accumulate) {
  const int oc = blockIdx.x * blockDim.x + threadIdx.x;
  if (oc >= OC) return;
  float t = 0.f;
  for (int c = 0; c < chunks; ++c) t += partial[int64_t(c) * OC + oc];
  dbias[oc] = accumulate ? dbias[oc] + t : t;
}

void conv_bias_grad(float* dbias, const float* dout, const Conv2dShape& s, bool accumulate) {
  Context& cx = ctx();
  const int64_t P = int64_t(s.OH()) * s.OW();
  // ~2 blocks per SM in all, each chunk at least 8K elements (32 per thread).
  const int max_chunks = int(std::clamp<int64_t>(int64_t(s.B) * P / 8192, 1, std::max(s.B, 1)));
  const int chunks = std::clamp((2 * cx.sm_count + s.OC - 1) / s.OC, 1, max_chunks);
  const int per_chunk = std::max(1, (s.B + chunks - 1) / chunks);
  float* partial = chunks > 1
                       ? static_cast<float*>(reduce_scratch(sizeof(float) * size_t(chunks) * s.OC))
                       : nullptr;
  conv_bias_grad_partial_kernel<<<dim3(s.OC, chunks), kThreads, 0, cx.stream>>>(
      partial, dbias, dout, s.B, s.OC, P, per_chunk, accumulate);
  STRATA_CUDA_LAUNCHED();
  if (chunks > 1) {
    conv_bias_grad_final_kernel<<<(s.OC + 255) / 256, 256, 0, cx.stream>>>(dbias, partial, chunks,
                                                                          s.OC, accumulate);
    STRATA_CUDA_LAUNCHED();
  }
}

int64_t weight_size(const Conv2dShape& s) { return int64_t(s.OC) * s.C * s.KH * s.KW; }

}  // namespace

// The algorithms chosen for this shape at the current precision, with their math types and
// the workspace: "fwd 1 (tensor op) bwd-data 1 (fma) bwd-filter 3 (tensor op), 12.0 MiB".
std::string conv2d_algorithms(const Conv2dShape& s) {
  check_shape(s);
  const ConvPlan& p = plan_for(s);
  auto math = [](cudnnConvolutionDescriptor_t d) {
    cudnnMathType_t m{};
    cudnnGetConvolutionMathType(d, &m);
    return m == CUDNN_TENSOR_OP_MATH ? "tensor op"
           : m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "tensor op, conversion"
           : m == CUDNN_FMA_MATH ? "fma" : "default";
  };
  return "fwd " + std::to_string(int(p.fwd)) + " (" + math(p.fwd_desc) + ") bwd-data " +
         std::to_string(int(p.data)) + " (" + math(p.data_desc) + ") bwd-filter " +
         std::to_string(int(p.filter)) + " (" + math(p.filter_desc) + "), workspace " +
         std::to_string(p.ws_bytes >> 20) + " MiB" +
         (p.passed_fwd.empty() ? "" : "; fwd passed over " + p.passed_fwd) +
         (p.passed_data.empty() ? "" : "; bwd-data passed over " + p.passed_data) +
         (p.passed_filter.empty() ? "" : "; bwd-filter passed over " + p.passed_filter);
}

// Floats of scratch for this shape at the current precision (chooses the algorithms).
int64_t conv2d_scratch_size(const Conv2dShape& s) {
  check_shape(s);
  if (s.B == 0) return 0;
  const ConvPlan& p = plan_for(s);
  return int64_t((p.total_bytes + kAlign + sizeof(float) - 1) / sizeof(float));
}

// inp (B,C,H,W), weight (OC,C,KH,KW), bias (OC) -> out (B,OC,OH,OW)
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, float* scratch) {
  check_shape(s);
  if (s.B == 0) return;
  Context& cx = ctx();
  const ConvPlan& p = plan_for(s);
  char* base = scratch_base(scratch);
  void* ws = p.ws_bytes ? base + p.ws_off : nullptr;
  const float one = 1.f, zero = 0.f;
  if (!cx.bf16) {
    STRATA_CUDA_CHECK(cudnnConvolutionForward(cx.cudnn, &one, p.x, inp, p.w, weight, p.fwd_desc,
                                              p.fwd, ws, p.ws_bytes, &zero, p.y, out));
    if (bias) output_bias<float>(out, out, bias, s);
    return;
  }
  auto* xb = reinterpret_cast<__nv_bfloat16*>(base + p.x_off);
  auto* wb = reinterpret_cast<__nv_bfloat16*>(base + p.w_off);
  auto* yb = reinterpret_cast<__nv_bfloat16*>(base + p.y_off);
  to_bf16(xb, inp, int64_t(s.B) * s.C * s.H * s.W);
  to_bf16(wb, weight, weight_size(s));
  STRATA_CUDA_CHECK(cudnnConvolutionForward(cx.cudnn, &one, p.x, xb, p.w, wb, p.fwd_desc, p.fwd,
                                            ws, p.ws_bytes, &zero, p.y, yb));
  output_bias<__nv_bfloat16>(out, yb, bias, s);
}

// dout (B,OC,OH,OW), inp (B,C,H,W), weight (OC,C,KH,KW)
//   -> dinp (B,C,H,W) (overwritten), dweight (OC,C,KH,KW), dbias (OC) (added to if accumulate)
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, const Conv2dShape& s, float* scratch,
                     bool accumulate) {
  check_shape(s);
  if (s.B == 0) {
    if (!accumulate && dweight) zero(dweight, sizeof(float) * weight_size(s));
    if (!accumulate && dbias) zero(dbias, sizeof(float) * s.OC);
    return;
  }
  Context& cx = ctx();
  if (dbias) conv_bias_grad(dbias, dout, s, accumulate);
  if (!dweight && !dinp) return;
  const ConvPlan& p = plan_for(s);
  char* base = scratch_base(scratch);
  void* ws = p.ws_bytes ? base + p.ws_off : nullptr;
  const float one = 1.f, zero_f = 0.f;
  const int64_t n_in = int64_t(s.B) * s.C * s.H * s.W;
  if (!cx.bf16) {
    if (dweight)
      STRATA_CUDA_CHECK(cudnnConvolutionBackwardFilter(
          cx.cudnn, &one, p.x, inp, p.y, dout, p.filter_desc, p.filter, ws, p.ws_bytes,
          accumulate ? &one : &zero_f, p.w, dweight));
    if (dinp)
      STRATA_CUDA_CHECK(cudnnConvolutionBackwardData(cx.cudnn, &one, p.w, weight, p.y, dout,
                                                     p.data_desc, p.data, ws, p.ws_bytes,
                                                     &zero_f, p.x, dinp));
    return;
  }
  auto* xb = reinterpret_cast<__nv_bfloat16*>(base + p.x_off);  // inp, later dinp's result
  auto* wb = reinterpret_cast<__nv_bfloat16*>(base + p.w_off);  // dweight's result, later weight
  auto* yb = reinterpret_cast<__nv_bfloat16*>(base + p.y_off);  // dout
  to_bf16(yb, dout, int64_t(s.B) * s.OC * s.OH() * s.OW());
  if (dweight) {
    to_bf16(xb, inp, n_in);
    STRATA_CUDA_CHECK(cudnnConvolutionBackwardFilter(cx.cudnn, &one, p.x, xb, p.y, yb,
                                                     p.filter_desc, p.filter, ws, p.ws_bytes,
                                                     &zero_f, p.w, wb));
    widen(dweight, wb, weight_size(s), accumulate);
  }
  if (dinp) {
    to_bf16(wb, weight, weight_size(s));
    STRATA_CUDA_CHECK(cudnnConvolutionBackwardData(cx.cudnn, &one, p.w, wb, p.y, yb, p.data_desc,
                                                   p.data, ws, p.ws_bytes, &zero_f, p.x, xb));
    widen(dinp, xb, n_in, false);
  }
}

}  // namespace strata::cuda
