// GPT-2's layers: token + position embedding, the pre-LayerNorm transformer block, the final
// LayerNorm and the output layer tied to the token embedding. Per sample, activations are
// (T, C); the ops see N = B*T rows. Forward and backward of each side by side; the kernels
// are the backend's (kernels/cpu/{embedding,layernorm,attention}.cpp on the CPU).
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "model/layers.h"
#include "strata/comm.h"
#include "strata/error.h"

namespace strata {
namespace {

using Init = Param::Init;

int rows_of(const Tensor& t) { return int(t.dim(0) * t.dim(1)); }  // B*T

// A padded token table's gradient rows past the vocabulary: zero, as the table's rows are
// (no kernel writes them; zeroed here each step so nothing else need be trusted to).
void zero_padded_rows(const Backend& be, const Param& table) {
  if (table.used_rows <= 0 || table.used_rows >= table.shape[0]) return;
  const int64_t C = table.shape[1];
  be.memory->zero(table.grad + table.used_rows * C,
                  sizeof(float) * size_t((table.shape[0] - table.used_rows) * C));
}

class Embedding final : public SplitLayer {
 public:
  Embedding(int V, int C, int T, int row_multiple)
      : V_(V), Vp_(int(padded_vocab(V, row_multiple))), C_(C), T_(T) {
    params = {{.name = "wte", .shape = {Vp_, C}, .fan_in = C, .init = Init::kNormal,
               .used_rows = Vp_ > V ? V : 0},
              {.name = "wpe", .shape = {T, C}, .fan_in = C, .init = Init::kNormal}};
  }
  std::vector<Op> ops() const override {
    return {Op::embedding_forward, Op::embedding_backward};
  }
  std::string describe() const override {
    return fmt::format("Embedding(vocab {}, dim {}, context {}{})", V_, C_, T_,
                       Vp_ > V_ ? fmt::format(", table padded to {} rows", Vp_) : "");
  }
  Shape output_shape(const Shape& in) const override {
    if (in.size() != 1 || in[0] < 1 || in[0] > T_)
      fail_input("model: {} takes up to {} token ids per sample, got shape {}", describe(), T_,
                 shape_str(in));
    return {in[0], C_};
  }
  double flops_per_sample(const Shape&) const override { return 0; }
  // x (B, t): token ids as floats (exact below 2^24), from the loader, in the backend's memory.
  // Kept as int32 per slot for backward: on the host, converted straight from x; in device
  // memory, x is downloaded (B*t floats), converted and checked on the host (a kernel cannot
  // report a bad id), and the int32 ids uploaded.
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    const int B = int(x.dim(0)), t = int(x.dim(1));
    const size_t n = size_t(B) * size_t(t);
    auto& tok = tokens_[si.slot];
    tok.resize(n);
    if (be.host_memory()) {
      for (size_t i = 0; i < n; ++i) tok[i] = int32_t(x.data()[i]);  // the kernel checks them
    } else {
      host_ids_.resize(n);
      be.download(host_ids_.data(), x.data(), sizeof(float) * n);
      for (size_t i = 0; i < n; ++i) {
        const float id = host_ids_[i];
        if (!(id >= 0.f && id < float(V_)))
          fail_input("token {} at batch row {}, position {} is outside the vocabulary [0, {})",
                     id, i / size_t(t), i % size_t(t), V_);
        tok[i] = int32_t(id);
      }
      Tensor& d = device_tokens_[si.slot];
      d.resize({int64_t(n)}, *be.memory);
      be.upload(d.i32(), tok.data(), sizeof(int32_t) * n);
    }
    be.embedding_forward(y.data(), token_ids(be, si.slot), params[0].value, params[1].value, B, t, C_, V_);
  }
  // No input gradient (token ids): B has nothing to do, W is the whole backward.
  void grads(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy, Tensor*,
             int slot, bool param_grads, bool accumulate) override {
    if (!param_grads) return;
    const int B = int(x.dim(0)), t = int(x.dim(1));
    // A tied head has already written its share of the token table's gradient: add to it.
    be.embedding_backward(tied_ ? nullptr : params[0].grad, params[1].grad, dy.data(),
                          token_ids(be, slot), B, t, C_, V_, accumulate);
    if (tied_)
      be.embedding_backward(params[0].grad, nullptr, dy.data(), token_ids(be, slot), B, t, C_, V_,
                            /*accumulate=*/true);
    if (t < T_ && !accumulate)  // positions this batch did not reach get no gradient
      be.memory->zero(params[1].grad + int64_t(t) * C_, sizeof(float) * size_t(T_ - t) * C_);
    if (!tied_ && !accumulate) zero_padded_rows(be, params[0]);  // (a tied head does it)
  }
  int V_, Vp_, C_, T_;
  bool tied_ = false;

 private:
  // This slot's ids where the backend's kernels read them.
  const int32_t* token_ids(const Backend& be, int slot) {
    return be.host_memory() ? tokens_[slot].data() : device_tokens_[slot].i32();
  }
  PerSlot<std::vector<int32_t>> tokens_;
  PerSlot<Tensor> device_tokens_;  // in the backend's memory, when that is not the host's
  std::vector<float> host_ids_;  // x downloaded from device memory
};

class LayerNorm final : public SplitLayer {
 public:
  explicit LayerNorm(int C) : C_(C) {
    params = {{.name = "weight", .shape = {C}, .init = Init::kOnes},
              {.name = "bias", .shape = {C}, .init = Init::kZeros}};
  }
  std::vector<Op> ops() const override {
    return {Op::layernorm_forward, Op::layernorm_backward};
  }
  std::string describe() const override { return fmt::format("LayerNorm({})", C_); }
  Shape output_shape(const Shape& in) const override {
    if (in.empty() || in.back() != C_)
      fail_input("model: {} needs {} features last, got shape {}", describe(), C_, shape_str(in));
    return in;
  }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    const int N = rows_of(x);
    auto& s = stats_[si.slot];
    s.resize({2, int64_t(N)}, *be.memory);
    be.layernorm_forward(y.data(), s.data(), s.data() + N, x.data(), params[0].value,
                         params[1].value, N, C_);
  }
  // The kernel computes dx and the parameters' sums independently, each skipped when null.
  void grads(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
             int slot, bool param_grads, bool accumulate) override {
    const int N = rows_of(x);
    const auto& s = stats_[slot];
    be.layernorm_backward(dx ? dx->data() : nullptr, param_grads ? params[0].grad : nullptr,
                          param_grads ? params[1].grad : nullptr, dy.data(), x.data(),
                          params[0].value, s.data(), s.data() + N, N, C_, accumulate);
  }
  double flops_per_sample(const Shape& in) const override { return 8.0 * double(numel(in)); }

 private:
  int C_;
  PerSlot<Tensor> stats_;  // mean (N) then rstd (N)
};

// Logits (T, V) = x (T, C) @ wte^T, no bias (GPT-2's lm_head shares the token table).
class LmHead final : public SplitLayer {
 public:
  explicit LmHead(int V) : V_(V) {}
  std::vector<Op> ops() const override {
    return {Op::linear_forward, Op::linear_backward};
  }
  std::string describe() const override { return fmt::format("LM head (vocab {}, tied)", V_); }
  Shape output_shape(const Shape& in) const override {
    if (in.size() != 2) fail_input("model: {} needs (T, C) per sample, got {}", describe(), shape_str(in));
    return {in[0], V_};
  }
  double flops_per_sample(const Shape& in) const override { return 2.0 * double(numel(in)) * V_; }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    STRATA_CHECK(wte_, "{} is not tied to an embedding", name);
    if (!int8_linear(int8, name + ".weight", be, y.data(), x.data(), nullptr, rows_of(x),
                     int(x.dim(2)), V_, false))
      be.linear_forward(y.data(), x.data(), wte_->value, nullptr, rows_of(x), int(x.dim(2)), V_);
  }
  // Its own int8 copy of the token table (the embedding keeps reading the fp32 one).
  std::vector<Int8Target> int8_targets() const override {
    if (!wte_) return {};
    // Its first V rows: a padded table's padding has no logits to give.
    return {{name + ".weight", wte_->name, V_, int(wte_->shape[1])}};
  }
  // Runs before the embedding's backward, which adds its part to the same gradient (W runs in
  // the same layer order, so the sum's order is the same).
  void grads(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, int,
             bool param_grads, bool accumulate) override {
    be.linear_backward(dx ? dx->data() : nullptr, param_grads ? wte_->grad : nullptr, nullptr,
                       dy.data(), x.data(), wte_->value, rows_of(x), int(x.dim(2)), V_, accumulate);
    if (param_grads && !accumulate) zero_padded_rows(be, *wte_);
  }
  int V_;
  Param* wte_ = nullptr;
};

// What a block's backward needs from its forward, and the block's workspaces. fc: c_fc's output,
// or, where fc_grad says so, GELU's derivative there (Block::gelu_forward).
struct BlockActs {
  Tensor ln1, st1, qkv, att, y, res1, ln2, st2, fc, fcg;
  bool fc_grad = false;
};
struct BlockWorkspace {
  BlockActs recomputed;  // recompute: refilled by each block's backward in turn
  Tensor tmp, out, g, g4, g4b, gc, gr, g3;
};
// One set per thread, shared by every block: only one block runs at a time, and none keeps
// anything here from one call to the next (so recompute keeps one block's activations alive,
// not one per block).
BlockWorkspace& block_workspace() {
  static thread_local BlockWorkspace w;
  return w;
}

// One GPT-2 block: x + drop(proj(attn(ln_1(x)))), then + drop(mlp(ln_2(.))), mlp = 4C GELU
// (the exact erf form, or GPT-2's tanh form with gelu_tanh).
// Tensor parallel (Megatron-LM): c_attn and c_fc are split by output rows (this rank's heads,
// its share of the MLP units), both c_proj by input columns; each rank's c_proj gives a partial
// sum of the branch output, allreduced over the tensor group (the bias added once, by rank 0).
// Backward mirrors it: the gradient at each branch's input (the LayerNorm's output) is a
// partial sum, allreduced. Everything outside the split parts is computed in full, and the
// same, on every rank of the group.
class Block final : public Layer {
 public:
  Block(int C, int NH, int blocks, float p, int index, bool recompute, bool gelu_tanh, TensorSplit tp)
      : C_(C), NH_(NH), p_(p), index_(index), recompute_(recompute), gelu_tanh_(gelu_tanh), tp_(tp) {
    const int S = tp.size;
    // GPT-2's init: N(0, 0.02) weights, zero biases, and the two projections that write into
    // the residual stream scaled by 1/sqrt(2 * blocks).
    const float proj_std = 0.02f / std::sqrt(2.0f * float(blocks));
    // Each parameter: {shape here, whole shape, split dim, groups} (see Param).
    auto rows = [&](int groups, int64_t whole_rows, Shape rest) {  // column-parallel
      Shape here{whole_rows / S}, whole{whole_rows};
      for (auto d : rest) here.push_back(d), whole.push_back(d);
      return std::tuple{here, whole, S > 1 ? 0 : -1, groups};
    };
    auto cols = [&](int64_t r, int64_t whole_cols) {  // row-parallel
      return std::tuple{Shape{r, whole_cols / S}, Shape{r, whole_cols}, S > 1 ? 1 : -1, 1};
    };
    auto whole = [](Shape sh) { return std::tuple{sh, sh, -1, 1}; };
    auto param = [](std::string name, std::tuple<Shape, Shape, int, int> sp, int64_t fan_in,
                    Init init, float sd = 0.02f) {
      auto [here, w, dim, groups] = sp;
      return Param{.name = std::move(name), .shape = here, .fan_in = fan_in, .init = init,
                   .std = sd, .whole_shape = w, .split_dim = dim, .split_groups = groups};
    };
    params.resize(kNumParams);
    params[kLn1W] = param("ln_1.weight", whole({C}), 1, Init::kOnes);
    params[kLn1B] = param("ln_1.bias", whole({C}), 1, Init::kZeros);
    params[kAttnW] = param("attn.c_attn.weight", rows(3, 3 * C, {C}), C, Init::kNormal);
    params[kAttnB] = param("attn.c_attn.bias", rows(3, 3 * C, {}), 1, Init::kZeros);
    params[kAttnProjW] = param("attn.c_proj.weight", cols(C, C), C, Init::kNormal, proj_std);
    params[kAttnProjB] = param("attn.c_proj.bias", whole({C}), 1, Init::kZeros);
    params[kLn2W] = param("ln_2.weight", whole({C}), 1, Init::kOnes);
    params[kLn2B] = param("ln_2.bias", whole({C}), 1, Init::kZeros);
    params[kFcW] = param("mlp.c_fc.weight", rows(1, 4 * C, {C}), C, Init::kNormal);
    params[kFcB] = param("mlp.c_fc.bias", rows(1, 4 * C, {}), 1, Init::kZeros);
    params[kMlpProjW] = param("mlp.c_proj.weight", cols(C, 4 * C), 4 * C, Init::kNormal, proj_std);
    params[kMlpProjB] = param("mlp.c_proj.bias", whole({C}), 1, Init::kZeros);
  }
  std::vector<Op> ops() const override {
    return {Op::layernorm_forward, Op::layernorm_backward, Op::linear_forward,
            Op::linear_backward, Op::attention_forward, Op::attention_backward,
            gelu_tanh_ ? Op::gelu_tanh_forward : Op::gelu_forward,
            gelu_tanh_ ? Op::gelu_tanh_backward : Op::gelu_backward, Op::residual_forward,
            Op::dropout_forward, Op::dropout_backward};
  }
  std::string describe() const override {
    return fmt::format("Block(dim {}, heads {}{}{}{}{})", C_, NH_, gelu_tanh_ ? ", tanh GELU" : "",
                       p_ > 0 ? fmt::format(", dropout {}", p_) : "", recompute_ ? ", recompute" : "",
                       tp_.size > 1 ? fmt::format(", {} heads on each of {} ranks", NH_ / tp_.size, tp_.size) : "");
  }
  Shape output_shape(const Shape& in) const override {
    if (in.size() != 2 || in[1] != C_)
      fail_input("model: {} needs (T, {}) per sample, got {}", describe(), C_, shape_str(in));
    return in;
  }
  double flops_per_sample(const Shape& in) const override {
    const double T = double(in[0]), C = C_;
    return (2.0 * T * 12.0 * C * C + 4.0 * T * T * C) / tp_.size;  // the GEMMs, QK^T and att@V
  }
  int64_t internal_bytes_per_sample(const Shape& in) const override {
    int64_t n = 0;
    for (const auto& [t, shape] : act_shapes(1, int(in[0]))) n += numel(shape);
    return int64_t(sizeof(float)) * n;
  }
  bool recomputes() const override { return recompute_; }

  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& s) override {
    step_[s.slot] = s;
    BlockActs& a = recompute_ ? block_workspace().recomputed : acts_[s.slot];
    run_forward(be, x, y.data(), s, a, masks_[s.slot]);
  }

  void backward(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                int slot, bool accumulate) override {
    input_pass(be, x, dy, dx, slot, accumulate, nullptr);
  }
  // B and W. B runs the chain of input gradients with the parameter gradients left out and
  // keeps, per slot, the gradients at the outputs of the six ops with parameters
  // (3C + 7C/S floats per position, 4C + 7C/S with dropout, S tensor parts: BlockGrads); W runs
  // the six parameter-gradient products from them and the forward's activations. Under recompute those activations live
  // in one set shared by every block and are gone by W: the block then runs whole in B.
  bool splits_backward() const override { return !recompute_; }
  void backward_input(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy,
                      Tensor* dx, int slot, bool accumulate) override {
    input_pass(be, x, dy, dx, slot, accumulate, recompute_ ? nullptr : &kept_[slot]);
  }
  void backward_weight(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy,
                       int slot, bool accumulate) override {
    if (!recompute_) weight_pass(be, x, dy, slot, accumulate);
  }

 private:
  // Gradients B keeps for W: at the MLP branch's output (after dropout's backward), c_fc's
  // output, ln_2's output, the stream between the branches, the attention branch's output
  // (after dropout's backward), c_attn's output and ln_1's output.
  struct BlockGrads {
    Tensor dmlp, dfc, dln2, dres, dattn, dqkv, dln1;
  };

  // The whole backward (keep null: parameter gradients written, intermediate gradients in the
  // shared workspace), or B (keep: parameter gradients left out, the gradients W needs kept).
  void input_pass(const Backend& be, const Tensor& x, const Tensor& dy, Tensor* dx, int slot,
                  bool accumulate, BlockGrads* keep) {
    BlockWorkspace& w = block_workspace();
    BlockActs& a = recompute_ ? w.recomputed : acts_[slot];
    if (recompute_) {  // the activations again, from the block's input (same masks: same keys)
      w.out.resize(x.shape, *be.memory);
      run_forward(be, x, w.out.data(), step_[slot], a, masks_[slot]);
    }
    const int B = int(x.dim(0)), T = int(x.dim(1)), N = B * T, C = C_;
    const int Cl = C / tp_.size, NHl = NH_ / tp_.size, Hl = 4 * Cl;  // this rank's share
    const int64_t n = int64_t(N) * C;
    auto ws = [&](Tensor& t, Shape s) { t.resize(std::move(s), *be.memory); return t.data(); };
    auto kept = [&](Tensor& shared, Tensor BlockGrads::*k, Shape s) { return ws(keep ? keep->*k : shared, s); };
    auto pg = [&](Which i) { return keep ? nullptr : grad(i); };  // parameter gradients now?
    float* g4 = ws(w.g4, {N, Hl});                                 // inside the MLP
    float* gy = ws(w.gc, {N, C});                                  // at the attention's output
    // W reads each projection's output gradient: after dropout's backward when there is
    // dropout (gm, ga), else dy and the stream's gr; only those are kept.
    const Masks& mk = masks_[slot];
    float* gm = mk.active ? kept(w.g, &BlockGrads::dmlp, {N, C}) : ws(w.g, {N, C});
    float* g4b = kept(w.g4b, &BlockGrads::dfc, {N, Hl});           // at c_fc's output
    float* gc2 = kept(w.gc, &BlockGrads::dln2, {N, C});            // at ln_2's output
    float* gr = mk.active ? ws(w.gr, {N, C}) : kept(w.gr, &BlockGrads::dres, {N, C});  // res1
    float* ga = mk.active ? kept(w.g, &BlockGrads::dattn, {N, C}) : ws(w.g, {N, C});
    float* g3 = kept(w.g3, &BlockGrads::dqkv, {N, 3 * Cl});        // at c_attn's output
    float* gc1 = kept(w.gc, &BlockGrads::dln1, {N, C});            // at ln_1's output
    // MLP branch: out = res1 + drop(c_proj(gelu(c_fc(ln_2(res1)))))
    const float* d = dy.data();
    if (mk.active) {
      be.dropout_backward(gm, d, mk.m2.data(), n);
      d = gm;
    }
    be.linear_backward(g4, pg(kMlpProjW), pg(kMlpProjB), d, a.fcg.data(), value(kMlpProjW), N, Hl, C, accumulate);
    fc_backward(be, gc2, g4b, keep != nullptr, g4, a, pg(kFcW), pg(kFcB), N, C, Hl, accumulate);
    tensor_sum(gc2, n);
    be.layernorm_backward(gr, pg(kLn2W), pg(kLn2B), gc2, a.res1.data(), value(kLn2W), a.st2.data(),
                          a.st2.data() + N, N, C, accumulate);
    be.residual_forward(gr, gr, dy.data(), n);  // + the stream's own path
    // Attention branch: res1 = x + drop(c_proj(attn(c_attn(ln_1(x)))))
    d = gr;
    if (mk.active) {
      be.dropout_backward(ga, gr, mk.m1.data(), n);
      d = ga;
    }
    be.linear_backward(gy, pg(kAttnProjW), pg(kAttnProjB), d, a.y.data(), value(kAttnProjW), N, Cl, C, accumulate);
    be.attention_backward(g3, gy, a.qkv.data(), a.att.data(), B, T, Cl, NHl);
    be.linear_backward(gc1, pg(kAttnW), pg(kAttnB), g3, a.ln1.data(), value(kAttnW), N, C, 3 * Cl, accumulate);
    tensor_sum(gc1, n);
    if (keep && !dx) return;  // W takes ln_1's parameters
    float* dxp = dx ? dx->data() : ws(w.g, {N, C});
    be.layernorm_backward(dxp, pg(kLn1W), pg(kLn1B), gc1, x.data(), value(kLn1W), a.st1.data(), a.st1.data() + N,
                          N, C, accumulate);
    if (dx) be.residual_forward(dxp, dxp, gr, n);
  }

  // W: the six parameter gradients from what B kept (the same products backward runs).
  void weight_pass(const Backend& be, const Tensor& x, const Tensor& dy, int slot, bool accumulate) {
    const BlockActs& a = acts_[slot];
    const BlockGrads& k = kept_[slot];
    const bool dropped = masks_[slot].active;
    const int N = int(x.dim(0) * x.dim(1)), C = C_, Cl = C / tp_.size, Hl = 4 * Cl;
    be.linear_backward(nullptr, grad(kMlpProjW), grad(kMlpProjB), dropped ? k.dmlp.data() : dy.data(),
                       a.fcg.data(), value(kMlpProjW), N, Hl, C, accumulate);
    be.linear_backward(nullptr, grad(kFcW), grad(kFcB), k.dfc.data(), a.ln2.data(), value(kFcW), N, C, Hl, accumulate);
    be.layernorm_backward(nullptr, grad(kLn2W), grad(kLn2B), k.dln2.data(), a.res1.data(), value(kLn2W),
                          a.st2.data(), a.st2.data() + N, N, C, accumulate);
    be.linear_backward(nullptr, grad(kAttnProjW), grad(kAttnProjB), dropped ? k.dattn.data() : k.dres.data(),
                       a.y.data(), value(kAttnProjW), N, Cl, C, accumulate);
    be.linear_backward(nullptr, grad(kAttnW), grad(kAttnB), k.dqkv.data(), a.ln1.data(), value(kAttnW), N, C, 3 * Cl,
                       accumulate);
    be.layernorm_backward(nullptr, grad(kLn1W), grad(kLn1B), k.dln1.data(), x.data(), value(kLn1W), a.st1.data(),
                          a.st1.data() + N, N, C, accumulate);
  }

  // The block's parameters, by name: their places in `params`.
  enum Which : size_t {
    kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,  // ln_1, attn.c_attn, attn.c_proj
    kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB,        // ln_2, mlp.c_fc, mlp.c_proj
    kNumParams
  };
  float* value(Which i) const { return params[i].value; }
  float* grad(Which i) const { return params[i].grad; }

  // y (N,O) = x (N,I) W^T + bias for the weight `w`: from its int8 copy when the model has one.
  void linear(const Backend& be, Which w, float* y, const float* x, const float* bias, int N,
              int I, int O) {
    if (!int8_linear(int8, params[w].name, be, y, x, bias, N, I, O, false))
      be.linear_forward(y, x, value(w), bias, N, I, O);
  }

 public:
  std::vector<Int8Target> int8_targets() const override {
    std::vector<Int8Target> t;
    for (Which w : {kAttnW, kAttnProjW, kFcW, kMlpProjW})
      t.push_back({params[w].name, params[w].name, int(params[w].shape[0]), int(params[w].shape[1])});
    return t;
  }

 private:

  // What forward keeps for backward (BlockActs), with its shapes for B samples of T positions
  // (this rank's tensor part): the buffers' sizes and the reports of what recompute saves.
  std::vector<std::pair<Tensor BlockActs::*, Shape>> act_shapes(int64_t B, int64_t T) const {
    const int64_t N = B * T, C = C_, Cl = C / tp_.size, NHl = NH_ / tp_.size, Hl = 4 * Cl;
    return {{&BlockActs::ln1, {N, C}},       {&BlockActs::st1, {2, N}},
            {&BlockActs::qkv, {N, 3 * Cl}},  {&BlockActs::att, {B, NHl, T, T}},
            {&BlockActs::y, {N, Cl}},        {&BlockActs::res1, {N, C}},
            {&BlockActs::ln2, {N, C}},       {&BlockActs::st2, {2, N}},
            {&BlockActs::fc, {N, Hl}},       {&BlockActs::fcg, {N, Hl}}};
  }

  struct Masks {
    bool active = false;
    Tensor m1, m2;  // dropout masks of the two residual branches
  };

  // The MLP's GELU, a.fc (n) -> a.fcg (n). In training, where the backend keeps the derivative
  // (the CPU's gelu_forward_grad), it overwrites fc, which backward reads only for it: backward
  // then multiplies where it would evaluate erf and exp again. Bitwise the same results.
  void gelu_forward(const Backend& be, BlockActs& a, int64_t n, bool training) const {
    const auto keep = gelu_tanh_ ? be.gelu_tanh_forward_grad : be.gelu_forward_grad;
    a.fc_grad = training && keep && be.linear_gelu_backward;
    if (a.fc_grad)
      keep(a.fcg.data(), a.fc.data(), a.fc.data(), n);
    else
      (gelu_tanh_ ? be.gelu_tanh_forward : be.gelu_forward)(a.fcg.data(), a.fc.data(), n);
  }
  // Backward through the GELU and c_fc, from dfcg at the GELU's output to dln2 at c_fc's
  // input and c_fc's parameter gradients; dfc (N,Hl) receives the gradient at c_fc's output.
  // With the derivative kept, one op (linear_gelu_backward) forms, rounds and sums it in one
  // pass, and in bf16 writes dfc only where it is wanted (B keeps it for W); fp32's products
  // read it from memory either way.
  void fc_backward(const Backend& be, float* dln2, float* dfc, bool want_dfc, const float* dfcg,
                   const BlockActs& a, float* dweight, float* dbias, int N, int C, int Hl,
                   bool accumulate) const {
    if (a.fc_grad) {
      const bool write = want_dfc || be.precision == Precision::fp32;
      be.linear_gelu_backward(dln2, dweight, dbias, dfcg, a.fc.data(), a.ln2.data(),
                              value(kFcW), N, C, Hl, write ? dfc : nullptr, accumulate);
      return;
    }
    (gelu_tanh_ ? be.gelu_tanh_backward : be.gelu_backward)(dfc, dfcg, a.fc.data(),
                                                             int64_t(N) * Hl);
    be.linear_backward(dln2, dweight, dbias, dfc, a.ln2.data(), value(kFcW), N, C, Hl,
                       accumulate);
  }

  // The sum over the tensor group, in place (host memory: the transformer runs on the CPU).
  void tensor_sum(float* x, int64_t n) const {
    if (tp_.size > 1) tp_.comm->allreduce_sum(x, n);
  }

  void run_forward(const Backend& be, const Tensor& x, float* out, const StepInfo& s,
                   BlockActs& a, Masks& mk) {
    const int B = int(x.dim(0)), T = int(x.dim(1)), N = B * T, C = C_;
    const int Cl = C / tp_.size, NHl = NH_ / tp_.size, Hl = 4 * Cl;
    const int64_t n = int64_t(N) * C;
    auto ws = [&](Tensor& t, Shape sh) { t.resize(std::move(sh), *be.memory); return t.data(); };
    // The row-parallel layers' bias, added by one rank of the group (before the sum).
    auto bias = [&](Which i) { return tp_.rank == 0 ? value(i) : nullptr; };
    for (const auto& [t, shape] : act_shapes(B, T)) ws(a.*t, shape);
    float* tmp = ws(block_workspace().tmp, {N, C});
    mk.active = s.training && p_ > 0;
    auto drop = [&](Tensor& mask, int k) {  // in place on tmp; keyed like Dropout, per branch
      if (!mk.active) return;
      mask.resize({N, C}, *be.memory);
      be.dropout_forward(tmp, mask.data(), tmp, B, int64_t(T) * C, p_,
                         hash_combine(s.seed, 0xB10C0000ull + uint64_t(index_) * 2 + uint64_t(k)),
                         s.step, s.first_sample);
    };
    be.layernorm_forward(a.ln1.data(), a.st1.data(), a.st1.data() + N, x.data(), value(kLn1W), value(kLn1B), N, C);
    linear(be, kAttnW, a.qkv.data(), a.ln1.data(), value(kAttnB), N, C, 3 * Cl);
    be.attention_forward(a.y.data(), a.att.data(), a.qkv.data(), B, T, Cl, NHl);
    linear(be, kAttnProjW, tmp, a.y.data(), bias(kAttnProjB), N, Cl, C);
    tensor_sum(tmp, n);
    drop(mk.m1, 0);
    be.residual_forward(a.res1.data(), x.data(), tmp, n);
    be.layernorm_forward(a.ln2.data(), a.st2.data(), a.st2.data() + N, a.res1.data(), value(kLn2W), value(kLn2B), N, C);
    linear(be, kFcW, a.fc.data(), a.ln2.data(), value(kFcB), N, C, Hl);
    gelu_forward(be, a, int64_t(N) * Hl, s.training);
    linear(be, kMlpProjW, tmp, a.fcg.data(), bias(kMlpProjB), N, Hl, C);
    tensor_sum(tmp, n);
    drop(mk.m2, 1);
    be.residual_forward(out, a.res1.data(), tmp, n);
  }

  int C_, NH_;
  float p_;
  int index_;
  bool recompute_;
  bool gelu_tanh_;  // GPT-2's tanh GELU in the MLP (model.gelu = "tanh"), else the erf one
  TensorSplit tp_;
  PerSlot<BlockActs> acts_;  // without recompute
  PerSlot<Masks> masks_;
  PerSlot<StepInfo> step_;
  PerSlot<BlockGrads> kept_;  // B's gradients for W (split schedules)
};

}  // namespace

std::unique_ptr<Layer> make_embedding(int vocab, int dim, int context, int row_multiple) {
  return std::make_unique<Embedding>(vocab, dim, context, row_multiple);
}
int64_t padded_vocab(int64_t vocab, int row_multiple) {
  return row_multiple > 1 ? (vocab + row_multiple - 1) / row_multiple * row_multiple : vocab;
}
std::unique_ptr<Layer> make_block(int dim, int heads, int blocks, float dropout, int index,
                                  bool recompute, bool gelu_tanh, TensorSplit tp) {
  return std::make_unique<Block>(dim, heads, blocks, dropout, index, recompute, gelu_tanh, tp);
}
std::unique_ptr<Layer> make_layernorm(int dim) { return std::make_unique<LayerNorm>(dim); }
std::unique_ptr<Layer> make_lm_head(int vocab) { return std::make_unique<LmHead>(vocab); }

bool tie_lm_head(Layer& head, Layer& embedding) {
  auto* h = dynamic_cast<LmHead*>(&head);
  auto* e = dynamic_cast<Embedding*>(&embedding);
  if (!h || !e || h->V_ != e->V_) return false;
  h->wte_ = &e->params[0];
  e->tied_ = true;
  return true;
}

bool tie_lm_head(Layer& head, Param& table) {
  auto* h = dynamic_cast<LmHead*>(&head);
  if (!h || table.shape.size() != 2 || table.shape[0] < h->V_) return false;
  h->wte_ = &table;
  return true;
}

bool is_lm_head(const Layer& layer) { return dynamic_cast<const LmHead*>(&layer) != nullptr; }

Param* token_table(Layer& embedding) {
  auto* e = dynamic_cast<Embedding*>(&embedding);
  return e ? &e->params[0] : nullptr;
}

}  // namespace strata
