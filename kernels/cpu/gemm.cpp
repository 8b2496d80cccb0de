// sgemm through oneDNN's JIT GEMM (dnnl_sgemm).
//
// Why oneDNN and not OpenBLAS: on the shapes a training step has (batch 64 against layers of
// 128-1024, per-sample conv GEMMs with K = C*9), oneDNN's sgemm measured 10-40% faster than
// OpenBLAS 0.3.21's SkylakeX kernels (benchmarks/bench_kernels.cpp, docs/architecture.md, "Libraries and why"). It
// also chooses its kernels from the CPU's instruction-set flags (cpuid), where OpenBLAS's
// DYNAMIC_ARCH goes by the CPU model name and falls back to SSE3 kernels, 5x slower, on VMs that
// report a generic model; strata therefore runs fast with no environment variable to know.
// oneDNN's CPU runtime in Debian is OpenMP: its thread count is the OpenMP one.
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "strata/kernels_cpu.h"

namespace strata::cpu {

void blas_init(int threads) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  // Without this OpenMP starts one thread per core in every rank: oversubscribed under MPI.
  omp_set_num_threads(threads < 1 ? 1 : threads);
}

const char* blas_corename() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "oneDNN avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "oneDNN avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "oneDNN avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "oneDNN avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "oneDNN avx2_vnni";
    case dnnl_cpu_isa_avx2: return "oneDNN avx2";
    case dnnl_cpu_isa_avx: return "oneDNN avx";
    case dnnl_cpu_isa_sse41: return "oneDNN sse41";
    default: return "oneDNN";
  }
}

// C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C, all row-major.
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // op(A)*op(B) is zero: C = beta*C (beta 0 clears C, even of NaNs)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda,
                                B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw std::runtime_error(fmt::format("dnnl_sgemm({}, {}, M={}, N={}, K={}) failed: status {}",
                                         trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, int(st)));
}

namespace {

// A oneDNN matmul primitive for one fixed problem (shapes, strides, transposes, epilogue),
// created on first use and kept: its brgemm kernels are generated for exactly that shape.
struct Matmul {
  dnnl::matmul prim;
  dnnl::memory a, b, c, bias;  // descriptors bound to the caller's pointers at each call
  dnnl::memory packed;         // packed B: B in the primitive's blocked layout (in the
  dnnl::reorder pack;          // cache's scratch), and (PackB::reorder) the reorder writing it
  bool ours = false;           // PackB::rounded: that layout is to_bf16_packed_b's
};

// What A, B and C hold: fp32 throughout, bf16 inputs with fp32 C, or u8 (s8) A, s8 B, s32 C.
enum class Types { f32, bf16, u8s8, s8s8 };
// How B reaches the kernels: as the caller has it (they copy it into their layout as they go);
// reordered into their layout by oneDNN first (fp32); or given in fp32 and rounded to bf16
// into their layout by to_bf16_packed_b (bf16).
enum class PackB { none, reorder, rounded };
// (trans_a, trans_b, M, N, K, lda, ldb, ldc, bias, relu, accumulate, types, pack)
using MatmulKey =
    std::tuple<bool, bool, int, int, int, int, int, int, bool, bool, bool, Types, PackB>;

struct MatmulCache {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::map<MatmulKey, Matmul> prims;
  // The packed B of every pack_b primitive, one at a time: as large as the largest B so far.
  std::vector<float> packed_scratch;
  void* scratch(size_t bytes) {
    const size_t floats = bytes / sizeof(float) + 16;  // + room to align to 64 bytes
    if (packed_scratch.size() < floats) packed_scratch.resize(floats);
    const auto at = reinterpret_cast<uintptr_t>(packed_scratch.data());
    return reinterpret_cast<void*>((at + 63) & ~uintptr_t(63));
  }
};

// STRATA_TEST_BF16_PLAIN_B=1 (a test hook, read as each primitive is made): matmul_bf16_rounding_b
// takes its other route, as on a CPU whose kernels read B in another layout (AMX's, say).
bool plain_b_for_tests() {
  const char* v = std::getenv("STRATA_TEST_BF16_PLAIN_B");
  return v && std::string(v) == "1";
}

// Per thread (a stream belongs to one thread); a training run uses a handful of shapes.
MatmulCache& matmul_cache() {
  thread_local MatmulCache cache;
  return cache;
}

Matmul& get_matmul(MatmulCache& mc, const MatmulKey& key) {
  auto it = mc.prims.find(key);
  if (it != mc.prims.end()) return it->second;
  if (mc.prims.size() >= 128) mc.prims.clear();  // shapes that keep changing: bound the memory
  const auto [ta, tb, M, N, K, lda, ldb, ldc, has_bias, relu, accumulate, types, pack] = key;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const bool int8 = types == Types::u8s8 || types == Types::s8s8;
  const dt a_t = types == Types::u8s8   ? dt::u8
                 : types == Types::s8s8 ? dt::s8
                 : types == Types::bf16 ? dt::bf16
                                        : dt::f32;
  const dt b_t = int8 ? dt::s8 : a_t;
  // Row-major op(A) (M,K): element (m,k) at m*lda + k, or at k*lda + m when transposed.
  dnnl::memory::desc a_md(dims{M, K}, a_t, ta ? dims{1, lda} : dims{lda, 1});
  dnnl::memory::desc b_md(dims{K, N}, b_t, tb ? dims{1, ldb} : dims{ldb, 1});
  dnnl::memory::desc c_md(dims{M, N}, int8 ? dt::s32 : dt::f32, dims{ldc, 1});
  dnnl::memory::desc bias_md(dims{1, N}, dt::f32, dims{N, 1});
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (accumulate) ops.append_sum(1.f);  // C = C + product (before any eltwise)
  if (relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  if (accumulate || relu) attr.set_post_ops(ops);
  // Packed: the primitive says which layout its kernels read B in (format_tag::any).
  const dnnl::memory::desc b_use =
      pack != PackB::none ? dnnl::memory::desc(dims{K, N}, b_t, dnnl::memory::format_tag::any)
                          : b_md;
  auto desc = has_bias ? dnnl::matmul::desc(a_md, b_use, bias_md, c_md)
                       : dnnl::matmul::desc(a_md, b_use, c_md);
  dnnl::matmul::primitive_desc pd(desc, attr, mc.eng);
  Matmul m;
  m.prim = dnnl::matmul(pd);
  m.a = dnnl::memory(a_md, mc.eng, DNNL_MEMORY_NONE);
  m.b = dnnl::memory(b_md, mc.eng, DNNL_MEMORY_NONE);
  m.c = dnnl::memory(c_md, mc.eng, DNNL_MEMORY_NONE);
  if (has_bias) m.bias = dnnl::memory(bias_md, mc.eng, DNNL_MEMORY_NONE);
  if (pack != PackB::none) m.packed = dnnl::memory(pd.weights_desc(), mc.eng, DNNL_MEMORY_NONE);
  if (pack == PackB::reorder) m.pack = dnnl::reorder(m.b, m.packed);
  if (pack == PackB::rounded) {  // the layout to_bf16_packed_b writes, or the caller falls back
    const dnnl::memory::desc ours(dims{K, N}, dt::bf16, dnnl::memory::format_tag::BA16a64b2a);
    m.ours = pd.weights_desc() == ours &&
             pd.weights_desc().get_size() == size_t(packed_b_elems(K, N)) * sizeof(bf16_t) &&
             !plain_b_for_tests();
  }
  return mc.prims.emplace(key, std::move(m)).first->second;
}

// A, B and C hold what `types` says (C float unless u8s8, then int32; B float with
// PackB::rounded).
void run_matmul(bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda,
                const void* B, int ldb, void* Cv, int ldc, const float* bias, bool relu,
                bool accumulate, Types types = Types::f32, PackB pack = PackB::none) {
  if (M <= 0 || N <= 0) return;
  if ((types == Types::u8s8 || types == Types::s8s8) && K <= 0) {
    for (int i = 0; i < M; ++i) std::fill_n(static_cast<int32_t*>(Cv) + int64_t(i) * ldc, N, 0);
    return;
  }
  float* C = static_cast<float*>(Cv);
  if (K <= 0) {  // C = (accumulate ? C : 0) + bias (or 0), then ReLU
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[int64_t(i) * ldc + j];
        const float v = (accumulate ? c : 0.f) + (bias ? bias[j] : 0.f);
        c = relu && v < 0.f ? 0.f : v;
      }
    return;
  }
  try {
    MatmulCache& mc = matmul_cache();
    Matmul& m = get_matmul(mc, {trans_a, trans_b, M, N, K, lda, ldb, ldc, bias != nullptr, relu,
                                accumulate, types, pack});
    if (pack == PackB::rounded && !m.ours) {  // a layout of oneDNN's choosing: B rounded as it is
      const int64_t n = trans_b ? int64_t(N - 1) * ldb + K : int64_t(K - 1) * ldb + N;
      bf16_t* b16 = bf16_scratch(kBf16ScratchSlots - 1, size_t(n));
      to_bf16(b16, static_cast<const float*>(B), n);
      return run_matmul(trans_a, trans_b, M, N, K, A, lda, b16, ldb, Cv, ldc, bias, relu,
                        accumulate, Types::bf16);
    }
    m.a.set_data_handle(const_cast<void*>(A));
    m.b.set_data_handle(const_cast<void*>(B));
    m.c.set_data_handle(Cv);
    if (pack != PackB::none)  // B as it is now: nothing kept from the call before
      m.packed.set_data_handle(mc.scratch(m.packed.get_desc().get_size()));
    if (pack == PackB::reorder) m.pack.execute(mc.stream, m.b, m.packed);
    if (pack == PackB::rounded)
      to_bf16_packed_b(static_cast<bf16_t*>(m.packed.get_data_handle()),
                       static_cast<const float*>(B), ldb, trans_b, K, N);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m.a.get()},
                               {DNNL_ARG_WEIGHTS, pack != PackB::none ? m.packed.get() : m.b.get()},
                               {DNNL_ARG_DST, m.c.get()},
                               {DNNL_ARG_BIAS, nullptr}};
    int nargs = 3;
    if (bias) {
      m.bias.set_data_handle(const_cast<float*>(bias));
      args[nargs++].memory = m.bias.get();
    }
    dnnl_status_t st = dnnl_primitive_execute(m.prim.get(), mc.stream.get(), nargs, args);
    if (st != dnnl_success) throw dnnl::error(st, "dnnl_primitive_execute");
  } catch (const dnnl::error& e) {
    throw std::runtime_error(fmt::format("oneDNN {} matmul({}, {}, M={}, N={}, K={}) failed: {} "
                                         "(status {})",
                                         types == Types::bf16  ? "bf16"
                                         : types == Types::f32 ? "fp32"
                                                               : "int8",
                                         trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K,
                                         e.what(), int(e.status)));
  }
}

}  // namespace

void matmul(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
            const float* B, int ldb, float* C, int ldc, const float* bias, bool relu) {
  run_matmul(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, bias, relu, false);
}

void matmul_packed_b(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                     const float* B, int ldb, float* C, int ldc, const float* bias, bool relu) {
  run_matmul(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, bias, relu, false, Types::f32,
             PackB::reorder);
}

void matmul_accumulate(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                       const float* B, int ldb, float* C, int ldc) {
  run_matmul(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, nullptr, false, true);
}

void matmul_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16_t* A, int lda,
                 const bf16_t* B, int ldb, float* C, int ldc, const float* bias, bool relu,
                 bool accumulate) {
  run_matmul(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, bias, relu, accumulate,
             Types::bf16);
}

void matmul_bf16_rounding_b(bool trans_a, bool trans_b, int M, int N, int K, const bf16_t* A,
                            int lda, const float* B, int ldb, float* C, int ldc, const float* bias,
                            bool relu, bool accumulate) {
  run_matmul(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, bias, relu, accumulate,
             Types::bf16, PackB::rounded);
}

void matmul_u8s8(int M, int N, int K, const uint8_t* A, int lda, const int8_t* B, int ldb,
                 int32_t* C, int ldc) {
  run_matmul(false, true, M, N, K, A, lda, B, ldb, C, ldc, nullptr, false, false, Types::u8s8);
}

void matmul_s8s8(int M, int N, int K, const int8_t* A, int lda, const int8_t* B, int ldb,
                 int32_t* C, int ldc) {
  run_matmul(false, false, M, N, K, A, lda, B, ldb, C, ldc, nullptr, false, false, Types::s8s8);
}

std::string int8_matmul_kernels() {
  try {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc a(dims{64, 384}, dt::u8, dims{384, 1});
    const dnnl::memory::desc b(dims{384, 384}, dt::s8, dims{1, 384});
    const dnnl::memory::desc c(dims{64, 384}, dt::s32, dims{384, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng).impl_info_str();
  } catch (const dnnl::error& e) {
    return std::string("none (") + e.what() + ")";
  }
}

// The implementation oneDNN picks for a bf16 matmul of a training-sized shape.
std::string bf16_matmul_kernels() {
  try {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc a(dims{256, 384}, dt::bf16, dims{384, 1});
    const dnnl::memory::desc b(dims{384, 384}, dt::bf16, dims{1, 384});
    const dnnl::memory::desc c(dims{256, 384}, dt::f32, dims{384, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng).impl_info_str();
  } catch (const dnnl::error& e) {
    return std::string("none (") + e.what() + ")";
  }
}

}  // namespace strata::cpu
