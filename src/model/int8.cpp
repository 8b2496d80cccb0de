#include "model/int8.h"

#include <algorithm>
#include <cmath>

#include "strata/kernels_cpu.h"

namespace strata {

Int8Weight quantize_weight(const std::string& source, const float* w, int rows, int cols) {
  Int8Weight q;
  q.source = source;
  q.rows = rows;
  q.cols = cols;
  q.q.resize(size_t(rows) * cols);
  q.scale.resize(size_t(rows));
  q.col_sum.resize(size_t(rows));
  cpu::quantize_rows(q.q.data(), q.scale.data(), q.col_sum.data(), w, rows, cols);
  return q;
}

bool int8_linear(Int8Table* table, const std::string& name, const Backend& be, float* y,
                 const float* x, const float* bias, int B, int I, int O, bool relu) {
  if (!table) return false;
  auto it = table->weights.find(name);
  if (it == table->weights.end()) return false;
  Int8Weight& w = it->second;
  if (table->calibrating) {
    for (int64_t i = 0, n = int64_t(B) * I; i < n; ++i)
      w.observed_max = std::max(w.observed_max, std::abs(x[i]));
    return false;
  }
  be.linear_int8_forward(y, x, w.matrix(), bias, B, I, O, relu);
  return true;
}

bool int8_conv(Int8Table* table, const std::string& name, const Backend& be, float* y,
               const float* x, const float* bias, const Conv2dShape& s, float* scratch) {
  if (!table) return false;
  auto it = table->weights.find(name);
  if (it == table->weights.end()) return false;
  Int8Weight& w = it->second;
  if (table->calibrating) {
    // The receptive fields hold the input's values (and padding zeros): the input's max.
    for (int64_t i = 0, n = int64_t(s.B) * s.C * s.H * s.W; i < n; ++i)
      w.observed_max = std::max(w.observed_max, std::abs(x[i]));
    return false;
  }
  be.conv2d_int8_forward(y, x, w.matrix(), bias, s, scratch);
  return true;
}

}  // namespace strata
