// strata: the command line, parsed and dispatched. Each command is a file of cli/
// (commands.h): train, prepare, eval, quantize, generate, inspect, devices, bench.
#include <algorithm>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/job.h"
#include "base/memory.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "strata/comm.h"
#include "strata/error.h"
#include "strata/version.h"

using namespace strata;
using namespace strata::cli;

namespace {

// CLI11's messages in strata's words: a flag is called one, and the common mistakes say what
// to type instead.
std::string describe_parse_error(const std::string& msg) {
  std::smatch m;
  static const std::regex stray("The following argument was not expected: (.*)");
  static const std::regex missing("(--[^:]+): [0-9]+ required .* missing");
  static const std::regex repeated("(--[^:]+): At Most 1 required but received ([0-9]+)");
  static const std::regex range("(--[^:]+): Value (\\S+) not in range (\\S+) to (\\S+)");
  if (std::regex_match(msg, m, stray))
    return fmt::format("unexpected argument '{}'{}", m[1].str(),
                       m[1].str().ends_with(".toml") ? fmt::format(" (a config file is given as --config {})", m[1].str())
                                                     : std::string(" (strata COMMAND --help lists its flags)"));
  if (std::regex_match(msg, m, missing)) return fmt::format("flag {}: needs a value", m[1].str());
  if (std::regex_match(msg, m, repeated))
    return fmt::format("flag {}: given {} times; give it once", m[1].str(), m[2].str());
  if (std::regex_match(msg, m, range))
    return fmt::format("flag {}: must be in [{}, {}], got {}", m[1].str(), m[3].str(), m[4].str(), m[2].str());
  return msg.rfind("--", 0) == 0 ? fmt::format("flag {}", msg) : msg;
}

// Parses the command line on every rank. Returns true when it asked for help or the version
// (rank 0 printed it); a bad command line throws (rank 0 alone reports it).
bool parse_command_line(CLI::App& app, int argc, char** argv, bool lead) {
  try {
    std::vector<std::string> args;
    try {  // strata's own reading first (command_line.h): TOML arrays, unknown names
      args = expand_list_flags(std::vector<std::string>(argv + 1, argv + argc));
      check_commands_and_flags(app, args);
    } catch (const UserError&) {
      if (!lead) throw AgreedFailure(kExitBadInput, "");
      throw;
    }
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
    return false;
  } catch (const CLI::CallForHelp& e) {
    if (lead) app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    if (lead) app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    if (lead) app.exit(e);
  } catch (const CLI::Error& e) {
    // Every rank parsed the same arguments: rank 0 alone reports.
    if (!lead) throw AgreedFailure(kExitBadInput, "");
    throw UserError(kExitBadInput, describe_parse_error(e.what()));
  }
  return true;
}

// The last of a repeated single-value flag counts, in every command, as docs/configuration.md
// says of the config keys' flags (CLI11 would refuse it in its own words). Not --resume:
// slurm/train.sbatch passes `--resume auto` itself, and a second one among the user's flags
// would silently decide every relaunch.
void take_last_of_repeated(CLI::App& app) {
  for (CLI::Option* o : app.get_options())
    if (o->get_expected_max() == 1 && o->get_items_expected_max() == 1 && !o->check_lname("resume"))
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) take_last_of_repeated(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  mpi_init(&argc, &argv);
  // Stop signals only set a flag from the start: a rank srun TERMs while another rank fails
  // still exits with its own code (the training loop acts on the flag).
  install_stop_handlers();
  // Line-buffered even into a file or pipe (Slurm logs): a line is in the log when printed,
  // not lost in a buffer if the job is killed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto comm = make_world_comm();
  const bool lead = comm->rank() == 0;

  CLI::App app{"strata: a Slurm-native MPI training runtime"};
  app.set_version_flag("--version", fmt::format("strata {} ({})", STRATA_VERSION, git_commit()));
  app.require_subcommand(1);
  std::vector<Subcommand> commands = {add_train(app), add_config(app), add_checkpoint(app)};
  for (auto& c : add_prepare(app)) commands.push_back(std::move(c));
  commands.push_back(add_eval(app));
  commands.push_back(add_quantize(app));
  commands.push_back(add_export(app));
  commands.push_back(add_generate(app));
  commands.push_back(add_inspect(app));
  commands.push_back(add_devices(app));
  for (auto& c : add_bench(app)) commands.push_back(std::move(c));
  commands.push_back(add_plan(app));
  take_last_of_repeated(app);

  int code = kExitOk;
  try {
    if (parse_command_line(app, argc, argv, lead)) {
      mpi_finalize();
      return kExitOk;
    }
    for (auto& c : commands)
      if (*c.app) {
        const CLI::App* parent = c.app->get_parent();
        const std::string what = "running strata " + (parent && parent->get_parent()
                                                          ? parent->get_name() + " " : std::string()) +
                                 c.app->get_name();
        AllocationScope scope(what.c_str());
        arm_allocation_failures();
        code = c.run(*comm);
      }
  } catch (const AgreedFailure& e) {
    code = e.code;
  } catch (const UserError& e) {
    // Errors found by all ranks alike are printed once; others name the rank.
    fmt::print(stderr, "strata: error: {}{}\n", comm->size() > 1 ? fmt::format("rank {} ({}): ", comm->rank(), comm->host()) : "", e.what());
    code = e.code;
  } catch (const std::bad_alloc& e) {
    // Past the memory check: another process took the memory, or an estimate fell short. The
    // report itself may find no memory: then without the bound.
    arm_allocation_failures(false);
    std::string bound = "memory left unknown";
    try {
      bound = memory_bound().source;
    } catch (const std::bad_alloc&) {
    }
    fmt::print(stderr, "strata: error: rank {} ({}): {} ({}; exit {})\n", comm->rank(), comm->host(),
               dynamic_cast<const OutOfMemory*>(&e) ? e.what() : "out of memory", bound,
               int(kExitOutOfMemory));
    std::fflush(stderr);
    if (comm->size() > 1) mpi_abort(kExitOutOfMemory);  // the other ranks cannot go on
    code = kExitOutOfMemory;
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata: internal error on rank {} ({}): {}\n", comm->rank(), comm->host(), e.what());
    std::fflush(stderr);
    mpi_abort(kExitInternal);
  }
  std::fflush(stdout);
  mpi_finalize();
  return code;
}
