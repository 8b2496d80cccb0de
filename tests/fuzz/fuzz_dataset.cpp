// Datasets and token files: any bytes as the HDF5 file open_dataset validates are a DatasetInfo
// or a UserError; a file that validates then loads a few batches (token files: windows of 8).
#include <algorithm>
#include <string>

#include "data/data.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string path = fuzz::as_file(data, size);
  fuzz::expect_clean([&] {
    DatasetInfo info = open_dataset(path);
    if (info.tokens) set_context(info, 8);
    for (const char* split : {"train", "test"}) {
      if (std::string(split) == "test" && !info.has_test) continue;
      const SplitInfo& s = std::string(split) == "test" ? info.test : info.train;
      Loader loader(info, split, std::min<int64_t>(4, s.n), 0, 1, /*shuffle=*/true, 1);
      for (int i = 0; i < 2; ++i) loader.next();
    }
  });
  return 0;
}
