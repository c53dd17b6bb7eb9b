#include "harness/cli/cli.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <set>

#include "harness/cli/commands.h"
#include "harness/errors.h"
#include "harness/registry.h"

namespace mixbench {

namespace {

const char* kHeader = "mixbench — conformance, accounting and benchmarks for sequence mixers\n";

int run_help(const Args& a, const std::vector<std::string>&);

Command help_command() {
  return {"help", "list the commands, or print one command's usage and options", "[COMMAND]",
          "`mixbench COMMAND --help` prints the same as `mixbench help COMMAND`", {}, run_help};
}

std::vector<std::string> command_names() {
  std::vector<std::string> names;
  for (const Command& c : commands()) names.push_back(c.name);
  return names;
}

UsageError unknown_command(const std::string& name) {
  auto near = closest_names(name, command_names());
  std::string hint;
  for (const auto& n : near) hint += (hint.empty() ? "" : ", ") + n;
  return UsageError(fmt::format("unknown command '{}'{}", name, hint.empty() ? "" : " (did you mean " + hint + "?)"));
}

int run_help(const Args& a, const std::vector<std::string>&) {
  if (a.positional().size() > 1) throw UsageError("help takes at most one COMMAND");
  if (a.positional().empty()) {
    std::cout << commands_overview();
    return 0;
  }
  const Command* c = find_command(a.positional()[0]);
  if (!c) throw unknown_command(a.positional()[0]);
  std::cout << command_usage(*c);
  return 0;
}

bool asks_for_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& s) { return s == "--help" || s == "-h"; });
}

}  // namespace

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      list_command(),  conformance_command(), account_command(), golden_command(), sweep_command(),
      train_command(), eval_command(), leaderboard_command(), tasks_command(), profile_command(), plot_command(), report_command(), validate_command(),
      help_command()};
  return table;
}

const Command* find_command(const std::string& name) {
  for (const Command& c : commands())
    if (c.name == name) return &c;
  return nullptr;
}

std::string command_usage(const Command& c) {
  std::string out = fmt::format("usage: mixbench {}{}{}\n\n{}\n", c.name, c.operands.empty() ? "" : " " + c.operands,
                                c.options.empty() ? "" : " [options]", c.summary);
  if (!c.details.empty()) out += c.details + "\n";
  std::vector<std::pair<std::string, std::string>> lines;
  for (const OptionDoc& o : c.options)
    lines.emplace_back("--" + o.name + (o.value.empty() ? "" : " " + o.value), o.help);
  lines.emplace_back("--help", "print this help");
  size_t width = 0;
  for (const auto& [left, help] : lines) width = std::max(width, left.size());
  out += "\noptions:\n";
  for (const auto& [left, help] : lines) out += fmt::format("  {:<{}}  {}\n", left, width, help);
  return out;
}

std::string commands_overview() {
  std::string out = std::string(kHeader) +
                    "\nusage: mixbench <command> [options]\n"
                    "       mixbench help <command>   (or: mixbench <command> --help) for a command's options\n"
                    "\ncommands:\n";
  size_t width = 0;
  for (const Command& c : commands()) width = std::max(width, c.name.size());
  for (const Command& c : commands()) out += fmt::format("  {:<{}}  {}\n", c.name, width, c.summary);
  return out;
}

Args parse_command_args(const Command& c, const std::vector<std::string>& argv) {
  std::set<std::string> valued, flags, multi;
  for (const OptionDoc& o : c.options)
    (o.kind == OptionKind::Flag ? flags : o.kind == OptionKind::Value ? valued : multi).insert(o.name);
  return Args(argv, valued, flags, multi);
}

int run_cli(const std::vector<std::string>& argv) {
  try {
    if (argv.empty()) {
      std::cout << commands_overview();
      return 2;
    }
    if (argv[0] == "--help" || argv[0] == "-h") {
      std::cout << commands_overview();
      return 0;
    }
    const Command* c = find_command(argv[0]);
    if (!c) throw unknown_command(argv[0]);
    std::vector<std::string> rest(argv.begin() + 1, argv.end());
    if (asks_for_help(rest)) {
      std::cout << command_usage(*c);
      return 0;
    }
    return c->run(parse_command_args(*c, rest), rest);
  } catch (const UsageError& e) {
    std::cerr << "mixbench: error: " << e.what() << "\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "mixbench: error: " << e.what() << "\n";
    return 2;
  } catch (const c10::OutOfMemoryError& e) {
    std::cerr << "mixbench: error: out of memory: " << e.what_without_backtrace() << "\n";
    return 3;
  } catch (const c10::Error& e) {
    std::cerr << "mixbench: internal error: " << e.what_without_backtrace() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "mixbench: internal error: " << e.what() << "\n";
    return 3;
  }
}

}  // namespace mixbench
