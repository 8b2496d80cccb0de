// `strata checkpoint latest DIR`: the newest checkpoint of a checkpoint directory that
// verifies, as "STEP PATH" on one line ("-1" when there is none), so job scripts need not read
// `latest` themselves; a damaged file on the way is named on stderr and passed over.
#include "cli/commands.h"

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
