// SLURM environment parsing: hostlists ("gpu[001-004,010],login2"), task counts ("2(x3),1") and the
// SLURM_* variables a job step hands to its tasks. Errors name the variable (or the text) and why.
#include "launcher/slurm_env.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <numeric>

#include "util/error.h"

namespace tessera::launcher {
namespace {

// A hostlist that expands past this is almost certainly a typo ("n[1-99999999]"), not a cluster.
constexpr size_t kMaxHosts = size_t{1} << 20;
// Nor one whose names add up to more than this (4 KB of text must not become gigabytes of names).
constexpr size_t kMaxHostBytes = size_t{64} << 20;

// Messages quote the variables' text; its control characters are escaped (\x0a) so that the
// message stays one line.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else {
      const char hex[] = "0123456789abcdef";
      out += {'\\', 'x', hex[c >> 4], hex[c & 15]};
    }
  }
  return out;
}

[[noreturn]] void hostlist_error(const std::string& what, const std::string& text, const std::string& why) {
  throw TESSERA_INPUT_ERROR(printable("malformed hostlist " + what + "'" + text + "': " + why));
}

// "a,,b" -> {"a", "", "b"}: every item between commas, empty ones too ("" -> {""}).
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  for (size_t start = 0;;) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

// One bracket group "[001-004,010]" expanded to its zero-padded numbers ("001", ..., "010").
std::vector<std::string> expand_bracket(const std::string& body, const std::string& what, const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& range : split_commas(body)) {
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    auto is_number = [](const std::string& s) {
      return !s.empty() && s.size() <= 18 &&
             std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    };
    if (!is_number(lo) || !is_number(hi))
      hostlist_error(what, text, "bad range '" + range + "' in [" + body + "] (want N or N-M with digits)");
    const unsigned long long a = std::stoull(lo), b = std::stoull(hi);
    if (a > b) hostlist_error(what, text, "range '" + range + "' runs backwards");
    if (b - a >= kMaxHosts) hostlist_error(what, text, "range '" + range + "' is too large");
    // Slurm keeps the lower bound's width: [01-3] -> 01,02,03 and [1-03] -> 1,2,3.
    const size_t width = lo.size();
    for (unsigned long long v = a; v <= b; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      out.push_back(std::move(num));
      if (out.size() > kMaxHosts) hostlist_error(what, text, "expands to too many hosts");
    }
  }
  return out;
}

// One comma-free item such as "r[1-2]-n[01-03]": the cartesian product of its bracket groups in the
// order `scontrol show hostnames` (Slurm's hostlist.c) produces. The last group varies fastest; the
// others nest from the second-to-last (slowest) down to the first, because Slurm peels groups off the
// prefix from the right. For two groups that is plain row-major order (r1-n01, r1-n02, ..., r2-n03);
// for x[0-1]y[0-1]z[0-1] it is x0y0z0, x0y0z1, x1y0z0, x1y0z1, x0y1z0, ...
void expand_item(const std::string& item, const std::string& what, const std::string& text,
                 std::vector<std::string>& out, size_t& out_bytes) {
  if (item.empty()) hostlist_error(what, text, "empty host name");
  std::vector<std::string> literals;             // literals[i] precedes groups[i]
  std::vector<std::vector<std::string>> groups;  // expanded numbers of each bracket group
  size_t pos = 0, total = 1, name_bytes = 0;     // hosts of this item; longest host name
  for (size_t open; (open = item.find('[', pos)) != std::string::npos;) {
    const size_t close = item.find(']', open);  // pairing and nesting were checked by the caller
    literals.push_back(item.substr(pos, open - pos));
    groups.push_back(expand_bracket(item.substr(open + 1, close - open - 1), what, text));
    pos = close + 1;
    // Checked group by group: "[0-999999][0-999999]..." must fail before expanding every group.
    total *= groups.back().size();
    if (total + out.size() > kMaxHosts) hostlist_error(what, text, "expands to too many hosts");
    size_t widest = 0;
    for (const auto& v : groups.back()) widest = std::max(widest, v.size());
    name_bytes += literals.back().size() + widest;
  }
  if (groups.empty()) {
    out.push_back(item);
    out_bytes += item.size();
    return;
  }
  // Slurm 22.05 rejects "n[1-2]-ib" too; accepting it would make the order above ambiguous.
  if (pos != item.size()) hostlist_error(what, text, "text after the last ']' in '" + item + "'");
  out_bytes += total * name_bytes;  // an upper bound
  if (out_bytes > kMaxHostBytes)
    hostlist_error(what, text, "expands to more than " + std::to_string(kMaxHostBytes >> 20) + " MiB of host names");

  const size_t n = groups.size();
  // Odometer over the groups, slowest first: n-2, n-3, ..., 0, then n-1.
  std::vector<size_t> slow_to_fast;
  for (size_t g = n - 1; g-- > 0;) slow_to_fast.push_back(g);
  slow_to_fast.push_back(n - 1);
  std::vector<size_t> index(n, 0);
  for (size_t k = 0; k < total; ++k) {
    std::string host;
    for (size_t g = 0; g < n; ++g) host += literals[g] + groups[g][index[g]];
    out.push_back(std::move(host));
    for (size_t d = n; d-- > 0;) {  // advance the fastest digit, carrying towards the slowest
      const size_t g = slow_to_fast[d];
      if (++index[g] < groups[g].size()) break;
      index[g] = 0;
    }
  }
}

// `what` names the source in errors ("SLURM_JOB_NODELIST=" or "").
std::vector<std::string> expand_hostlist_named(const std::string& text, const std::string& what) {
  std::vector<std::string> hosts;
  size_t bytes = 0;
  if (text.empty()) return hosts;
  // Split at commas outside brackets, checking that brackets pair up and do not nest.
  bool in_bracket = false;
  size_t item_start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (i < text.size() && (std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c))))
      hostlist_error(what, text, "whitespace or control character at position " + std::to_string(i));
    if (c == '[') {
      if (in_bracket) hostlist_error(what, text, "nested '[' at position " + std::to_string(i));
      in_bracket = true;
    } else if (c == ']') {
      if (!in_bracket) hostlist_error(what, text, "']' without '[' at position " + std::to_string(i));
      in_bracket = false;
    } else if (c == ',' && !in_bracket) {
      expand_item(text.substr(item_start, i - item_start), what, text, hosts, bytes);
      item_start = i + 1;
    }
    if (i + 1 == text.size() && in_bracket) hostlist_error(what, text, "unclosed '['");
  }
  return hosts;
}

// Strict decimal integer (optionally negative), whole string, fits in int.
bool parse_int(const std::string& s, int& value) {
  if (s.empty() || s.size() > 10) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(s[k]))) return false;
  const long long v = std::stoll(s);
  if (v < INT32_MIN || v > INT32_MAX) return false;
  value = static_cast<int>(v);
  return true;
}

std::vector<int> expand_tasks_named(const std::string& spec, const std::string& what) {
  auto fail = [&](const std::string& why) -> void {
    throw TESSERA_INPUT_ERROR(printable("malformed tasks-per-node " + what + "'" + spec + "': " + why +
                                        " (want e.g. 2(x3),1)"));
  };
  if (spec.empty()) fail("empty");
  std::vector<int> out;
  for (const std::string& item : split_commas(spec)) {
    // "N" or "N(xR)"
    const size_t paren = item.find('(');
    const std::string count_text = item.substr(0, paren);
    int count = 0, repeat = 1;
    if (!parse_int(count_text, count) || count < 1) fail("bad task count '" + count_text + "'");
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
        fail("bad repeat '" + item.substr(paren) + "'");
      const std::string rep = item.substr(paren + 2, item.size() - paren - 3);
      if (!parse_int(rep, repeat) || repeat < 1) fail("bad repeat count '" + rep + "'");
      if (out.size() + repeat > kMaxHosts) fail("too many nodes");
    }
    out.insert(out.end(), static_cast<size_t>(repeat), count);
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) { return expand_hostlist_named(hostlist, ""); }

std::vector<int> expand_tasks_per_node(const std::string& spec) { return expand_tasks_named(spec, ""); }

SlurmEnv read_slurm_env(const std::function<const char*(const char*)>& getenv_fn) {
  auto get = [&](const char* name) -> std::optional<std::string> {
    const char* v = getenv_fn ? getenv_fn(name) : std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
  };
  // First variable of `names` that is set, with its name (for error messages).
  auto first = [&](std::initializer_list<const char*> names) -> std::pair<std::string, std::optional<std::string>> {
    for (const char* n : names)
      if (auto v = get(n)) return {n, v};
    return {"", std::nullopt};
  };
  auto get_int = [&](std::initializer_list<const char*> names, int min_value, int& out) {
    auto [name, v] = first(names);
    if (!v) return;
    if (!parse_int(*v, out) || out < min_value)
      throw TESSERA_INPUT_ERROR(name + "='" + printable(*v) + "' is not an integer >= " + std::to_string(min_value));
  };

  SlurmEnv env;
  auto job = first({"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job.second) return env;
  env.present = true;
  env.job_id = *job.second;
  if (env.job_id.empty()) throw TESSERA_INPUT_ERROR(job.first + " is set but empty");
  env.in_step = get("SLURM_STEP_ID").has_value() || get("SLURM_STEPID").has_value();

  get_int({"SLURM_PROCID"}, 0, env.procid);
  get_int({"SLURM_LOCALID"}, 0, env.localid);
  get_int({"SLURM_NODEID"}, 0, env.nodeid);
  // Inside a step the step's own counts describe this world; the job's describe the allocation.
  get_int({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, 1, env.ntasks);
  get_int({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1, env.nnodes);
  get_int({"SLURM_GPUS_ON_NODE"}, 0, env.gpus_on_node);
  get_int({"SLURM_RESTART_COUNT"}, 0, env.restart_count);

  auto job_nl = first({"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  auto step_nl = first({"SLURM_STEP_NODELIST"});
  env.job_nodelist = job_nl.second.value_or("");
  env.step_nodelist = step_nl.second.value_or("");
  const auto& nl = step_nl.second ? step_nl : job_nl;
  if (nl.second) {
    env.nodes = expand_hostlist_named(*nl.second, nl.first + "=");
    if (env.nodes.empty()) throw TESSERA_INPUT_ERROR(nl.first + " is set but empty");
  }
  auto tpn = first({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  if (tpn.second) env.tasks_per_node = expand_tasks_named(*tpn.second, tpn.first + "=");

  // Cross-checks between the variables that describe the same thing.
  const std::string counts = " (" + nl.first + "='" + printable(nl.second.value_or("")) + "', " + tpn.first + "='" +
                             printable(tpn.second.value_or("")) + "', ntasks=" + std::to_string(env.ntasks) +
                             ", nnodes=" + std::to_string(env.nnodes) + ")";
  if (env.nnodes > 0 && !env.nodes.empty() && static_cast<int>(env.nodes.size()) != env.nnodes)
    throw TESSERA_INPUT_ERROR("SLURM node list has " + std::to_string(env.nodes.size()) + " hosts but node count is " +
                              std::to_string(env.nnodes) + counts);
  if (!env.tasks_per_node.empty() && !env.nodes.empty() && env.tasks_per_node.size() != env.nodes.size())
    throw TESSERA_INPUT_ERROR("SLURM tasks-per-node covers " + std::to_string(env.tasks_per_node.size()) +
                              " nodes but the node list has " + std::to_string(env.nodes.size()) + counts);
  if (!env.tasks_per_node.empty() && env.ntasks > 0 &&
      std::accumulate(env.tasks_per_node.begin(), env.tasks_per_node.end(), 0) != env.ntasks)
    throw TESSERA_INPUT_ERROR("SLURM tasks-per-node does not add up to the task count" + counts);
  if (env.procid >= 0 && env.ntasks > 0 && env.procid >= env.ntasks)
    throw TESSERA_INPUT_ERROR("SLURM_PROCID=" + std::to_string(env.procid) + " is not below the task count " +
                              std::to_string(env.ntasks));
  if (env.nodeid >= 0 && env.nnodes > 0 && env.nodeid >= env.nnodes)
    throw TESSERA_INPUT_ERROR("SLURM_NODEID=" + std::to_string(env.nodeid) + " is not below the node count " +
                              std::to_string(env.nnodes));
  if (env.localid >= 0 && env.nodeid >= 0 && env.nodeid < static_cast<int>(env.tasks_per_node.size()) &&
      env.localid >= env.tasks_per_node[env.nodeid])
    throw TESSERA_INPUT_ERROR("SLURM_LOCALID=" + std::to_string(env.localid) + " is not below the " +
                              std::to_string(env.tasks_per_node[env.nodeid]) + " tasks of node " +
                              std::to_string(env.nodeid) + counts);
  return env;
}

}  // namespace tessera::launcher
