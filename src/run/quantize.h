// `strata quantize`: an int8 file (checkpoint.h's save_int8) from a parameter file or a
// checkpoint, for `strata eval` and `strata generate` on CPUs.
#pragma once
#include <cstdint>
#include <string>

namespace strata {

struct QuantizeOptions {
  std::string checkpoint;  // model.h5 or a ckpt-*.h5
  std::string out;         // the int8 file to write
  std::string data;        // the dataset whose train split calibrates (with calibrate > 0)
  int64_t calibrate = 0;   // batches for static activation scales; 0: per-row at run time
  int64_t batch_size = 64; // samples per calibration batch
  int threads = 1;
};

// Writes o.out atomically and prints what was quantized and what stays fp32; returns kExitOk.
// Throws UserError for a file that is not a checkpoint or parameter file (or already int8),
// for calibration without data or with data that does not fit the model.
int run_quantize(const QuantizeOptions& o);

}  // namespace strata
