// The command line before CLI11 (command_line.h).
#include "cli/command_line.h"

#include <cctype>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/parse.h"
#include "config/config.h"
#include "strata/error.h"

namespace strata {
namespace {

bool is_list_key(const ConfigKey& k) {
  return std::holds_alternative<std::vector<int>*>(k.field) ||
         std::holds_alternative<std::vector<std::string>*>(k.field) || k.list_as_text;
}

// "--name" or "--name=value" -> "name"; "" for anything else.
std::string long_flag(const std::string& a) {
  if (a.size() < 3 || a[0] != '-' || a[1] != '-') return "";
  return a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
}

// A token that is a flag ("-x", "--x"), not a value such as "-1" or "-.5".
bool is_flag(const std::string& a) {
  return a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1])) && a[1] != '.';
}

// The option of `app` (or of an app it falls through to) named `flag` ("--x" or "-x").
const CLI::Option* find_option(const CLI::App* app, const std::string& flag) {
  for (; app; app = app->get_parent()) {
    for (const CLI::Option* o : app->get_options())
      if (o->check_name(flag)) return o;
    if (!app->get_fallthrough()) break;
  }
  return nullptr;
}

std::vector<std::string> flag_names(const CLI::App* app) {
  std::vector<std::string> names;
  for (; app; app = app->get_parent()) {
    for (const CLI::Option* o : app->get_options())
      for (const auto& n : o->get_lnames()) names.push_back("--" + n);
    if (!app->get_fallthrough()) break;
  }
  return names;
}

std::string command_of(const CLI::App* app) {
  std::string out;
  for (; app && app->get_parent(); app = app->get_parent())
    out = app->get_name() + (out.empty() ? "" : " " + out);
  return "strata" + (out.empty() ? "" : " " + out);
}

[[noreturn]] void unknown_command(CLI::App* app, const std::string& name) {
  std::vector<std::string> names;
  for (CLI::App* s : app->get_subcommands([](CLI::App*) { return true; })) names.push_back(s->get_name());
  const std::string near = closest_name(name, names);
  fail_input("unknown command '{}'{}{}; the commands{}: {}", name,
             app->get_parent() ? " of " + command_of(app) : "",
             near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
             app->get_parent() ? " of " + command_of(app) : "", fmt::join(names, ", "));
}

}  // namespace

std::vector<std::string> expand_list_flags(const std::vector<std::string>& args) {
  RunConfig defaults;
  std::vector<std::string> lists;
  for (const ConfigKey& k : config_keys(defaults))
    if (is_list_key(k)) lists.push_back(k.name);
  auto is_list = [&](const std::string& name) {
    return std::find(lists.begin(), lists.end(), name) != lists.end();
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string name = long_flag(a);
    if (name.empty() || !is_list(name)) {
      out.push_back(a);
      continue;
    }
    std::string value;
    if (a.find('=') != std::string::npos) value = a.substr(a.find('=') + 1);
    else if (i + 1 < args.size() && !args[i + 1].empty() && args[i + 1][0] == '[') value = args[++i];
    if (value.empty() || value[0] != '[') {
      out.push_back(value.empty() ? a : "--" + name);
      if (!value.empty()) out.push_back(value);
      continue;
    }
    out.push_back("--" + name);
    for (auto& v : toml_array_values(value, "flag --" + name)) out.push_back(std::move(v));
  }
  return out;
}

void check_commands_and_flags(CLI::App& app, const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "-h" || a == "--help" || a == "--help-all" || a == "--version") return;
  CLI::App* cur = &app;
  int values_left = 0;     // of the last option, still to come
  bool value_due = false;  // its first value: taken whatever it looks like ("-inf")
  for (const std::string& a : args) {
    if (a == "--") break;
    if (value_due) {
      value_due = false;
      --values_left;
      continue;
    }
    if (is_flag(a)) {
      const std::string flag = a.substr(0, a.find('='));
      const CLI::Option* o = find_option(cur, flag);
      if (!o) {
        const std::string near = closest_name(flag, flag_names(cur));
        fail_input("unknown flag {}{}; {} --help lists its flags", flag,
                   near.empty() ? "" : fmt::format(" (did you mean {}?)", near), command_of(cur));
      }
      values_left = a.find('=') != std::string::npos ? 0 : std::max(0, o->get_items_expected_max());
      value_due = values_left > 0 && o->get_items_expected_min() > 0;
      continue;
    }
    if (values_left > 0) {
      --values_left;
      continue;
    }
    if (cur->get_subcommands([](CLI::App*) { return true; }).empty()) continue;  // a positional
    CLI::App* sub = nullptr;
    for (CLI::App* s : cur->get_subcommands([](CLI::App*) { return true; }))
      if (s->check_name(a)) sub = s;
    if (!sub) unknown_command(cur, a);
    cur = sub;
  }
  if (!cur->get_subcommands([](CLI::App*) { return true; }).empty() && cur->get_require_subcommand_min() > 0) {
    std::vector<std::string> names;
    for (CLI::App* s : cur->get_subcommands([](CLI::App*) { return true; })) names.push_back(s->get_name());
    fail_input("{} needs a command: {} (then --help for its flags)", command_of(cur), fmt::join(names, ", "));
  }
}

}  // namespace strata
