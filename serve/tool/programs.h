#pragma once

// te-serve's two kinds of server: sentence models (a classifier or an embedding model, batched
// dynamically) and decoder models (the generation engine, on one process or a mesh of ranks).

#include <string>

#include "args.h"
#include "te/hf/sentence.h"
#include "te/serve/service.h"

namespace te_serve {

/// Serves `classifier` (POST /v1/classify) or `embedder` (POST /v1/embeddings, under
/// args.server.models' names) until SIGTERM has drained it; the exit code.
int serve_sentences(const Args& args, const te::serve::Classifier* classifier,
                    const te::hf::SentenceEmbedder* embedder);

/// Loads the decoder of --model (on --nproc ranks) and serves its completions under
/// args.server.models' names until SIGTERM; the exit code.
int serve_generation(const Args& args);

}  // namespace te_serve
