#pragma once

// Umbrella header of te::nn: modules whose tensors are sharded by logical axis names.

#include "te/distributed.h"
#include "te/nn/attention.h"
#include "te/nn/checkpoint.h"
#include "te/nn/context_parallel.h"
#include "te/nn/dense.h"
#include "te/nn/embedding.h"
#include "te/nn/fp8_weights.h"
#include "te/nn/functional.h"
#include "te/nn/grouped_linear.h"
#include "te/nn/inference.h"
#include "te/nn/init.h"
#include "te/nn/mlp.h"
#include "te/nn/moe.h"
#include "te/nn/moe_layer.h"
#include "te/nn/plan.h"
#include "te/nn/random.h"
#include "te/nn/rope.h"
#include "te/nn/sharded.h"
#include "te/nn/transformer.h"
