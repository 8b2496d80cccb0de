// int8 inference (strata quantize, then eval / generate on the int8 file): the linear products
// whose weights were quantized, by name, and the one call every layer's forward makes for such
// a product. Training never uses them (a model with an int8 table refuses training; the
// table's weights are copies, the fp32 parameters stay as they were).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/backend.h"

namespace strata {

// One quantized weight (rows = outputs, cols = inputs): kernels/cpu/int8.cpp's layout.
struct Int8Weight {
  std::string source;  // the fp32 parameter it was made from (the LM head's: the token table)
  int rows = 0, cols = 0;
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> col_sum;
  float act_scale = 0;     // static activation scale (calibrated); 0: per row at run time
  float observed_max = 0;  // calibration: the largest |input| seen
  Int8Matrix matrix() const {
    return {.q = q.data(), .scale = scale.data(), .col_sum = col_sum.data(), .act_scale = act_scale};
  }
};
Int8Weight quantize_weight(const std::string& source, const float* w, int rows, int cols);

// The products a model can run in int8: name (the product's, e.g. "fc1.weight",
// "lmhead.weight"), the parameter it reads, and its shape.
struct Int8Target {
  std::string name, source;
  int rows = 0, cols = 0;
};

struct Int8Table {
  std::map<std::string, Int8Weight> weights;  // by product name
  // Calibration (strata quantize --calibrate): forward runs in fp32 and each product records
  // the largest |input| it sees.
  bool calibrating = false;
};

// y (B,O) = x (B,I) @ W^T + bias [ReLU] for the product `name`, from its int8 weight when the
// table has one (and is not calibrating); returns false when it has none, and the caller runs
// its fp32 op. Host memory only (int8 inference is the CPU's).
bool int8_linear(Int8Table* table, const std::string& name, const Backend& be, float* y,
                 const float* x, const float* bias, int B, int I, int O, bool relu);
// The same for a convolution (its weight viewed as (OC, C*KH*KW)): y = conv(x) + bias from the
// int8 weight `name`, scratch of conv2d_scratch_size.
bool int8_conv(Int8Table* table, const std::string& name, const Backend& be, float* y,
               const float* x, const float* bias, const Conv2dShape& s, float* scratch);

}  // namespace strata
