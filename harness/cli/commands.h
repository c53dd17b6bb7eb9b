// The command table of the `mixbench` command line: each command's name, one-line summary,
// options (one line of help each) and handler. Dispatch, option parsing and `mixbench help`
// all read this one table, so a command's usage text cannot drift from what it accepts.
#pragma once
#include <string>
#include <vector>

#include "harness/args.h"

namespace mixbench {

enum class OptionKind {
  Flag,   // --name
  Value,  // --name VALUE
  Multi,  // --name V1 [V2 ...] (also comma-separated)
};

struct OptionDoc {
  std::string name;   // without the leading "--"
  OptionKind kind = OptionKind::Flag;
  std::string value;  // placeholder shown after the name ("N", "a,b|all"); empty for flags
  std::string help;   // one line
};

struct Command {
  std::string name;
  std::string summary;      // one line, shown by `mixbench help`
  std::string operands;     // positional arguments shown in the usage line ("FILE"); may be empty
  std::string details;      // further lines under the summary in the command's usage; may be empty
  std::vector<OptionDoc> options;
  // `args` is parsed against `options`; `argv` is the command's raw arguments (for the report header).
  int (*run)(const Args& args, const std::vector<std::string>& argv) = nullptr;
};

// The table, in the order `mixbench help` lists it.
const std::vector<Command>& commands();
// nullptr for an unknown name.
const Command* find_command(const std::string& name);
// The text of `mixbench help NAME` / `mixbench NAME --help`: usage line, summary, one line per option.
std::string command_usage(const Command& c);
// The text of `mixbench help`: one line per command.
std::string commands_overview();
// Parses a command's arguments against its options (UsageError for anything else).
Args parse_command_args(const Command& c, const std::vector<std::string>& argv);

// Each command's entry, defined beside its handler (harness/cli/cmd_*.cpp).
Command list_command();
Command conformance_command();
Command account_command();
Command golden_command();
Command sweep_command();
Command train_command();
Command eval_command();
Command leaderboard_command();
Command plot_command();
Command report_command();
Command validate_command();
Command profile_command();
Command tasks_command();

}  // namespace mixbench
