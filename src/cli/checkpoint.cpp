// `strata checkpoint latest DIR`: the newest checkpoint of a checkpoint directory that
// verifies, as "STEP PATH" on one line ("-1" when there is none), so job scripts need not read
// `latest` themselves; a damaged file on the way is named on stderr and passed over. A
// directory that does not exist yet prints -1; a path that is a file is an error (exit 2).
#include "cli/commands.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint_dir.h"
#include "strata/error.h"

namespace strata::cli {

Subcommand add_checkpoint(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("checkpoint", "what a checkpoint directory holds (for job scripts)");
  sub->require_subcommand(1);
  auto* latest = sub->add_subcommand(
      "latest", "print STEP PATH of the newest checkpoint in DIR that verifies, or -1");
  latest->add_option("dir", *dir, "a checkpoint directory (checkpoint.dir)")->required();
  return {latest, [dir](Comm& comm) {
            if (comm.rank() != 0) return int(kExitOk);
            // A directory not made yet has no checkpoint (-1: a first attempt); a file is a
            // wrong argument.
            std::error_code ec;
            if (dir->empty()) fail_input("checkpoint latest: DIR is empty; give a checkpoint directory");
            if (std::filesystem::exists(*dir, ec) && !std::filesystem::is_directory(*dir, ec))
              fail_input("checkpoint latest {}: not a directory (give a checkpoint.dir)", *dir);
            const CheckpointDir ckpts(*dir, /*warn=*/true);
            std::vector<std::string> skipped;
            const auto found = ckpts.newest_verified(&skipped);
            for (const auto& why : skipped) fmt::print(stderr, "strata: warning: passed over {}\n", why);
            if (found)
              fmt::print("{} {}\n", found->step, found->path);
            else
              fmt::print("-1\n");
            return int(kExitOk);
          }};
}

}  // namespace strata::cli
