// `strata quantize`: an int8 file for eval and generate.
#include "cli/commands.h"

#include <memory>

#include "run/quantize.h"
#include "strata/error.h"

namespace strata::cli {

Subcommand add_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  auto* q = app.add_subcommand("quantize", "write an int8 file (linear layers' weights int8, "
                                           "per output channel) for strata eval and generate");
  q->add_option("--checkpoint", o->checkpoint, "parameter file or checkpoint of a run")->required();
  q->add_option("--out", o->out, "the int8 file to write (.h5)")->required();
  q->add_option("--calibrate", o->calibrate,
                "static activation scales from N batches of --data's train split (default 0: "
                "each row's own scale at run time)")
      ->check(int_in(0, INT32_MAX));
  q->add_option("--data", o->data, "HDF5 dataset for --calibrate");
  q->add_option("--batch_size", o->batch_size, "samples per calibration batch")
      ->check(int_in(1, INT32_MAX))->capture_default_str();
  auto* threads = q->add_option("--threads", o->threads)->check(int_in(1, kMaxThreads));
  return {q, [o, threads](Comm& comm) {
            o->threads = threads_from(threads, o->threads);
            return comm.rank() == 0 ? run_quantize(*o) : int(kExitOk);
          }};
}

}  // namespace strata::cli
