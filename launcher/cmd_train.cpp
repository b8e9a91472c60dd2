// `tessera train`: one fine-tuning run, launched by mpirun or srun (or alone for one rank).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <fstream>
#include <sstream>
#include <filesystem>
#include <numeric>
#include <iostream>

#include <ATen/ATen.h>

#include "launcher/adapter_source.h"
#include "launcher/bootstrap.h"
#include "launcher/cli.h"
#include "launcher/cmd_lora.h"
#include "launcher/commands.h"
#include "launcher/config.h"
#include "launcher/data_setup.h"
#include "launcher/device_select.h"
#include "launcher/lora_run.h"
#include "launcher/mapped_fault.h"
#include "launcher/model_lm.h"
#include "launcher/plan.h"
#include "launcher/resume.h"
#include "launcher/run_options.h"
#include "launcher/train_samples.h"
#include "model/eval.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/comm/flight_recorder.h"
#include "runtime/data/dataset.h"
#include "runtime/data/splits.h"
#include "runtime/device/device.h"
#include "runtime/device/gemm_probe.h"
#include "runtime/fsdp/loader.h"
#include "runtime/fsdp/strategy_check.h"
#include "runtime/gpu/gpu.h"
#include "runtime/optim/adamw.h"
#include "runtime/quant/nf4_storage.h"
#include "runtime/train/numerics.h"
#include "runtime/train/trainer.h"
#include "text/tokenizer.h"
#include "tools/report.h"
#include "util/error.h"
#include "util/json.h"
#include "util/output_file.h"

namespace tessera::launcher {
namespace fs = std::filesystem;

fsdp::Options fsdp_options_from(const Config& cfg, const model::ModelConfig& mc) {
  fsdp::Options o;
  o.strategy = cfg.fsdp.strategy;
  o.param_dtype = fsdp::scalar_type(cfg.fsdp.mixed_precision);
  o.reduce_dtype = fsdp::scalar_type(cfg.fsdp.reduce_dtype);
  const Recompute ac = cfg.fsdp.activation_checkpointing;
  o.activation_checkpointing = ac == Recompute::True || (ac == Recompute::Auto && mc.hidden_size >= 4096);
  o.prefetch = cfg.fsdp.prefetch;
  o.limit_all_gathers = static_cast<int>(cfg.fsdp.limit_all_gathers);
  o.accumulate = cfg.fsdp.accumulate;
  o.offload = cfg.fsdp.offload;
  // 8-bit moments: every shard and parameter starts at a whole block (runtime/optim/quant8.h).
  o.align = std::lcm(o.align, optim::state_alignment(optim::state_scalar_type(cfg.optim.state_dtype)));
  apply_lora_storage(cfg.lora, o);
  return o;
}

void apply_lora_storage(const lora::Options& lora, fsdp::Options& o) {
  if (!lora.enabled()) return;
  if (lora.quantized()) o.quantized_storage = quant::nf4_storage(lora.double_quant);  // QLoRA
  else if (!lora.base_dtype.empty()) o.frozen_storage = fsdp::dtype_storage(fsdp::parse_dtype(lora.base_dtype));
  o.preserve_rng = lora.dropout > 0;
}

namespace {

c10::Device agree_on_device(const std::string& spec, comm::DeviceBackend backend, const Bootstrap& b) {
  c10::Device device(c10::kCPU);
  std::string error;
  try {
    device = choose_device(spec, device_context(b), backend);
  } catch (const std::exception& e) {
    error = e.what();
  }
  error = b.groups.world->agree_error(error);  // "rank R: ..." of the lowest failing rank, on every rank
  if (error.empty() && b.groups.world->any(device.is_cuda()) && b.groups.world->any(!device.is_cuda()))
    error = b.groups.world->agree_error("train.device=" + spec + " chose " + device::describe(device) + " on host " +
                                        b.host + " but not the same kind of device on every rank; set train.device=cpu "
                                        "or cuda explicitly");
  if (!error.empty()) throw CollectiveError(ErrorKind::Input, error);
  return device;
}

// Stops the run before anything is loaded or written when the memory model predicts more host
// memory on this node than its limit (--host-mem, else the cgroup / SLURM limit), instead of the
// OOM killer ending it halfway through loading.
void check_host_memory(const Config& cfg, const model::ModelConfig& mc, const Bootstrap& b, bool gpu,
                       const std::string& flag) {
  std::string source = "--host-mem " + flag;
  const int64_t limit = flag.empty() ? detect_host_limit(&source)
                                     : static_cast<int64_t>(parse_byte_size(flag, "--host-mem"));
  if (limit <= 0) return;
  PlanRequest req;
  req.world = b.world_size;
  req.ranks_per_node = b.local_size;
  req.gpu = gpu;
  req.host_mem = limit;
  req.stored_bytes = mc.torch_dtype == "float32" ? 4 : 2;
  const planner::Plan plan = plan_run(cfg, mc, req);
  const std::string why = why_not_fit(plan, req);
  if (why.empty()) return;
  std::string impossible;
  const nlohmann::json fixes = fitting_changes(cfg, mc, req, &impossible);
  std::string hint = fixes.empty() ? "nothing the configuration can change makes it fit"
                                   : "it would fit with " + fixes[0]["change"].get<std::string>();
  throw TESSERA_INPUT_ERROR("host memory: the memory model predicts " + why + " (limit from " + source +
                            "); stopping before loading; " + hint + " (see tessera plan)");
}

// Checks a directory can be created and written without touching anything already in it.
void check_writable_dir(const std::string& dir, const std::string& key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || access(dir.c_str(), W_OK) != 0)
    throw TESSERA_INPUT_ERROR(key + " '" + dir + "' is not a writable directory");
}

}  // namespace


// comm.timeout_s -> the default timeout of every Work::wait() (all backends: the MPI backend's wait,
// NCCL's watchdog deadline) and so of the checkpoint's save/load agreement and the launcher's.
void apply_comm_timeout(const Config& cfg) {
  const double s = cfg.comm.timeout_s;  // in [0.001, 1e7]: checked when the configuration was read
  comm::set_default_timeout(std::chrono::milliseconds(std::llround(s * 1000)));
}

// One id for this run on every rank (rank 0's clock and pid), so that flight records of this run
// are told apart from older ones in the same log.dir.
std::string agree_run_id(const Bootstrap& b) {
  std::string id;
  if (b.world_rank == 0)
    id = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count()) +
         "-" + std::to_string(getpid());
  return b.groups.world->broadcast_string(id, 0);
}

// Everything `train` and `eval` set up before the first collective of the engine; run inside
// collectively() so that bad input stops every rank with one message and nothing written.
struct ModelSetup {
  model::ModelConfig config;
  std::shared_ptr<model::ModelDir> dir;  // null: initialise from the preset
  std::string source;
};

ModelSetup setup_model(const Config& cfg) {
  ModelSetup s;
  std::string path = cfg.model.path;
  if (!path.empty()) {
    s.dir = std::make_shared<model::ModelDir>(path);
    s.dir->validate();
    s.config = s.dir->config();
    s.source = path;
  } else {
    s.config = model::ModelConfig::preset(cfg.model.preset);
    s.source = "preset " + cfg.model.preset + " (seed " + std::to_string(cfg.model.seed) + ")";
  }
  return s;
}

// The model's weights; with LoRA the adapters beside them: PEFT's initialisation from train.seed, or
// --adapter's A and B (adapter_dir; validated against the base on the ranks that read).
void load_model_weights(train::Trainer& trainer, const ModelSetup& ms, const Config& cfg, const std::string& adapter_dir) {
  const uint64_t adapter_seed = static_cast<uint64_t>(cfg.train.seed);
  if (!cfg.model.path.empty()) {
    // model.load: rank0 (only rank 0 has a source), parallel, or naive (benchmark baseline).
    std::unique_ptr<HfWeightSource> src;
    if (ms.dir) src = std::make_unique<HfWeightSource>(ms.dir);
    AdapterInitSource adapted = adapter_dir.empty() || !ms.dir
                                    ? AdapterInitSource(src.get(), adapter_seed)
                                    : AdapterInitSource(src.get(), peft_start(open_adapter(adapter_dir, ms.config, cfg.model.path), adapter_dir));
    trainer.load_weights(cfg.lora.enabled() ? static_cast<fsdp::WeightSource*>(&adapted) : src.get(), cfg.model.load);
  } else {
    InitWeightSource src(ms.config, static_cast<uint64_t>(cfg.model.seed));
    AdapterInitSource adapted = adapter_dir.empty()
                                    ? AdapterInitSource(&src, adapter_seed)
                                    : AdapterInitSource(&src, peft_start(open_adapter(adapter_dir, ms.config, ""), adapter_dir));
    if (cfg.lora.enabled()) trainer.load_weights(adapted);
    else trainer.load_weights(src);
  }
}

namespace {

std::string read_tokenizer_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TESSERA_INPUT_ERROR("tokenizer file " + path + " does not exist or cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "12345 tokens in 310 examples -> 96 sequences of 128, packed (tokenizer byte)"
std::string describe_dataset(const data::TokenDataset& d, const std::string& tokenizer) {
  std::ostringstream os;
  os << d.num_tokens() << " tokens in " << d.num_units() << " examples -> " << d.num_sequences() << " sequences of "
     << d.seq_len() << (d.options().packing ? ", packed" : ", padded");
  if (!tokenizer.empty()) os << ", tokenizer " << tokenizer;
  return os.str();
}

// <log.dir>/run_info.json: what `tessera report` shows besides the metrics (config, model, topology).
void write_run_info(const std::string& dir, const Config& cfg, const ModelSetup& ms, const fsdp::Options& fopts,
                    const Bootstrap& b, const data::TokenDataset& train, const data::TokenDataset* val,
                    const text::Tokenizer& tok) {
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  nlohmann::json info = {
      {"started", when},
      {"run_id", comm::flight::run_id()},
      {"config", cfg.json()},
      {"model", {{"source", ms.source}, {"parameters", ms.config.num_parameters()}, {"config", ms.config.to_json()}}},
      {"topology",
       {{"world_size", b.world_size},
        {"nodes", b.num_nodes},
        {"ranks_per_node", b.local_size},
        {"host_of_rank0", b.host},
        {"layout_source", b.layout_source},
        {"threads_per_rank", b.threads},
        {"strategy", fsdp::to_string(fopts.strategy)},
        {"device", device::describe(fopts.device)},
        {"slurm_job", b.slurm.present ? b.slurm.job_id : ""}}},
      {"data",
       {{"tokenizer", tok.name()},
        {"train_sequences", train.num_sequences()},
        {"train_examples", train.num_units()},
        {"val_sequences", val ? val->num_sequences() : 0}}}};
  std::string why;  // a fresh temporary renamed over the name: never through a link (util/output_file.h)
  if (!util::replace_file(dir + "/run_info.json", info.dump(1) + "\n", why)) throw TESSERA_INPUT_ERROR(why);
}

}  // namespace

namespace {

// The trainer's lines for people: progress on stdout, warnings on stderr, each in one write (Open
// MPI's output forwarding can cut a line written in pieces and deliver a piece on the wrong stream).
train::Console console() {
  return {[](const std::string& line) { std::cout << line + "\n" << std::flush; },
          [](const std::string& line) { std::cerr << "tessera: warning: " + line + "\n" << std::flush; }};
}

// Everything run_train sets up before the trainer exists.
struct TrainSetup {
  Config cfg;
  ModelSetup ms;
  fsdp::Options fopts;
  DataSetup data;
  TokenizerChoice tok_choice;
  std::string tok_bytes;  // model.load=rank0: the tokenizer.model rank 0 read, for the other ranks
  std::string adapter_dir;  // --adapter: the PEFT adapter the LoRA adapters start from
  std::string resume_dir;
  std::vector<std::string> resume_candidates;  // resume_dir first, then the fallbacks if it is damaged
  nlohmann::json lora;  // lora_state() of a LoRA run, null without LoRA
  // model.load=rank0 is for a checkpoint on a disk only rank 0 sees: only rank 0 opens and validates
  // it, and the other ranks get its config.json (and tokenizer.model) by broadcast.
  bool rank0_reads = false;
  c10::Device device = c10::kCPU;
  std::string run_id;
  bool finished = false;  // resume_dir is at train.steps, saved by this SLURM job before its requeue
};

// The run configuration, the model's config and the tokenizer choice (rank 0 only with
// model.load=rank0, then broadcast). Collective.
void read_configuration(TrainSetup& s, const po::variables_map& vm, const Bootstrap& b) {
  const bool rank0 = b.world_rank == 0;
  collectively([&] {
    std::vector<std::string> sets;
    if (vm.count("set")) sets = vm["set"].as<std::vector<std::string>>();
    if (vm.count("peak-flops")) sets.push_back("train.peak_flops=" + vm["peak-flops"].as<std::string>());
    model::PeftConfig adapter;
    if (vm.count("adapter")) {  // the adapter's lora.* first: a --set that changes one is refused below
      s.adapter_dir = vm["adapter"].as<std::string>();
      adapter = read_adapter_config(s.adapter_dir);
      const std::vector<std::string> from_adapter = adapter_lora_sets(adapter);
      sets.insert(sets.begin(), from_adapter.begin(), from_adapter.end());
    }
    s.cfg = Config::load(vm["config"].as<std::string>(), sets);
    if (!s.adapter_dir.empty()) check_adapter_lora(s.adapter_dir, adapter, s.cfg.lora);
    train::validate(s.cfg, loss_scaling(s.cfg));
    apply_comm_timeout(s.cfg);
    s.rank0_reads = !s.cfg.model.path.empty() && s.cfg.model.load == fsdp::LoadMode::Rank0;
    if (rank0 || !s.rank0_reads) {
      s.ms = setup_model(s.cfg);
      const std::string path = s.cfg.model.path;
      s.tok_choice = choose_tokenizer(s.cfg.data.tokenizer, path,
                                    path.empty() ? "preset " + s.cfg.model.preset : path, s.ms.config);
      // A SentencePiece tokenizer.model travels by broadcast; a tokenizer.json (with its
      // tokenizer_config.json) is opened by every rank itself.
      if (s.rank0_reads && !s.tok_choice.bytes && !s.tok_choice.bpe()) s.tok_bytes = read_tokenizer_file(s.tok_choice.path);
    }
  });
  if (s.rank0_reads) {
    std::string config_json = b.groups.world->broadcast_string(rank0 ? s.ms.config.to_json().dump() : "", 0);
    s.tok_choice.path = b.groups.world->broadcast_string(s.tok_choice.path, 0);
    s.tok_choice.config = b.groups.world->broadcast_string(s.tok_choice.config, 0);
    s.tok_choice.bytes = s.tok_choice.path.empty();
    s.tok_bytes = b.groups.world->broadcast_string(s.tok_bytes, 0);
    if (!rank0) {
      s.ms.source = s.cfg.model.path;
      s.ms.config = model::ModelConfig::from_json(util::parse_json(config_json), s.ms.source + "/config.json");
    }
  }
}

// "train.lr 0.001 -> 0.0005, data.seq_len 256 -> 128": the keys whose values differ ("" if none).
std::string config_changes(const nlohmann::json& before, const nlohmann::json& now) {
  std::string out;
  for (const auto& op : nlohmann::json::diff(before, now)) {
    std::string key = op.at("path").get<std::string>().substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    const nlohmann::json::json_pointer at(op.at("path").get<std::string>());
    const std::string was = before.contains(at) ? before.at(at).dump() : "unset";
    const std::string is = now.contains(at) ? now.at(at).dump() : "unset";
    out += (out.empty() ? "" : ", ") + key + " " + was + " -> " + is;
  }
  return out;
}

// Resuming from a checkpoint at or past train.steps would train nothing. When this run is a SLURM
// requeue (SLURM_RESTART_COUNT > 0) of the job that saved it (its state.slurm_job is SLURM_JOB_ID),
// that job finished training and was stopped before it exited (a rank killed after the last save):
// the job is done, and this returns true (the caller says so, and every rank exits 0). Anything
// else is refused, saying what was found and the ways on (a re-run with a new learning rate must
// not exit 0 as if it had trained). False when the checkpoint is before the end.
bool finished_by_this_job(const std::string& ckpt, const Config& cfg, int64_t steps, const SlurmEnv& slurm) {
  const checkpoint::Reader r(ckpt);
  if (r.step() < steps) return false;
  if (slurm.present && slurm.restart_count > 0 && r.state().value("slurm_job", std::string()) == slurm.job_id)
    return true;
  std::string changes;
  if (r.state().contains("config")) changes = config_changes(r.state().at("config"), cfg.json());
  throw TESSERA_INPUT_ERROR(
      "checkpoint " + ckpt + " is at step " + std::to_string(r.step()) + ", the end of this run (train.steps " +
      std::to_string(steps) + "): nothing to train" +
      (changes.empty() ? std::string() : "; this configuration differs from the checkpoint's in " + changes) +
      ". To continue, raise train.steps (--set train.steps=" + std::to_string(r.step() + steps) +
      "); to start over, use another checkpoint.dir or pass --fresh (existing checkpoints are kept: the first "
      "save moves them to " + cfg.checkpoint.dir + "/retired/)");
}

// comm.emulate_ranks (runtime/comm/emulation.h): for one rank on a GPU, its NCCL communicators take
// the emulated ranks' time. The same on every rank (the config and the agreed device are).
void emulate_communication(const Config& cfg, const c10::Device& device, int world_size) {
  const comm::Emulation& e = cfg.comm_emulation;
  if (!e.on()) return;
  const std::string what = "comm.emulate_ranks=" + std::to_string(e.ranks);
  if (!device.is_cuda())
    throw TESSERA_INPUT_ERROR(what + " delays the NCCL communicator's stream, but this run is on the CPU (train.device=" +
                              cfg.train.device + "); use train.device=cuda");
  if (world_size != 1)
    throw TESSERA_INPUT_ERROR(what + " stands in for the other ranks of a run of one rank; this run has " +
                              std::to_string(world_size) + " (run one rank, or set comm.emulate_ranks=0)");
  gpu::set_comm_emulation(e);
}

// On a GPU, a kernel the run needs that the device or this LibTorch cannot run is refused in one
// line naming the key (launcher/device_select.h: kernel_refusal); a CPU run needs none of them.
void refuse_unrunnable_kernels(const TrainSetup& s) {
  if (!s.device.is_cuda()) return;
  KernelRequest r;
  r.device = device::describe(s.device);
  r.fused_kernels = s.cfg.model.fused_kernels;
  const at::ScalarType state = optim::state_scalar_type(s.cfg.optim.state_dtype);
  if (s.fopts.offload == fsdp::Offload::None && optim::device_update_is_tesseras(state))
    r.own_optimizer_kernel = util::name_of(optim::state_dtype_names(), s.cfg.optim.state_dtype);
  if (r.fused_kernels || !r.own_optimizer_kernel.empty()) r.image_problem = gpu::kernels_unavailable(s.device.index());
  // fp32 compute takes the mask whatever the LibTorch (flash attention is 16-bit only): what fp32
  // means on a GPU, not a kernel missing.
  const bool half = s.fopts.param_dtype == at::kBFloat16 || s.fopts.param_dtype == at::kHalf;
  if (half && s.cfg.model.varlen_attention && (s.cfg.data.packing || s.ms.config.sliding_window > 0)) {
    r.varlen_for = s.cfg.data.packing ? "data.packing" : "the model's sliding_window";
    r.varlen_problem = model::ops::varlen_kernel_unavailable(s.fopts.param_dtype, s.ms.config.head_dim());
  }
  if (const std::string why = kernel_refusal(r); !why.empty()) throw TESSERA_INPUT_ERROR(why);
}

// Device, run id, every check that can fail before anything is written, the data, the resume point.
// Collective: a failure on any rank stops every rank with one line.
void prepare_run(TrainSetup& s, const po::variables_map& vm, const Bootstrap& b) {
  const bool rank0 = b.world_rank == 0;
  // This rank's device, agreed before anything is written: a bad train.device stops every rank with
  // the lowest failing rank's one-line message (rank, host, device).
  s.device = agree_on_device(s.cfg.train.device, s.cfg.comm.device_backend, b);
  if (s.device.is_cuda() && s.cfg.model.fused_kernels) gpu::install_kernels();  // the model finds them (util/device_kernels.h)
  emulate_communication(s.cfg, s.device, b.world_size);
  s.run_id = agree_run_id(b);
  collectively([&] {
    lora::validate(s.cfg.lora, &s.ms.config, "config");  // targets and rank against the model
    if (s.cfg.lora.enabled()) s.lora = lora_state(s.cfg, base_identity(s.cfg, s.ms.config, s.ms.dir.get()));
    s.fopts = fsdp_options_from(s.cfg, s.ms.config);
    s.fopts.device = s.device;
    check_host_memory(s.cfg, s.ms.config, b, s.device.is_cuda(),
                      vm.count("host-mem") ? vm["host-mem"].as<std::string>() : std::string());
    // A compute dtype this LibTorch cannot multiply on this s.device (fp16 on CPU) is refused before
    // anything runs; it would otherwise fail at the first forward.
    if (const std::string why = device::unsupported_matmul(s.fopts.param_dtype, s.device); !why.empty())
      throw TESSERA_INPUT_ERROR("fsdp.mixed_precision " + std::string(util::short_name(s.cfg.fsdp.mixed_precision)) + ": no matmul in " +
                                "this dtype on " + device::describe(s.device) + " with this LibTorch (" + why +
                                "); use fsdp.mixed_precision bf16 (fp32's range: no loss scaling needed)");
    refuse_unrunnable_kernels(s);
    TESSERA_CHECK_INPUT(s.cfg.data.seq_len <= s.ms.config.max_position_embeddings,
                        "data.seq_len " + std::to_string(s.cfg.data.seq_len) + " exceeds the model's max_position_embeddings " +
                            std::to_string(s.ms.config.max_position_embeddings));
    const bool even = b.world_size == b.num_nodes * b.local_size &&
                      b.groups.intra->size() * b.groups.inter->size() == b.world_size;
    fsdp::validate_strategy(s.fopts.strategy, {b.world_size, b.num_nodes, even ? b.local_size : 0});
    std::unique_ptr<text::Tokenizer> tokenizer =
        s.tok_choice.bytes ? text::make_tokenizer("bytes")
                         : !s.tok_bytes.empty() ? text::make_sentencepiece_tokenizer(s.tok_bytes, s.tok_choice.path)
                                              : text::make_tokenizer(s.tok_choice.path);
    s.data = setup_data(s.cfg, s.ms.config, s.tok_choice, std::move(tokenizer), /*print_warnings=*/rank0);
    const int64_t global = b.world_size * s.cfg.train.micro_batch * s.cfg.train.grad_accum;
    TESSERA_CHECK_INPUT(s.data.train->num_sequences() >= global,
                        "data.path " + s.cfg.data.path + " holds " + std::to_string(s.data.train->num_sequences()) +
                            " sequences of " + std::to_string(s.cfg.data.seq_len + 1) + " tokens, fewer than one global batch (" +
                            std::to_string(b.world_size) + " ranks x micro_batch " + std::to_string(s.cfg.train.micro_batch) +
                            " x grad_accum " + std::to_string(s.cfg.train.grad_accum) + " = " + std::to_string(global) + ")");
    if (!s.cfg.checkpoint.dir.empty()) check_writable_dir(s.cfg.checkpoint.dir, "checkpoint.dir");
    if (!s.cfg.log_dir().empty()) check_writable_dir(s.cfg.log_dir(), "log.dir");
    // The flight recorder dumps to <log.dir>/flight on a timeout, an abort or a fatal signal.
    comm::flight::set_dump_dir(s.cfg.log_dir().empty() ? "" : s.cfg.log_dir() + "/flight", s.run_id, b.world_size);
    comm::flight::install_signal_handlers();
    TESSERA_CHECK_INPUT(!(vm.count("fresh") && vm.count("resume")), "--fresh and --resume contradict each other: give one");
    std::string resume = vm.count("fresh")    ? std::string("never")
                         : vm.count("resume") ? vm["resume"].as<std::string>()
                                              : s.cfg.checkpoint.resume;
    if (resume == "latest" || resume == "auto") {
      TESSERA_CHECK_INPUT(!(resume == "latest" && s.cfg.checkpoint.dir.empty()),
                          "--resume needs checkpoint.dir (or --resume DIR)");
      if (!s.cfg.checkpoint.dir.empty()) s.resume_candidates = intact_resume_candidates(s.cfg.checkpoint.dir, rank0);
      TESSERA_CHECK_INPUT(!s.resume_candidates.empty() || checkpoint::resume_candidates(s.cfg.checkpoint.dir).empty(),
                          "every checkpoint in checkpoint.dir " + s.cfg.checkpoint.dir + " is damaged (said above); "
                          "nothing was changed: to start over, pass --fresh");
    } else if (resume != "never") {
      TESSERA_CHECK_INPUT(fs::is_directory(resume), "--resume " + resume + ": no such checkpoint directory");
      s.resume_candidates = {resume};
    }
  });
  // A checkpoint at the end of the run is verified before the run is called finished (collective).
  s.resume_candidates = drop_damaged_ends(s.resume_candidates, s.cfg.train.steps, *b.groups.world, rank0);
  // The base's identity as rank 0 sees it (model.load=rank0: the only rank that opened the model).
  if (!s.lora.is_null()) s.lora = util::parse_json(b.groups.world->broadcast_string(s.lora.dump(), 0));
  collectively([&] {
    if (s.resume_candidates.empty()) return;
    s.resume_dir = s.resume_candidates.front();
    s.finished = finished_by_this_job(s.resume_dir, s.cfg, s.cfg.train.steps, b.slurm);
    if (!s.finished) keep_global_batch(s.resume_dir, b.world_size, s.cfg, rank0);
    check_lora_resume(s.resume_dir, s.lora);
  });
}

// Rank 0: the run's first line and run_info.json.
void announce_run(const TrainSetup& s, const Bootstrap& b) {
  {
    std::cout << "tessera train: " << b.world_size << " rank(s) on " << b.num_nodes << " node(s), "
              << fsdp::to_string(s.fopts.strategy) << ", " << util::short_name(s.cfg.fsdp.mixed_precision) << " on "
              << (s.device.is_cpu() ? std::string("cpu")
                                    : "cuda (rank 0: " + device::describe(s.device) +
                                          (s.cfg.comm.device_backend == comm::DeviceBackend::Staged
                                               ? ", collectives staged through host memory over MPI)"
                                               : ", NCCL)"))
              << (s.cfg.comm_emulation.on() ? ", collectives timed as " + std::to_string(s.cfg.comm_emulation.ranks) +
                                                  " ranks at " + std::to_string(static_cast<int64_t>(s.cfg.comm_emulation.gbps)) + " GB/s"
                                            : std::string())
              << ", model "
              << s.ms.source << " (" << s.ms.config.num_parameters() << " parameters), data "
              << s.cfg.data.path << " (" << describe_dataset(*s.data.train, s.data.tokenizer->name()) << ")";
    if (s.data.val) std::cout << ", validation " << describe_dataset(*s.data.val, "");
    std::cout << std::endl;
    if (!s.cfg.log_dir().empty()) write_run_info(s.cfg.log_dir(), s.cfg, s.ms, s.fopts, b, *s.data.train, s.data.val.get(), *s.data.tokenizer);
  }
}

// Rank 0, --fresh: a run starting over does not append its curve to the old run's. The old
// log.dir/metrics.jsonl is kept as metrics.jsonl.N (the lowest N not taken: a higher N is a later
// run), said in one line.
void keep_old_metrics(const std::string& log_dir) {
  const fs::path metrics = fs::path(log_dir) / "metrics.jsonl";
  std::error_code ec;
  if (log_dir.empty() || !fs::exists(fs::symlink_status(metrics, ec))) return;
  fs::path kept;
  for (int n = 1;; ++n)
    if (kept = metrics.string() + "." + std::to_string(n); !fs::exists(fs::symlink_status(kept, ec))) break;
  fs::rename(metrics, kept, ec);
  if (ec) throw TESSERA_INPUT_ERROR("--fresh: cannot rename " + metrics.string() + " to " + kept.string() + ": " + ec.message());
  std::cout << "--fresh: the previous run's " << metrics.string() << " is kept as " << kept.string()
            << "; this run starts a new metrics.jsonl" << std::endl;
}

// Rank 0: the outcome (preemption and requeue, the final line, the report).
// A LoRA run that finished: its last checkpoint's adapters as a PEFT adapter directory beside it,
// <checkpoint.dir>/adapter-step-<N> (launcher/cmd_lora.h), unless one is there already. Rank 0.
void export_final_adapter(const train::RunResult& res) {
  if (res.last_checkpoint.empty()) return;  // no checkpoint.dir: nothing to export from
  const std::filesystem::path ckpt(res.last_checkpoint);
  const std::filesystem::path out = ckpt.parent_path() / ("adapter-" + ckpt.filename().string());
  std::error_code ec;
  if (std::filesystem::exists(out, ec)) {
    std::cout << "adapter: " << out.string() << " is there already (written when this step was first reached)" << std::endl;
    return;
  }
  const int64_t n = export_lora_checkpoint(res.last_checkpoint, out.string(), "fp32");
  std::cout << "adapter: " << out.string() << " (PEFT LoRA, " << n << " adapted weights; --adapter, peft, tessera lora merge read it)"
            << std::endl;
}

void report_outcome(const train::RunResult& res, const TrainSetup& s) {
  {
    if (res.preempted) {
      std::cout << "preempted at step " << res.end_step << ": "
                << (res.last_checkpoint.empty() ? "no step completed, nothing to save" : "checkpoint " + res.last_checkpoint)
                << std::endl;
      const Bootstrap& bb = current();
      // Ctrl-C (SIGINT) is a person stopping the run: no requeue.
      if (bb.slurm.present && !bb.slurm.job_id.empty() && train::preemption_signal() != SIGINT) {
        std::string cmd = "scontrol requeue " + bb.slurm.job_id;
        int rc = std::system(cmd.c_str());
        std::cout << cmd << (rc == 0 ? ": requeued" : ": failed (job not requeueable?)") << std::endl;
      }
    }
    std::string where = !res.last_checkpoint.empty() ? "checkpoint " + res.last_checkpoint
                        : s.cfg.checkpoint.dir.empty() ? std::string("no checkpoint (checkpoint.dir unset)")
                                                         : "no checkpoint written (checkpoint.every " +
                                                               std::to_string(s.cfg.checkpoint.every) + ")";
    std::cout << "done: steps " << res.start_step << " -> " << res.end_step;
    if (!res.records.empty())
      std::cout << ", loss " << res.records.front().loss << " -> " << res.records.back().loss;
    std::cout << "; " << where;
    if (res.best_step >= 0) std::cout << "; best val_loss " << res.best_val_loss << " at step " << res.best_step;
    if (!s.cfg.log_dir().empty()) std::cout << "; metrics " << s.cfg.log_dir() << "/metrics.jsonl";
    std::cout << std::endl;
    if (!s.cfg.log_dir().empty()) {
      // The run's report (tessera report RUN_DIR writes the same); a failure here loses nothing.
      try {
        std::cout << "report " << tools::write_report(s.cfg.log_dir()) << std::endl;
      } catch (const std::exception& e) {
        std::cerr << "tessera: warning: cannot write the report: " << e.what() << std::endl;
      }
    }
  }
}

}  // namespace

int run_train(const std::vector<std::string>& args) {
  po::options_description desc("train options");
  desc.add_options()("config,c", po::value<std::string>()->default_value(""), "run configuration (JSON, or YAML when the name ends in .yaml/.yml)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set train.lr=1e-4")(
      "resume", po::value<std::string>()->implicit_value("latest"),
      "resume from the latest complete checkpoint in checkpoint.dir, or from the given directory")(
      "fresh", "start from step 0 even when checkpoint.dir holds checkpoints (they are kept: the first save retires "
      "them to <checkpoint.dir>/retired/), with a new metrics.jsonl (the old one is kept as metrics.jsonl.N)")(
      "host-mem", po::value<std::string>(),
      "host RAM of this node for the job (default: the cgroup or SLURM --mem limit, if any); the run stops "
      "before loading if the memory model predicts more")(
      "adapter", po::value<std::string>(), "a PEFT LoRA adapter directory to start from: its r, lora_alpha, "
      "lora_dropout and target_modules become lora.*, and the adapters start from its A and B")(
      "peak-flops", po::value<std::string>(),
      "peak FLOP/s of one rank for MFU, e.g. 989e12 (sets train.peak_flops; default: the hardware's)");
  desc.add_options()("config-file", po::value<std::string>(), "the configuration given without --config");
  po::positional_options_description config_file;  // `tessera train run.json` is `--config run.json`
  config_file.add("config-file", 1);
  auto vm = parse_command("tessera train --config run.json (or: tessera train run.json) [--set key=value]... "
                          "[--adapter DIR] [--resume [DIR] | --fresh] [--host-mem SIZE]", desc, args, &config_file);
  if (!vm) return 0;
  if (vm->count("config-file")) {
    const std::string given = (*vm)["config-file"].as<std::string>(), flag = (*vm)["config"].as<std::string>();
    TESSERA_CHECK_INPUT(flag.empty(), "the configuration is given twice (--config " + flag + " and " + given +
                                          "); give one");
    (*vm).at("config").value() = given;
  }
  const Bootstrap& b = current();
  const bool rank0 = b.world_rank == 0;
  TrainSetup s;
  read_configuration(s, *vm, b);
  prepare_run(s, *vm, b);
  if (s.finished) {
    if (rank0)
      std::cout << "tessera train: checkpoint " << s.resume_dir << " is at the end of this run (train.steps "
                << s.cfg.train.steps << "); SLURM job " << b.slurm.job_id << " saved it before this restart (SLURM_RESTART_COUNT "
                << b.slurm.restart_count << "): training is complete, nothing left to do" << std::endl;
    return 0;
  }
  nlohmann::json run_state = {{"config", s.cfg.json()}, {"model_config", s.ms.config.to_json()},
                              {"model_source", s.ms.source}};
  if (b.slurm.present) run_state["slurm_job"] = b.slurm.job_id;  // finished_by_this_job() reads it
  if (!s.lora.is_null()) run_state["lora"] = s.lora;  // the adapters' settings and their base (lora_run.h)
  collectively([&] {  // run_info.json cannot be written: every rank ends with the line
    if (rank0 && vm->count("fresh")) keep_old_metrics(s.cfg.log_dir());
    if (rank0) announce_run(s, b);
  });
  // NCCL communicators (cuda) or the bootstrap's MPI groups (cpu). An NCCL initialisation failure on
  // one rank is an error of that rank (it aborts the world; no rank waits in a collective). Declared
  // before the trainer: destroyed after it and its model, on every path (see ~Trainer).
  const comm::ProcessGroups groups = device_groups(b, s.device, s.cfg.comm.device_backend);
  const train::CausalLm lm = make_causal_lm(s.ms.config, s.cfg.lora, s.cfg.model.varlen_attention);
  train::Trainer trainer(lm, groups, s.fopts, s.cfg, s.data.train, run_state, b.groups);
  if (s.data.val) trainer.set_validation(s.data.val);
  if (s.cfg.sample.every > 0) {
    SampleSources src{s.data.tokenizer.get(), s.data.chat.get(), s.ms.config, {}, s.ms.source};
    if (src.model_name.empty()) src.model_name = "preset " + s.cfg.model.preset;
    trainer.set_samples(make_train_samples(s.cfg, std::move(src), s.cfg.model.path, lm, trainer.engine(), b.groups.world));
  }
  if (!s.resume_dir.empty()) {
    // A LoRA checkpoint holds the adapters only: the frozen base comes from the model first.
    if (s.cfg.lora.enabled()) collectively([&] { load_model_weights(trainer, s.ms, s.cfg, ""); });
    collectively([&] { s.resume_dir = resume_first_intact(trainer, s.resume_candidates, rank0); });
    if (rank0) std::cout << "resumed from " << s.resume_dir << " at step " << trainer.step()
                         << (s.adapter_dir.empty() ? "" : " (its adapters continue; --adapter " + s.adapter_dir +
                                                              " started this run and is not read again)")
                         << std::endl;
  } else {
    collectively([&] { load_model_weights(trainer, s.ms, s.cfg, s.adapter_dir); });
    if (rank0 && !s.adapter_dir.empty()) std::cout << "LoRA adapters start from " << s.adapter_dir << std::endl;
  }
  trainer.set_console(console());
  train::install_preemption_handlers(train::signal_number(s.cfg.train.preempt_signal));
  comm::flight::install_signal_handlers();  // again: its SIGTERM dump runs first, then the preemption flag
  install_mapped_file_fault_handler();  // last: a SIGBUS on a mapped data file names the file, exit 2
  const train::RunResult res = trainer.run();
  if (rank0) report_outcome(res, s);
  if (s.cfg.lora.enabled() && !res.preempted) collectively([&] { if (rank0) export_final_adapter(res); });
  return 0;
}

}  // namespace tessera::launcher

namespace tessera::launcher {
namespace {

// The split eval --data scores: --split; else, when the data directory has splits, the one training
// validates on (data.val_split: validation, else test); else data.split. *scored: its name when the
// directory has splits (else left null), said in one line on stderr.
std::string eval_split(const po::variables_map& vm, const DataSection& data, nlohmann::json* scored) {
  const data::Splits splits = data::find_splits(data.path, data.format);
  std::string name = vm.count("split") ? vm["split"].as<std::string>() : "";
  if (vm.count("split")) splits.get(name, "--split");  // refuses a split that is not there
  else if (!splits.rule.empty()) name = splits.validation(data.val_split, "data.val_split", "");
  if (name.empty()) name = data.split;
  if (!splits.rule.empty()) {
    *scored = name;
    if (current().world_rank == 0)  // stderr: stdout is eval's one JSON line
      std::cerr << "eval: split " << name << " of " << data.path
                << (vm.count("split") ? " (--split)" : " (the split training validates on; --split another)") << std::endl;
  }
  return name;
}

// eval --data: the dataset `tessera train` builds from PATH with the run configuration's data.*
// keys (no validation split), its targets as training's (data.train_on), or every token with
// --all-tokens. Sets *settings to the configuration's (micro_batch: the rows of one forward), *split
// to the split scored (null when the data has no splits: all of it).
std::shared_ptr<data::TokenDataset> eval_dataset(const po::variables_map& vm, const std::string& model_dir,
                                                 const model::ModelConfig& mc, train::Settings* settings,
                                                 nlohmann::json* split) {
  std::vector<std::string> sets;
  if (vm.count("set"))  // lora.* are eval_lora's (with an --adapter's, which these alone may not make valid)
    for (const std::string& kv : vm["set"].as<std::vector<std::string>>())
      if (kv.rfind("lora.", 0) != 0) sets.push_back(kv);
  for (const char* s : {"data.val_path=", "data.val_fraction=0"}) sets.push_back(s);
  sets.push_back("data.path=" + vm["data"].as<std::string>());
  if (vm.count("all-tokens")) sets.push_back("data.train_on=all");
  sets.push_back("data.split=" + eval_split(vm, Config::load(vm["config"].as<std::string>(), sets).data, split));
  sets.push_back("data.val_split=none");
  const Config cfg = Config::load(vm["config"].as<std::string>(), sets);
  const TokenizerChoice tc = choose_tokenizer(cfg.data.tokenizer, model_dir, model_dir, mc);
  // What the data setup says about the files goes to stderr: stdout is eval's one JSON line.
  std::streambuf* const out = std::cout.rdbuf(std::cerr.rdbuf());
  struct Restore {
    std::streambuf* buf;
    ~Restore() { std::cout.rdbuf(buf); }
  } restore{out};
  DataSetup d = setup_data(cfg, mc, tc, text::make_tokenizer(tc.bytes ? std::string("bytes") : tc.path),
                           current().world_rank == 0);
  settings->train = cfg.train;  // the loop's options: micro_batch rows per forward
  return d.train;
}

// The lora.* keys eval takes from --config / --set (after --adapter's adapter_config.json, as train
// --adapter does). *as_trained: the model is built as LoRA training builds it (the adapters beside
// the frozen base stored in lora.base_dtype: `--set lora.base_dtype=nf4` scores it as QLoRA trains
// it) when lora.base_dtype is set or lora.rank is set without --adapter; else an --adapter is merged
// into the weights as they are read (AdapterWeightSource: exact in fp32).
lora::Options eval_lora(const po::variables_map& vm, const model::ModelConfig& mc, bool* as_trained) {
  std::vector<std::string> sets;
  if (vm.count("set")) sets = vm["set"].as<std::vector<std::string>>();
  if (!vm.count("data"))
    for (const std::string& kv : sets)
      TESSERA_CHECK_INPUT(kv.rfind("lora.", 0) == 0, "--set " + kv + ": without --data eval takes only lora.* keys");
  model::PeftConfig adapter;
  if (vm.count("adapter")) {
    adapter = read_adapter_config(vm["adapter"].as<std::string>());
    const std::vector<std::string> from_adapter = adapter_lora_sets(adapter);
    sets.insert(sets.begin(), from_adapter.begin(), from_adapter.end());
  }
  const Config cfg = Config::load(vm["config"].as<std::string>(), sets);
  if (vm.count("adapter")) check_adapter_lora(vm["adapter"].as<std::string>(), adapter, cfg.lora);
  lora::validate(cfg.lora, &mc, "eval");
  *as_trained = cfg.lora.enabled() && (!cfg.lora.base_dtype.empty() || !vm.count("adapter"));
  return cfg.lora;
}

// eval's weights: the base model's, with --adapter's merged into them or beside them (as_trained;
// without --adapter the adapters start as PEFT's, B = 0: the base model's output).
void load_eval_weights(train::Trainer& trainer, const std::shared_ptr<model::ModelDir>& dir,
                       const std::shared_ptr<const model::PeftAdapter>& adapter, const std::string& adapter_dir,
                       bool as_trained) {
  auto base = std::make_unique<HfWeightSource>(dir);
  if (!as_trained) {
    std::unique_ptr<fsdp::WeightSource> src = std::move(base);
    if (adapter) src = std::make_unique<AdapterWeightSource>(std::move(src), adapter);
    return trainer.load_weights(*src);
  }
  AdapterInitSource src = adapter ? AdapterInitSource(base.get(), peft_start(adapter, adapter_dir))
                                  : AdapterInitSource(base.get(), uint64_t{0});
  trainer.load_weights(src);
}

}  // namespace

// `tessera eval`: the model sharded with FSDP (full_shard) over every rank, each sequence's forward
// run by all ranks together; rank 0 prints the same numbers a single process prints.
int run_eval(const std::vector<std::string>& args) {
  po::options_description desc("eval options");
  desc.add_options()("model", po::value<std::string>()->required(), "Hugging Face model directory (config.json + safetensors)")(
      "adapter", po::value<std::string>(), "a PEFT LoRA adapter directory applied to the model (W + alpha/r B A)")(
      "tokens", po::value<std::string>(), "token ids, one sequence per line, whitespace-separated (every token scored)")(
      "data", po::value<std::string>(), "data as `tessera train` reads it (chat, prompt/completion, text, a token file); "
      "its target tokens are scored, as training's validation loss")(
      "config,c", po::value<std::string>()->default_value(""), "the run configuration whose data.* (with --data) and lora.* keys apply")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key: data.* with --data; lora.* "
      "(e.g. lora.base_dtype=nf4: the base as QLoRA trains it)")(
      "all-tokens", "with --data: score every token, not only the targets")(
      "split", po::value<std::string>(), "with --data: the split of a data directory with splits to score (default: "
      "the one training validates on, validation else test)")(
      "dtype", po::value<std::string>()->default_value("fp32"), "compute dtype: fp32 or bf16");
  auto vm = parse_command("tessera eval --model DIR [--adapter DIR] (--tokens FILE | --data PATH [--split NAME] [--all-tokens]) "
                          "[--config run.json] [--set key=value]... [--dtype fp32|bf16]", desc, args);
  if (!vm) return 0;
  const Bootstrap& b = current();
  std::shared_ptr<model::ModelDir> dir;
  std::shared_ptr<const model::PeftAdapter> adapter;  // --adapter
  std::vector<std::vector<int64_t>> sequences;
  std::shared_ptr<data::TokenDataset> dataset;
  nlohmann::json split;  // the split --data scored; null: the data has no splits
  fsdp::Options fopts;
  train::Settings settings;
  lora::Options lo;        // lora.*: with as_trained, the model as LoRA training builds it (eval_lora)
  bool as_trained = false;
  collectively([&] {
    TESSERA_CHECK_INPUT(vm->count("tokens") + vm->count("data") == 1, "tessera eval needs one of --tokens FILE or --data PATH");
    TESSERA_CHECK_INPUT(vm->count("data") || !(vm->count("all-tokens") || vm->count("split")),
                        "--all-tokens and --split apply to --data (a --tokens file is scored on every token)");
    std::string dtype = (*vm)["dtype"].as<std::string>();
    TESSERA_CHECK_INPUT(dtype == "fp32" || dtype == "bf16", "--dtype '" + dtype + "' must be fp32 or bf16");
    fopts.param_dtype = fsdp::parse_dtype(dtype);
    dir = std::make_shared<model::ModelDir>((*vm)["model"].as<std::string>());
    dir->validate();
    lo = eval_lora(*vm, dir->config(), &as_trained);
    if (as_trained) apply_lora_storage(lo, fopts);
    if (vm->count("adapter")) adapter = open_adapter((*vm)["adapter"].as<std::string>(), dir->config(), (*vm)["model"].as<std::string>());
    if (vm->count("data")) dataset = eval_dataset(*vm, (*vm)["model"].as<std::string>(), dir->config(), &settings, &split);
    else sequences = model::read_token_text((*vm)["tokens"].as<std::string>(), dir->config().vocab_size);
  });
  train::Trainer trainer(make_causal_lm(dir->config(), as_trained ? lo : lora::Options{}), b.groups, fopts, settings,
                         nullptr, {});
  collectively([&] {
    load_eval_weights(trainer, dir, adapter, vm->count("adapter") ? (*vm)["adapter"].as<std::string>() : "", as_trained);
  });
  // Evaluation's own peak (the load's is not part of it): what inference holds.
  memory::Breakdown mem;
  mem.process_base = trainer.process_base_rss();
  memory::reset_peak_rss();
  memory::reset_peak();
  nlohmann::json out;
  if (dataset) {  // training's validation loss over this data
    trainer.set_validation(dataset);
    const train::Trainer::EvalResult e = trainer.evaluate();
    out = {{"mean_loss", e.loss}, {"tokens", e.targets}, {"sequences", dataset->num_sequences()},
           {"scored", vm->count("all-tokens") ? "all tokens" : "target tokens"}, {"split", split}};
  } else {
    std::vector<double> losses;
    int64_t predicted = 0;
    for (const auto& s : sequences) {
      at::Tensor t = at::tensor(s, at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
      losses.push_back(trainer.sequence_losses(t)[0]);
      predicted += static_cast<int64_t>(s.size()) - 1;
    }
    out = {{"per_sequence_loss", losses}, {"mean_loss", model::mean_token_loss(losses, sequences)},
           {"tokens", predicted}, {"scored", "all tokens"}};
  }
  mem.tracked = memory::peak();
  mem.peak_rss = memory::peak_rss_bytes();
  out["memory"] = mem.to_json();
  if (adapter) out["adapter"] = (*vm)["adapter"].as<std::string>();
  if (as_trained) out["lora"] = {{"rank", lo.rank}, {"base_dtype", lo.base_dtype.empty() ? "compute dtype" : lo.base_dtype}};
  if (b.world_rank == 0) std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace tessera::launcher
