// The linear op's forward on packed weights (kernels/cpu/linear.cpp, from 2048 rows): bitwise
// the plain matmul primitive's product, the weight read afresh at each call, and weights of
// different shapes in turn (one scratch holds their packed copies) each giving its own product.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "strata/kernels_cpu.h"

using namespace strata;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

}  // namespace

TEST_CASE("linear forward on packed weights: bitwise the plain product, the weight never stale",
          "[kernels]") {
  const int B = 2048, I = 72, O = 40;  // 2048 rows: the packed path; 5.9M multiply-adds
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(size_t(B) * I), w(size_t(O) * I), bias(O);
  for (auto* v : {&x, &w, &bias})
    for (float& e : *v) e = u(gen);
  std::vector<float> got(size_t(B) * O), want(got.size());
  for (const bool relu : {false, true}) {
    CAPTURE(relu);
    auto op = [&] {
      if (relu)
        cpu::linear_relu_forward(got.data(), x.data(), w.data(), bias.data(), B, I, O);
      else
        cpu::linear_forward(got.data(), x.data(), w.data(), bias.data(), B, I, O);
    };
    auto plain = [&] {
      cpu::matmul(false, true, B, O, I, x.data(), I, w.data(), I, want.data(), O, bias.data(),
                  relu);
    };
    op();
    plain();
    CHECK(same_bits(got, want));
    // The same weight buffer, changed in place (as the optimizer's update does): a packed copy
    // kept from the call before would give the old product.
    const std::vector<float> before = got;
    for (float& e : w) e = -0.5f * e;
    op();
    plain();
    CHECK(same_bits(got, want));
    CHECK_FALSE(same_bits(got, before));
  }
  // Two weights of other shapes in turn (their packed copies share one scratch), then the
  // first again: each product its own.
  const int I2 = 96, O2 = 64;
  std::vector<float> x2(size_t(B) * I2), w2(size_t(O2) * I2), got2(size_t(B) * O2),
      want2(got2.size());
  for (auto* v : {&x2, &w2})
    for (float& e : *v) e = u(gen);
  for (int round = 0; round < 2; ++round) {
    cpu::linear_forward(got2.data(), x2.data(), w2.data(), nullptr, B, I2, O2);
    cpu::matmul(false, true, B, O2, I2, x2.data(), I2, w2.data(), I2, want2.data(), O2, nullptr,
                false);
    CHECK(same_bits(got2, want2));
    cpu::linear_forward(got.data(), x.data(), w.data(), bias.data(), B, I, O);
    cpu::matmul(false, true, B, O, I, x.data(), I, w.data(), I, want.data(), O, bias.data(),
                false);
    CHECK(same_bits(got, want));
  }
}
