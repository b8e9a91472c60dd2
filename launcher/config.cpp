#include "launcher/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "launcher/cli.h"
#include "model/config.h"
#include "runtime/fsdp/names.h"
#include "util/error.h"
#include "util/json.h"

namespace tessera::launcher {

using nlohmann::json;

namespace {

template <class T> struct TypeName;
template <> struct TypeName<int64_t> { static constexpr const char* name = "int"; };
template <> struct TypeName<double> { static constexpr const char* name = "float"; };
template <> struct TypeName<bool> { static constexpr const char* name = "bool"; };
template <> struct TypeName<std::string> { static constexpr const char* name = "string"; };
template <> struct TypeName<std::vector<int64_t>> { static constexpr const char* name = "int list"; };
template <> struct TypeName<std::vector<std::string>> { static constexpr const char* name = "string list"; };

struct Bounds {
  std::optional<double> min, max;
  bool max_open = false;
};
Bounds at_least(double min) { return {min, std::nullopt, false}; }

// A key whose field holds its JSON value as is (int64_t, double, bool, std::string, int list). Its
// default is the field's initialiser in its section (or owner struct), B being Config or a base.
template <class B, class S, class T>
ConfigKey field(S B::*section, T S::*member, const char* key, const char* help, Bounds bounds = {},
                util::Names choices = {}) {
  static_assert(std::is_base_of_v<B, Config>);
  ConfigKey k{key, TypeName<T>::name, json(S{}.*member), help, std::move(choices), bounds.min, bounds.max, bounds.max_open, {}, {}};
  k.store = [section, member](Config& c, const json& v) { (c.*section).*member = v.get<T>(); };
  k.value = [section, member](const Config& c) { return json((c.*section).*member); };
  return k;
}

// An enumerated key: a string among `names` (util/enum_names.h: names[i] names E(i)), held as the enum.
template <class B, class S, class E>
ConfigKey choice(S B::*section, E S::*member, const char* key, const util::Names& names, const char* help) {
  static_assert(std::is_base_of_v<B, Config>);
  ConfigKey k{key, "string", json(util::name_of(names, S{}.*member)), help, names, std::nullopt, std::nullopt, false, {}, {}};
  k.store = [section, member, names](Config& c, const json& v) {
    (c.*section).*member = *util::enum_named<E>(names, v.get<std::string>());  // checked against the choices
  };
  k.value = [section, member, names](const Config& c) { return json(util::name_of(names, (c.*section).*member)); };
  return k;
}

}  // namespace

namespace {

// The model and data sections of the schema (the rest: config_schema).
std::vector<ConfigKey> model_and_data_keys() {
  using C = Config;
  return {
      // model
      field(&C::model, &ModelSection::path, "model.path", "Hugging Face model directory (config.json + safetensors). Empty: build `model.preset` from `model.seed`."),
      field(&C::model, &ModelSection::preset, "model.preset", "Preset used when model.path is empty (any family of the model registry).", {},
            model::ModelConfig::preset_names()),
      field(&C::model, &ModelSection::seed, "model.seed", "Seed of the initialisation when model.path is empty."),
      choice(&C::model, &ModelSection::load, "model.load", fsdp::load_mode_names(),
             "How weights are read: rank0 (rank 0 streams unit by unit and scatters shards), parallel (every rank reads only its byte ranges; shared file system), naive (every rank reads everything; benchmark baseline only)."),
      field(&C::model, &ModelSection::fused_kernels, "model.fused_kernels",
            "On a GPU, RMSNorm, SwiGLU, RoPE and the head's cross entropy run as Tessera's own kernels, one each way (docs/PERFORMANCE.md); false: LibTorch's composites (to measure one against the other). A CPU always runs the composites. A GPU the build's kernels have no image for is refused at start."),
      field(&C::model, &ModelSection::varlen_attention, "model.varlen_attention",
            "On a GPU, packed rows (data.packing) and sliding windows (Mistral) run on FlashAttention's variable-length kernel: each document attends within itself, no [B, 1, T, T] mask. With bf16 or fp16 compute, where it cannot run (LibTorch before 2.6, head_dim not a multiple of 8 or above 256) the run is refused at start; false: SDPA with the mask (slower, more memory; to measure one against the other). fp32 compute and a CPU always run the mask (flash attention is 16-bit only)."),
      // data
      field(&C::data, &DataSection::path, "data.path",
            "Training data: a JSONL file (records `messages` (chat), `prompt`/`completion`, `text`, Alpaca or ShareGPT, auto-detected per record), a JSON array of such records, either gzip-compressed, plain text (*.txt, *.md, *.text or no extension), a token file from `tessera tokenize`, or a directory of them (docs/DATA.md). Anything else is refused."),
      choice(&C::data, &DataSection::format, "data.format", data::data_format_names(),
             "How data files are read: auto (decided per file by content and extension, printed at start), or jsonl, json, text for every file whatever its name (token files aside)."),
      field(&C::data, &DataSection::tokenizer, "data.tokenizer",
            "SentencePiece tokenizer.model (Llama 2 format), a Hugging Face BPE tokenizer.json (byte-level as Llama 3's, or SentencePiece-converted as Llama 2's and Mistral's; a *.json file or a directory holding tokenizer.json), or `bytes` (byte-level tokens 0-255, BOS 256, EOS 257). Its vocabulary must fit the model's vocab_size. Empty: the model directory's tokenizer.model, else its tokenizer.json; byte-level tokens when the model's vocabulary is the byte vocabulary (BOS 256, EOS 257: the tiny presets); otherwise an error naming the model's vocab size."),
      field(&C::data, &DataSection::seq_len, "data.seq_len", "Tokens per training sequence (<= the model's max_position_embeddings).", at_least(1)),
      choice(&C::data, &DataSection::chat_template, "data.chat_template", text::chat_template_names(), "How `messages` records are rendered: auto (the model's own Jinja `chat_template` from the tokenizer_config.json beside its tokenizer, rendered as transformers does; llama2 when it has none; the choice is printed), llama2 (`<s>[INST] <<SYS>>...<</SYS>> user [/INST] assistant </s>`, as Meta and Hugging Face), llama3 (header and <|eot_id|> special tokens of the tokenizer), none (contents concatenated). Targets: the assistant turns and their end-of-turn (docs/DATA.md)."),
      choice(&C::data, &DataSection::train_on, "data.train_on", train_on_names(),
             "Loss targets: completion (assistant turns and completions; `text` records and text files entirely) or all (every token)."),
      field(&C::data, &DataSection::packing, "data.packing", "Pack several examples into each sequence (a token attends only within its example, positions restart per example); false: one example per sequence, padded."),
      choice(&C::data, &DataSection::truncation, "data.truncation", data::truncation_names(),
             "An example (chat, prompt/completion) longer than seq_len + 1 tokens: drop (skip it with a warning naming file and line), left (keep its last seq_len + 1 tokens), error (stop). Text is cut into pieces instead."),
      field(&C::data, &DataSection::val_path, "data.val_path", "Validation data, in the formats of data.path (a directory with splits: its data.val_split)."),
      field(&C::data, &DataSection::split, "data.split",
            "The split of data.path to train on when the directory has splits, named as Hugging Face datasets names them: files or folders holding train / validation / test (train.jsonl, test/, data/train-00000-of-00001.jsonl; docs/DATA.md). A split that is not there: an error naming the splits found."),
      field(&C::data, &DataSection::val_split, "data.val_split",
            "The split of a data directory with splits to validate on: empty: validation, else test (of data.path when data.val_path and data.val_fraction are unset, said in one line; of data.val_path when it is such a directory); a split name; or none (no validation from splits)."),
      field(&C::data, &DataSection::val_fraction, "data.val_fraction", "Fraction of data.path's examples held out for validation (a fixed hash per example; 0: none). Exclusive with data.val_path.",
            {0.0, 1.0, true}),
  };
}

// The lora and comm sections of the schema.
std::vector<ConfigKey> lora_and_comm_keys() {
  using C = Config;
  return {
      // lora
      field(&C::lora, &lora::Options::rank, "lora.rank",
            "LoRA rank r: train low-rank adapters A [r, in], B [out, r] on a frozen base instead of every weight (PEFT's r). 0: off (full fine-tuning); then no other lora.* key may be set. At most the smallest dimension of the targets.",
            at_least(0)),
      field(&C::lora, &lora::Options::alpha, "lora.alpha", "LoRA alpha: the adapters' update is scaled by alpha / r (PEFT's lora_alpha). Must be > 0."),
      field(&C::lora, &lora::Options::dropout, "lora.dropout", "Dropout on the adapters' input in training (PEFT's lora_dropout); activation checkpointing recomputes it with the same random numbers.",
            {0.0, 1.0, true}),
      field(&C::lora, &lora::Options::targets, "lora.targets",
            "Hugging Face module names of the Linear layers that get adapters (PEFT's target_modules), e.g. [\"q_proj\", \"v_proj\"] or --set lora.targets=q_proj,v_proj; a name the model does not have is refused."),
      field(&C::lora, &lora::Options::base_dtype, "lora.base_dtype",
            "Storage of the frozen base, sharded like any parameter but without master, gradient or optimizer state: empty (the compute dtype, fsdp.mixed_precision), fp32, bf16, fp16 (cast to the compute dtype per unit when gathered), or nf4 (QLoRA).",
            {}, {"", "fp32", "bf16", "fp16", "nf4"}),
      field(&C::lora, &lora::Options::double_quant, "lora.double_quant", "QLoRA's double quantization of the NF4 scales; needs lora.base_dtype nf4."),
      // comm
      field(&C::comm, &CommSection::timeout_s, "comm.timeout_s", "Seconds any wait on a collective may take (every backend; checkpoint save/load and error agreement included). The rank that times out writes its flight record to `<log.dir>/flight`, names the collective and the ranks that did not reach it, and ends every rank (exit code 3).",
            {0.001, 1e7, false}),
      choice(&C::comm, &CommSection::device_backend, "comm.device_backend", comm::device_backend_names(),
             "How the collectives of GPU tensors run: nccl (one GPU per rank: NCCL refuses two ranks on one GPU) or staged (through host memory over MPI, runtime/comm/staged.h: local rank r uses GPU r modulo the GPUs visible, so several ranks share a GPU; every collective synchronises the host, so for testing the multi-rank device path on few GPUs rather than for speed). Refused for a run on the CPU."),
      field(&C::comm_emulation, &comm::Emulation::ranks, "comm.emulate_ranks",
            "Communication-time emulation for a run of one rank on one GPU: each collective also takes the time this many ranks would take at comm.emulate_gbps (a delay on the NCCL stream holding the SMs NCCL's channels would), so that one GPU measures how much of the all-gathers prefetch hides and how much reduce-scatter is exposed. 0: off. Needs train.device=cuda, one rank and comm.device_backend=nccl.",
            at_least(0)),
      field(&C::comm_emulation, &comm::Emulation::gbps, "comm.emulate_gbps",
            "The emulated link's bus bandwidth in GB/s (nccl-tests' busbw): ~370 for H100/H200 NVLink, ~48 per NDR InfiniBand NIC. Must be above 0."),
  };
}

}  // namespace

const std::vector<ConfigKey>& config_schema() {
  using C = Config;
  using util::FloatType;
  static const std::vector<ConfigKey> schema = [] {
    std::vector<ConfigKey> keys = model_and_data_keys();
    std::vector<ConfigKey> rest = {
      // train
      field(&C::train, &train::LoopOptions::steps, "train.steps", "Optimizer steps.", at_least(1)),
      field(&C::train, &train::LoopOptions::micro_batch, "train.micro_batch", "Sequences per rank per micro-step.", at_least(1)),
      field(&C::train, &train::LoopOptions::grad_accum, "train.grad_accum", "Micro-steps per optimizer step (gradients are reduced once per step).", at_least(1)),
      field(&C::schedule, &optim::LrSchedule::lr, "train.lr", "Peak learning rate.", at_least(0)),
      field(&C::schedule, &optim::LrSchedule::min_lr, "train.min_lr", "Learning rate at the end of the cosine decay.", at_least(0)),
      field(&C::schedule, &optim::LrSchedule::warmup_steps, "train.warmup_steps", "Linear warmup steps.", at_least(0)),
      choice(&C::schedule, &optim::LrSchedule::kind, "train.schedule", optim::schedule_names(),
             "Learning-rate schedule after warmup, down to train.min_lr at train.steps (constant: train.lr throughout)."),
      field(&C::optim, &optim::Options::weight_decay, "train.weight_decay", "AdamW decoupled weight decay (not applied to norm weights).", at_least(0)),
      field(&C::optim, &optim::Options::beta1, "train.beta1", "AdamW beta1.", {0.0, 1.0, true}),
      field(&C::optim, &optim::Options::beta2, "train.beta2", "AdamW beta2.", {0.0, 1.0, true}),
      field(&C::optim, &optim::Options::eps, "train.eps", "AdamW epsilon.", at_least(0)),
      field(&C::optim, &optim::Options::clip, "train.clip", "Global gradient-norm clipping threshold (0 disables).", at_least(0)),
      field(&C::train, &train::LoopOptions::max_skipped_steps, "train.max_skipped_steps",
            "A step whose loss or gradient norm is not finite is skipped on every rank (weights and optimizer state untouched; with fp16 the loss scale halves); this many skipped in a row stop the run with exit code 2, the last checkpoint kept (0: never stop).",
            at_least(0)),
      field(&C::train, &train::LoopOptions::seed, "train.seed", "Seed of data shuffling."),
      field(&C::train, &train::LoopOptions::device, "train.device",
            "Where shards, optimizer state and compute live: `auto` (cuda when this build has CUDA and a GPU is visible, else cpu), `cpu` (MPI collectives), `cuda` (local rank r uses GPU r; NCCL collectives), `cuda:N` (local rank r uses GPU N+r)."),
      choice(&C::train, &train::LoopOptions::preempt_signal, "train.preempt_signal", train::preempt_signal_names(),
             "Signal that makes the loop finish the step, checkpoint and exit for requeue (SIGTERM always does)."),
      // fsdp
      choice(&C::fsdp, &FsdpSection::strategy, "fsdp.strategy", fsdp::strategy_names(),
             "full_shard (ZeRO-3), shard_grad_op (ZeRO-2), no_shard (DDP), hybrid_shard (full_shard in a node, replicate across nodes)."),
      choice(&C::fsdp, &FsdpSection::mixed_precision, "fsdp.mixed_precision", util::float_type_names(),
             "Dtype of gathered parameters and compute; master shards and optimizer state are fp32. fp16 needs a GPU (refused on CPU: LibTorch has no fp16 matmul there)."),
      choice(&C::fsdp, &FsdpSection::reduce_dtype, "fsdp.reduce_dtype", util::float_type_names(),
             "Dtype of gradient reduction. fp16 here or in mixed_precision turns on dynamic loss scaling (as torch.cuda.amp.GradScaler: scale 65536, halved on a non-finite step, doubled after 2000 finite ones; checkpointed)."),
      choice(&C::fsdp, &FsdpSection::activation_checkpointing, "fsdp.activation_checkpointing", recompute_names(), "Recompute each decoder layer in backward: auto (on for hidden_size >= 4096: the 7B and larger presets), true, false."),
      field(&C::fsdp, &FsdpSection::prefetch, "fsdp.prefetch", "Issue the next unit's all-gather before the current unit's compute (forward and backward)."),
      field(&C::fsdp, &FsdpSection::limit_all_gathers, "fsdp.limit_all_gathers", "Most decoder-layer units gathered at once.",
            at_least(1)),
      choice(&C::fsdp, &FsdpSection::accumulate, "fsdp.accumulate", fsdp::accumulate_names(),
             "Gradient accumulation over train.grad_accum micro-steps: sharded (every micro-step reduce-scatters into the fp32 gradient shard; nothing model-sized is kept between micro-steps) or unsharded (micro-steps before the last accumulate a full-size fp32 gradient per unit locally, like no_sync(); one reduction per step: less traffic, 4 bytes per parameter more memory). no_shard adds into its (full) gradient either way."),
      choice(&C::fsdp, &FsdpSection::offload, "fsdp.offload", fsdp::offload_names(),
             "Host offload of the shard state (DeepSpeed ZeRO-Offload, FSDP CPUOffload): none; optimizer (fp32 master, gradient shard and AdamW moments in pinned host memory, AdamW on the host's cores; the device keeps the compute-dtype parameter shard; each reduced gradient chunk is copied down, the updated parameter shard up once per step); params (also the compute-dtype parameter shard on the host, copied up before every all-gather, forward and backward). Combines with every strategy, dtype, optim.in_backward and optim.state_dtype; `tessera plan` prints the GPU and host bytes and the PCIe bytes per step, and a run whose host memory does not fit the node is refused before loading (docs/MEMORY.md#host-offload-fsdpoffload)."),
      // optim
      choice(&C::optim, &optim::Options::state_dtype, "optim.state_dtype", optim::state_dtype_names(),
             "Dtype of AdamW's two moments: fp32 (16 bytes per parameter with the fp32 master and gradient), bf16 (12 bytes; each update is computed in fp32 and rounded once) or int8 (10.004 bytes: 8-bit block-wise quantization as Dettmers et al. 2021, bitsandbytes' dynamic map, an fp32 absmax per block of 2048 elements; updates computed in fp32; FSDP shards aligned to whole blocks, so checkpoints reshard without re-quantizing; its checkpoints are format version 2). Resume with the value the checkpoint was saved with."),
      field(&C::optim, &optim::Options::in_backward, "optim.in_backward",
            "Run each unit's AdamW update in backward as soon as its gradient shard is reduced, and free that shard (torchtune's optimizer_in_bwd): gradient memory of a few units instead of 4 bytes per parameter. Needs train.clip 0 and no fp16; a non-finite gradient stops the run instead of skipping the step (docs/FSDP.md)."),
      // checkpoint
      field(&C::checkpoint, &checkpoint::Policy::dir, "checkpoint.dir", "Directory of sharded checkpoints (step-<N>/). Empty: no checkpoints."),
      field(&C::checkpoint, &checkpoint::Policy::every, "checkpoint.every", "Save every N steps (0: only at the end and on preemption).", at_least(0)),
      field(&C::checkpoint, &checkpoint::Policy::keep, "checkpoint.keep", "Complete checkpoints to retain.", at_least(1)),
      field(&C::checkpoint, &checkpoint::Policy::keep_best, "checkpoint.keep_best",
            "Also keep the checkpoint with the lowest validation loss (saved whenever validation improves); needs validation data and checkpoint.dir."),
      field(&C::checkpoint, &checkpoint::Policy::async, "checkpoint.async", "true: snapshot master and moments to host memory and write on a background thread while training goes on. false: the save blocks the step and writes the shards as they are (a GPU's streamed down through one 4 MiB host buffer: no host snapshot)."),
      field(&C::checkpoint, &checkpoint::Policy::resume, "checkpoint.resume",
            "auto: resume from the latest complete checkpoint in checkpoint.dir if any; never; or a checkpoint directory."),
      // eval
      field(&C::eval, &train::EvalOptions::every, "eval.every", "Validation loss every N steps (0: only at the end of the run); needs data.val_path or data.val_fraction.", at_least(0)),
      // log
      field(&C::log, &train::LogOptions::dir, "log.dir", "Directory for metrics.jsonl (one record per step), run_info.json (config and topology) and report.html (`tessera report`). Empty: checkpoint.dir, else none."),
      field(&C::log, &train::LogOptions::every, "log.every", "Progress line every N steps.", at_least(1)),
      field(&C::log, &train::LogOptions::tensorboard, "log.tensorboard",
            "Also write the scalars of metrics.jsonl (loss, val_loss, lr, grad_norm, tokens_per_s, mfu, peak_rss_bytes, peak_gpu_mem_bytes) to log.dir/events.out.tfevents.<time>.<host> for TensorBoard (rank 0). Needs log.dir (or checkpoint.dir)."),
      field(&C::train, &train::LoopOptions::peak_flops, "train.peak_flops",
            "Peak FLOP/s of one rank in the compute dtype, the denominator of MFU (`tessera train --peak-flops`). 0: the hardware's, from a table of vendor datasheet peaks by GPU name, or on a CPU cores x FLOP per cycle (AVX-512/AVX2 FMA, AMX/AVX-512 bf16) x the highest clock read from the machine (docs/PERFORMANCE.md#mfu).",
            at_least(0)),
      field(&C::train, &train::LoopOptions::profile_steps, "train.profile_steps",
            "Steps [first, last] (1-based, inclusive) to trace: every rank writes log.dir/trace-rank-<r>.json, a Chrome trace (chrome://tracing, ui.perfetto.dev) with one track per thread (compute, each communicator's thread), and log.dir/kernels-rank-<r>.json, LibTorch's Kineto trace of the same steps (its operators; on a GPU every kernel, grouped by benchmarks/kernel_table.py: docs/PERFORMANCE.md#a-kernel-profile; a LibTorch built without Kineto writes none and says so in a warning). Needs log.dir (or checkpoint.dir). []: no trace. The step-time breakdown in metrics.jsonl is always on."),
      field(&C::sample, &train::SampleOptions::every, "train.sample_every",
            "Generate answers to the prompts of train.sample_prompts after every N-th step and after the last, and append them to log.dir/samples.jsonl with the step (`tessera report` shows them per step; the pause is printed and counted as sample_s in metrics.jsonl). 0: never.",
            at_least(0)),
      field(&C::sample, &train::SampleOptions::prompts, "train.sample_prompts",
            "A JSONL file of prompts for train.sample_every, as `tessera generate --prompts` reads: {\"messages\": [...]} rendered with the chat template training renders its data with (plus the generation prompt), or {\"prompt\": \"...\"}."),
      field(&C::sample, &train::SampleOptions::max_new_tokens, "train.sample_max_new_tokens",
            "Tokens generated at most per sample prompt (generation also stops at the model's end-of-sequence ids).", at_least(1)),
      field(&C::sample, &train::SampleOptions::temperature, "train.sample_temperature",
            "0: greedy samples (the default); > 0: sampled at this temperature with the seed train.seed + the step, as `tessera generate --temperature T --seed <train.seed + step>` samples the prompts from that step's checkpoint.", at_least(0)),
    };
    keys.insert(keys.end(), rest.begin(), rest.end());
    const std::vector<ConfigKey> last = lora_and_comm_keys();
    keys.insert(keys.end(), last.begin(), last.end());
    return keys;
  }();
  return schema;
}

namespace {

const ConfigKey* find_key(const std::string& key) {
  for (const auto& k : config_schema())
    if (k.key == key) return &k;
  return nullptr;
}

std::vector<std::string> all_keys() {
  std::vector<std::string> keys;
  for (const auto& k : config_schema()) keys.push_back(k.key);
  return keys;
}

// Key names of Hugging Face TrainingArguments, Accelerate and torchtune recipes (the last part of
// the key, any section) and Tessera's key for the same thing, with what differs.
std::string foreign_key_hint(const std::string& key) {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"learning_rate", "train.lr"},
      {"lr", "train.lr"},
      {"per_device_train_batch_size", "train.micro_batch (sequences per rank per micro-step)"},
      {"batch_size", "train.micro_batch (sequences per rank per micro-step)"},
      {"gradient_accumulation_steps", "train.grad_accum"},
      {"max_steps", "train.steps"},
      {"num_train_epochs", "train.steps (Tessera counts optimizer steps: epochs x sequences / global batch)"},
      {"epochs", "train.steps (Tessera counts optimizer steps: epochs x sequences / global batch)"},
      {"warmup_ratio", "train.warmup_steps (a step count: warmup_ratio x train.steps)"},
      {"num_warmup_steps", "train.warmup_steps"},
      {"max_grad_norm", "train.clip"},
      {"clip_grad_norm", "train.clip"},
      {"dataset", "data.path"},
      {"dataset_name", "data.path (a local file or directory: Tessera downloads nothing)"},
      {"train_file", "data.path"},
      {"validation_file", "data.val_path"},
      {"max_seq_length", "data.seq_len"},
      {"max_seq_len", "data.seq_len"},
      {"output_dir", "checkpoint.dir (and log.dir)"},
      {"save_steps", "checkpoint.every"},
      {"logging_steps", "log.every"},
      {"eval_steps", "eval.every"},
      {"lr_scheduler_type", "train.schedule"},
      {"model_name_or_path", "model.path (a local Hugging Face directory)"},
      {"seed", "train.seed"},
      {"data_seed", "train.seed"},
      {"bf16", "fsdp.mixed_precision=bf16"},
      {"fp16", "fsdp.mixed_precision=fp16"},
      {"bf16_full_eval", "tessera eval --dtype bf16"},
      {"warmup_steps", "train.warmup_steps"},
      {"weight_decay", "train.weight_decay"},
      {"adam_beta1", "train.beta1"},
      {"adam_beta2", "train.beta2"},
      {"adam_epsilon", "train.eps"},
      {"gradient_checkpointing", "fsdp.activation_checkpointing"},
      {"activation_checkpointing", "fsdp.activation_checkpointing"},
      {"logging_dir", "log.dir"},
      {"report_to", "log.tensorboard (true: TensorBoard event files in log.dir)"},
      {"save_total_limit", "checkpoint.keep"},
      {"resume_from_checkpoint", "tessera train --resume [DIR]"},
      {"per_device_eval_batch_size", "train.micro_batch (validation uses the training micro-batch)"},
  };
  const std::string last = key.substr(key.rfind('.') + 1);
  for (const auto& [name, ours] : table)
    if (name == last && ours.rfind(key, 0) != 0) return ours;
  return "";
}

// "'key' (Tessera's key for it: train.lr)", "'key' (did you mean 'train.steps'?)", "'key'".
std::string unknown_key_text(const std::string& key) {
  const std::string foreign = foreign_key_hint(key);
  if (!foreign.empty()) return "'" + key + "' (Tessera's key for it: " + foreign + ")";
  const std::string hint = closest_match(key, all_keys());
  return "'" + key + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)");
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& source) {
  throw TESSERA_INPUT_ERROR(source + ": unknown config key " + unknown_key_text(key));
}

// Every unknown key of a file in one line (a Hugging Face TrainingArguments file has many: one
// error per run would make a user fix them one by one).
void unknown_keys(const std::vector<std::string>& keys, const std::string& source) {
  if (keys.empty()) return;
  if (keys.size() == 1) unknown_key(keys.front(), source);
  std::string list;
  for (const auto& k : keys) list += (list.empty() ? "" : ", ") + unknown_key_text(k);
  throw TESSERA_INPUT_ERROR(source + ": " + std::to_string(keys.size()) + " unknown config keys: " + list);
}

std::string type_name(const json& v) {
  if (v.is_boolean()) return "bool";
  if (v.is_number_integer()) return "int";
  if (v.is_number()) return "float";
  if (v.is_string()) return "string";
  if (v.is_null()) return "null";
  return v.is_array() ? "array" : "object";
}

// A bound as people write it: 1, 0.001, 10000000.
std::string number_text(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  std::ostringstream os;
  os << x;
  return os.str();
}

// "Bounds: >= 0, < 1." for the reference; empty without bounds.
std::string bounds_text(const ConfigKey& k) {
  std::string parts;
  if (k.min) parts += ">= " + number_text(*k.min);
  if (k.max) parts += (parts.empty() ? "" : ", ") + std::string(k.max_open ? "< " : "<= ") + number_text(*k.max);
  return parts.empty() ? "" : " Bounds: " + parts + ".";
}

// Checks one value against its schema entry; returns it normalised (int accepted for float).
json check_value(const ConfigKey& k, const json& v, const std::string& source) {
  bool ok = (k.type == "int" && v.is_number_integer()) || (k.type == "float" && v.is_number()) ||
            (k.type == "bool" && v.is_boolean()) || (k.type == "string" && v.is_string()) ||
            (k.type == "int list" && v.is_array() &&
             std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number_integer(); })) ||
            (k.type == "string list" && v.is_array() &&
             std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); }));
  if (!ok)
    throw TESSERA_INPUT_ERROR(source + ": config key '" + k.key + "' must be " + k.type + ", got " +
                              type_name(v) + " " + v.dump());
  if (!k.choices.empty()) {
    std::string s = v.get<std::string>();
    if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end()) {
      std::string list;
      for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
      std::string hint = closest_match(s, k.choices);
      throw TESSERA_INPUT_ERROR(source + ": config key '" + k.key + "' is '" + s + "', expected one of " + list +
                                (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
  }
  if (k.min || k.max) {
    const double x = v.get<double>();
    const auto fail = [&](const char* relation, double bound) {
      throw TESSERA_INPUT_ERROR(source + ": config key '" + k.key + "' must be " + relation + " " + number_text(bound) +
                                ", got " + v.dump());
    };
    if (k.min && !(x >= *k.min)) fail(">=", *k.min);
    if (k.max && k.max_open && !(x < *k.max)) fail("<", *k.max);
    if (k.max && !k.max_open && !(x <= *k.max)) fail("<=", *k.max);
  }
  if (k.type == "float") return v.get<double>();
  return v;
}

// The keys of `j` and their values, into `out`; keys that are neither a key nor a section, into
// `unknown`.
void flatten(const json& j, const std::string& prefix, std::vector<std::pair<std::string, json>>& out,
             std::vector<std::string>& unknown, const std::string& source) {
  if (!j.is_object())
    throw TESSERA_INPUT_ERROR(source + ": '" + (prefix.empty() ? std::string("top level") : prefix) +
                              "' must be a JSON object, got " + type_name(j));
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object() && !find_key(key)) {
      bool is_section = false;
      for (const auto& k : config_schema()) is_section |= k.key.rfind(key + ".", 0) == 0;
      if (is_section) flatten(*it, key, out, unknown, source);
      else unknown.push_back(key);
    } else {
      out.emplace_back(key, *it);
    }
  }
}

json& slot(json& root, const std::string& key) {
  json* cur = &root;
  size_t start = 0;
  for (;;) {
    size_t dot = key.find('.', start);
    std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    cur = &(*cur)[part];
    if (dot == std::string::npos) return *cur;
    start = dot + 1;
  }
}

}  // namespace

json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return util::parse_json(text);
  } catch (const json::parse_error& e) {
    size_t line = 1, col = 1, byte = std::min<size_t>(e.byte, text.size());
    for (size_t i = 0; i + 1 < byte; ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    std::string reason = e.what();
    auto p = reason.find("parse error");
    if (p != std::string::npos) reason = reason.substr(p);
    throw TESSERA_INPUT_ERROR(source + ":" + std::to_string(line) + ":" + std::to_string(col) +
                              ": invalid JSON: " + reason);
  } catch (const json::exception& e) {  // e.g. out_of_range 406 for 1e400 (found by fuzzing)
    throw TESSERA_INPUT_ERROR(source + ": invalid JSON: " + e.what());
  }
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw TESSERA_INPUT_ERROR(path + ": cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), path);
}

// Keys that are each valid but cannot work together: one line naming them (at config check), from
// the owner's check (optim::validate; the rest of train::validate needs the command line's
// directories and runs in train and plan).
static void check_combinations(const Config& c, const std::string& source) {
  optim::validate(c.optim, loss_scaling(c), source);
  comm::validate(c.comm_emulation, c.comm.device_backend, source);
  lora::validate(c.lora, nullptr, source);
}

bool loss_scaling(const Config& c) {
  return c.fsdp.mixed_precision == util::FloatType::F16 || c.fsdp.reduce_dtype == util::FloatType::F16;
}

Config Config::from_json(const nlohmann::json& j, const std::string& source, const std::vector<std::string>& overrides) {
  Config c;
  std::vector<std::pair<std::string, nlohmann::json>> flat;
  std::vector<std::string> unknown;
  flatten(j, "", flat, unknown, source);
  for (const auto& [key, value] : flat)
    if (!find_key(key)) unknown.push_back(key);
  unknown_keys(unknown, source);
  for (const auto& [key, value] : flat) {
    const ConfigKey* k = find_key(key);
    k->store(c, check_value(*k, value, source));
  }
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw TESSERA_INPUT_ERROR("--set '" + o + "': expected key=value (e.g. --set train.lr=1e-4)");
    std::string key = o.substr(0, eq), text = o.substr(eq + 1);
    const ConfigKey* k = find_key(key);
    if (!k) unknown_key(key, "--set");
    nlohmann::json v;
    if (k->type == "string") {
      v = text;
    } else if (k->type == "string list" && (text.empty() || text[0] != '[')) {
      v = json::array();  // q_proj,v_proj
      for (size_t start = 0; start <= text.size();) {
        const size_t comma = std::min(text.find(',', start), text.size());
        if (comma > start) v.push_back(text.substr(start, comma - start));
        start = comma + 1;
      }
    } else {
      try {
        v = util::parse_json(text);
      } catch (const nlohmann::json::exception&) {  // not JSON, or a number out of range (1e400)
        v = text;
      }
    }
    // A JSON file cannot hold invalid UTF-8, but a shell argument can: every later dump() of the
    // config (error messages, the checkpoint manifest) would throw json type_error 316 (found by fuzzing).
    try {
      (void)v.dump();
    } catch (const nlohmann::json::type_error&) {
      throw TESSERA_INPUT_ERROR("--set " + key + ": the value is not valid UTF-8");
    }
    k->store(c, check_value(*k, v, "--set"));
  }
  check_combinations(c, source);
  return c;
}

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  return from_json(path.empty() ? nlohmann::json::object() : read_config_file(path), path.empty() ? "config" : path,
                   overrides);
}

void Config::set(const std::string& key, const nlohmann::json& v) {
  const ConfigKey* k = find_key(key);
  if (!k) unknown_key(key, "config");
  k->store(*this, check_value(*k, v, "config"));
}

nlohmann::json Config::json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : config_schema()) slot(j, k.key) = k.value(*this);
  return j;
}

std::string Config::reference_markdown() {
  std::ostringstream os;
  os << "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& k : config_schema()) {
    std::string help = k.help;
    if (!k.choices.empty()) {
      std::string list;
      for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + ("`" + c + "`");
      help += " One of " + list + ".";
    }
    help += bounds_text(k);
    os << "| `" << k.key << "` | " << k.type << " | `" << k.default_value.dump() << "` | " << help << " |\n";
  }
  return os.str();
}

}  // namespace tessera::launcher
