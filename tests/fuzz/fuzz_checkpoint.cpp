// Checkpoints and parameter files: any bytes as the HDF5 file read_checkpoint reads are a
// LoadedCheckpoint or a UserError; a file that reads is then used as eval uses it: the model it
// describes is built (after the memory check) and the parameters copied in.
#include <string>

#include "checkpoint/checkpoint.h"
#include "fuzz_util.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string path = fuzz::as_file(data, size);
  fuzz::expect_clean([&] { read_checkpoint(path, /*tolerate_mismatch=*/true); });
  fuzz::expect_clean([&] {
    const LoadedParams lp = load_parameters(path);
    require_model_memory(describe_layers(lp.spec, lp.input_shape, lp.classes), {}, 2, 1,
                         1, path);
    Model model(lp.spec, lp.input_shape, lp.classes);
    copy_parameters_into(model, lp, path);
  });
  return 0;
}
