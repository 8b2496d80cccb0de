// The command line before CLI11 reads it: what users type that CLI11 would refuse or word
// its own way. A list flag's value written as a TOML array ("[2048, 2048]", with spaces, a
// trailing comma or several lines, as docs/configuration.md shows defaults) becomes its values; an
// unknown command or flag is an error in strata's words, with the closest known name, as the
// config file's unknown keys are.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace strata {

// The arguments (after the program name) with every `--KEY [a, b]` or `--KEY=[a, b]` of a
// config list key (model.hidden, model.layers ...) as `--KEY a b`. Throws UserError naming the
// flag for a value that starts with '[' and is not a TOML array.
std::vector<std::string> expand_list_flags(const std::vector<std::string>& args);

// Throws UserError for the first unknown command ("unknown command 'foo' (did you mean
// 'eval'?); the commands: ...") or flag ("unknown flag --train.epoch (did you mean
// --train.epochs?); strata train --help lists its flags"), or a missing command. Help and
// version requests are left to CLI11.
void check_commands_and_flags(CLI::App& app, const std::vector<std::string>& args);

}  // namespace strata
