// te-generate: text generation with a Hugging Face decoder (a folder with config.json,
// model.safetensors and tokenizer.json) or a GGUF file, in te::nn with a KV cache. Streams the
// text to stdout as it is produced, then prints prefill and decode tokens/s to stderr.
//
//   te-generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat --prompt "What is 2+2?"
//   te-generate --model DIR --prompt "Once upon a time" --max-tokens 64 --temperature 0
//   te-generate --model DIR --prompt "..." --nproc 2   # tensor parallel over two thread ranks
//   te-generate --model DIR --prompt "..." --json      # one JSON object: text, tokens, figures

#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "te/distributed.h"
#include "te/error.h"
#include "te/gen/chat_template.h"
#include "te/gen/generate.h"
#include "te/hf/causal_lm.h"
#include "te/hf/chat.h"
#include "te/hf/families.h"
#include "te/hf/ranks.h"
#include "te/hf/tokenizer.h"
#include "te/nn/inference.h"
#include "te/runtime/runtime.h"

namespace {

struct Args {
  std::string model, prompt, system, mesh, mesh_resource, rules, chat_template;
  std::vector<std::string> stop;
  bool chat = false, json = false, contiguous = false, ignore_eos = false, print_prompt = false;
  bool dequantize_gguf = false;
  int nproc = 1, threads = 0;
  int64_t page_size = 16, kv_cache_mib = 0, max_sequence_length = 0;
  te::gen::GenerateOptions generate;
  /// The sampling options the command line gave (the others are the model's defaults).
  std::vector<std::string> sampling_given;
};

struct Result {
  std::string text, finish_reason;
  std::vector<int64_t> tokens, prompt_ids;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), "te-generate: cannot read '", path, "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The prompt as the model reads it: the text, or with --chat the template applied to the
// (system and) user message.
std::string prompt_text(const Args& a, const te::hf::GenerationDefaults& defaults) {
  if (!a.chat) return a.prompt;
  const std::string jinja =
      a.chat_template.empty() ? defaults.chat_template : read_file(a.chat_template);
  TE_CHECK(!jinja.empty(), "te-generate: --chat: ", a.model,
           " has no chat template (give one with --chat-template FILE)");
  std::vector<te::gen::ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  messages.push_back({"user", a.prompt});
  return te::gen::ChatTemplate::recognise(jinja,
                                          a.chat_template.empty() ? a.model : a.chat_template)
      .apply(messages);
}

// The sampling of this run: the model's defaults (describe_sampling), then the command line's.
te::gen::SamplingOptions sampling_of(const Args& a, const te::hf::GenerationDefaults& defaults) {
  te::gen::SamplingOptions s = defaults.sampling;
  const te::gen::SamplingOptions& given = a.generate.sampling;
  for (const std::string& name : a.sampling_given) {
    if (name == "temperature") s.temperature = given.temperature;
    if (name == "top-k") s.top_k = given.top_k;
    if (name == "top-p") s.top_p = given.top_p;
    if (name == "min-p") s.min_p = given.min_p;
    if (name == "repetition-penalty") s.repetition_penalty = given.repetition_penalty;
    if (name == "presence-penalty") s.presence_penalty = given.presence_penalty;
    if (name == "frequency-penalty") s.frequency_penalty = given.frequency_penalty;
  }
  s.seed = given.seed;
  return s;
}

// One rank's run (all ranks run the same steps; `print` streams the text as it comes).
Result run(const Args& a, bool print) {
  using clock = std::chrono::steady_clock;
  te::hf::LoadOptions load;
  load.dequantize_gguf = a.dequantize_gguf;
  te::hf::CausalLM model = te::hf::load_causal_lm(a.model, load);
  const te::hf::Tokenizer tokenizer = std::filesystem::is_directory(a.model)
                                          ? te::hf::Tokenizer::from_pretrained(a.model)
                                          : te::hf::Tokenizer::from_file(a.model);
  const te::hf::GenerationDefaults defaults = te::hf::read_generation_defaults(a.model);
  const std::string prompt = prompt_text(a, defaults);
  te::hf::EncodeOptions encode;
  encode.add_special_tokens = !a.chat;  // the template writes its own
  const std::vector<int64_t> ids = tokenizer.encode(prompt, encode).ids;
  te::gen::GenerateOptions options = a.generate;
  options.sampling = sampling_of(a, defaults);
  options.stop = a.stop;  // the engine ends the text before one
  if (print) {
    std::string given;
    for (const std::string& name : a.sampling_given) given += " --" + name;
    std::fprintf(stderr, "[te-generate] sampling: %s%s\n",
                 te::hf::describe_sampling(defaults).c_str(),
                 given.empty() ? "" : ("; the command line sets" + given).c_str());
  }
  if (!a.ignore_eos) {
    options.stop_token_ids.insert(options.stop_token_ids.end(), defaults.eos_token_ids.begin(),
                                  defaults.eos_token_ids.end());
  }
  te::gen::EngineOptions engine_options;
  engine_options.tokenizer = std::make_shared<const te::hf::Tokenizer>(tokenizer);
  engine_options.max_num_seqs = 1;
  engine_options.max_num_batched_tokens = 2048;
  engine_options.paged = !a.contiguous;
  engine_options.page_size = a.page_size;
  engine_options.kv_cache_bytes = a.kv_cache_mib << 20;
  // By default the cache holds this request: its prompt and max_tokens (within the model's).
  const int64_t positions = model->config.max_position_embeddings;
  engine_options.max_sequence_length =
      a.max_sequence_length
          ? a.max_sequence_length
          : std::min<int64_t>(static_cast<int64_t>(ids.size()) + options.max_tokens,
                              positions > 0 ? positions : INT64_MAX);
  te::gen::Engine engine(model, engine_options);
  engine.add(ids, options);
  Result r;
  r.prompt_tokens = static_cast<int64_t>(ids.size());
  r.prompt_ids = ids;
  const auto start = clock::now();
  auto first = start;
  while (!engine.idle()) {
    for (const te::gen::TokenEvent& e : engine.step()) {
      if (r.tokens.empty()) first = clock::now();
      r.tokens.push_back(e.token);
      r.finish_reason = e.finish_reason;
      r.text += e.text;  // final text: no stop token's, no stop string
      if (print && !e.text.empty()) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
        std::fflush(stdout);
      }
    }
  }
  const auto end = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(first - start).count();
  r.decode_seconds = std::chrono::duration<double>(end - first).count();
  return r;
}

// The model, the prompt and how it is read.
void add_prompt_options(CLI::App& app, Args& a) {
  app.add_option("--model", a.model,
                 "the model: a folder (config.json, model.safetensors, tokenizer.json) or a .gguf "
                 "file")
      ->required();
  app.add_option("--prompt", a.prompt, "the text to continue (with --chat: the user's message)")
      ->required();
  app.add_flag("--chat", a.chat,
               "apply the model's chat template (ChatML, Llama 3, Phi-3 or Gemma families) to the "
               "prompt as a user message, and answer as the assistant");
  app.add_option("--system", a.system, "with --chat: a system message first");
  app.add_option("--chat-template", a.chat_template,
                 "with --chat: this file's template (Jinja text) instead of the model's");
  app.add_flag("--print-prompt", a.print_prompt,
               "print the prompt as the model would read it (after --chat's template) and exit");
  app.add_flag("--ignore-eos", a.ignore_eos,
               "go on past the model's end-of-sequence tokens (up to --max-tokens)");
  a.generate.max_tokens = 128;
  app.add_option("--max-tokens", a.generate.max_tokens, "tokens to generate at most (default 128)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
}

void add_sampling_options(CLI::App& app, Args& a) {
  te::gen::SamplingOptions& s = a.generate.sampling;
  // Sampling: each option left out takes the model's default (generation_config.json or the
  // GGUF's general.sampling.* keys), else llama.cpp's; the run prints which.
  app.add_option("--temperature", s.temperature,
                 "0: greedy (default: the model's, else 0.8 as llama.cpp's)")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-k", s.top_k, "keep the k most likely tokens, 0: all (default: 40)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", s.top_p,
                 "nucleus sampling: keep the most likely tokens up to this mass (default: 0.95)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--min-p", s.min_p,
                 "drop tokens less likely than this x the most likely (default: 0.05)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--repetition-penalty", s.repetition_penalty,
                 "divide the logits of tokens already seen, 1: off (default: 1)");
  app.add_option("--presence-penalty", s.presence_penalty,
                 "OpenAI's: lower each generated token's logit by this once, in [-2, 2] "
                 "(default 0)")
      ->check(CLI::Range(-2.0, 2.0));
  app.add_option("--frequency-penalty", s.frequency_penalty,
                 "OpenAI's: lower each generated token's logit by this per occurrence, in [-2, 2] "
                 "(default 0)")
      ->check(CLI::Range(-2.0, 2.0));
  app.add_option("--seed", s.seed, "the random stream of the sampling (same seed, same text)");
  app.add_option("--stop", a.stop, "end the text before this string (repeatable)");
}

// The ranks, the KV cache and the output.
void add_engine_options(CLI::App& app, Args& a) {
  app.add_option("--nproc", a.nproc,
                 "thread ranks: the model sharded over them (tensor parallel unless --mesh says "
                 "otherwise), every rank holding its share of the KV cache")
      ->check(CLI::Range(1, 64));
  app.add_option("--mesh", a.mesh,
                 "the mesh of the --nproc ranks (default model=N); a data axis (data=2,model=2) "
                 "gives each data-parallel group its own requests (one prompt: one group works)");
  app.add_option(
      "--mesh-resource", a.mesh_resource,
      "TE's MeshResource for the mesh axes (default tp=model, and dp=data when the mesh "
      "has a data axis); tp=model,ep=model splits a mixture of experts' experts over the "
      "model axis (expert parallel) and its heads too");
  app.add_option("--rules", a.rules,
                 "logical axis rules over TE's (default vocab=model: the vocabulary sharded "
                 "with the heads)");
  app.add_flag("--contiguous", a.contiguous,
               "a contiguous KV cache (a slot of max-sequence-length tokens) instead of pages");
  app.add_flag("--dequantize-gguf", a.dequantize_gguf,
               "a GGUF file's quantized weights as float32 (5x their memory); by default one "
               "process keeps them in their blocks and decodes them in each GEMM (--nproc > 1 "
               "always dequantizes)");
  app.add_option("--page-size", a.page_size, "tokens per KV cache page")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app.add_option("--kv-cache-mib", a.kv_cache_mib, "KV cache memory (0: what the sequence needs)")
      ->check(CLI::NonNegativeNumber);
  app.add_option(
         "--max-sequence-length", a.max_sequence_length,
         "prompt and generated tokens at most (0: the prompt's and --max-tokens, within the "
         "model's positions)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", a.threads, "intra-op threads (0: LibTorch's default)")
      ->check(CLI::Range(0, 1024));
  app.add_flag("--json", a.json,
               "print one JSON object (text, tokens, finish_reason, prompt_tokens, tokens/s) "
               "instead of streaming");
}

// The result: the JSON object (--json), or the newline after the streamed text and the speeds.
void report(const Args& a, const Result& r) {
  const int64_t decoded = static_cast<int64_t>(r.tokens.size()) - 1;
  const double prefill_tps = r.prompt_tokens / std::max(r.prefill_seconds, 1e-9);
  const double decode_tps = decoded > 0 ? decoded / std::max(r.decode_seconds, 1e-9) : 0.0;
  if (a.json) {
    const nlohmann::json out = {{"text", r.text},
                                {"tokens", r.tokens},
                                {"prompt_ids", r.prompt_ids},
                                {"finish_reason", r.finish_reason},
                                {"prompt_tokens", r.prompt_tokens},
                                {"completion_tokens", r.tokens.size()},
                                {"prefill_tokens_per_second", prefill_tps},
                                {"decode_tokens_per_second", decode_tps}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr,
                 "[te-generate] prefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld "
                 "tokens in %.3f s (%.1f tokens/s); finish_reason: %s\n",
                 static_cast<long long>(r.prompt_tokens), r.prefill_seconds, prefill_tps,
                 static_cast<long long>(decoded), r.decode_seconds, decode_tps,
                 r.finish_reason.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  te::keep_freed_memory();  // steps reuse freed memory (te/runtime/runtime.h)
  CLI::App app{"te-generate: text generation with a Hugging Face decoder (" +
               te::hf::causal_lm_family_titles() + "; a folder, or a GGUF file of " +
               te::hf::causal_lm_family_names(/*gguf=*/true) +
               ") in te::nn with a KV cache. Streams the text to stdout, then prints prefill and "
               "decode tokens/s to stderr."};
  app.footer(te::nn::cpu_gemm_summary());
  Args a;
  add_prompt_options(app, a);
  add_sampling_options(app, a);
  add_engine_options(app, a);
  CLI11_PARSE(app, argc, argv);
  for (const char* name : {"temperature", "top-k", "top-p", "min-p", "repetition-penalty",
                           "presence-penalty", "frequency-penalty"}) {
    if (app.count(std::string("--") + name) > 0) a.sampling_given.push_back(name);
  }
  try {
    if (a.threads > 0) at::set_num_threads(a.threads);
    if (a.print_prompt) {
      const std::string p = prompt_text(a, te::hf::read_generation_defaults(a.model));
      std::fwrite(p.data(), 1, p.size(), stdout);
      return 0;
    }
    TE_CHECK(a.nproc > 1 || (a.mesh.empty() && a.mesh_resource.empty() && a.rules.empty()),
             "te-generate: --mesh, --mesh-resource and --rules need --nproc > 1");
    Result r;
    if (a.nproc == 1) {
      r = run(a, !a.json);
    } else {
      std::mutex mutex;
      te::hf::run_on_ranks({a.nproc, a.mesh, a.mesh_resource, a.rules},
                           [&](int rank, const te::DeviceMesh&) {
                             Result mine = run(a, rank == 0 && !a.json);
                             std::lock_guard<std::mutex> lock(mutex);
                             if (rank == 0) r = mine;
                           });
    }
    report(a, r);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te-generate: %s\n", e.what());
    return 2;
  }
}
