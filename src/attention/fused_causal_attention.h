// Causal linear attention with log-form random features: the operator's forms live in
// attention/ops (docs/attention.md draws the map). This header gathers what kernels and tests use.
#pragma once

#include "attention/ops/causal_function.h"
#include "attention/ops/dtype_probe.h"
#include "attention/ops/feature_map.h"
#include "attention/ops/recurrent_step.h"
