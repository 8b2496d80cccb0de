// Config files: any bytes through read_config_text are a RunConfig or a UserError; a config that
// reads also validates or names its fault, and its effective config (to_toml) reads back to the
// same text.
#include <cstdlib>
#include <string>
#include <string_view>

#include "config/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  RunConfig cfg;
  bool read = false;
  fuzz::expect_clean([&] {
    read_config_text(text, "fuzz.toml", cfg);
    read = true;
    validate(cfg);
  });
  if (!read) return 0;
  const std::string once = cfg.to_toml();
  RunConfig back;
  read_config_text(once, "round-trip.toml", back);  // must not throw: strata wrote it
  if (back.to_toml() != once) std::abort();          // and must read back to itself
  return 0;
}
