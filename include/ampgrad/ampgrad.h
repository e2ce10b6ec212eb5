// ampgrad: a tensor and autograd library with automatic mixed precision.
// This umbrella header is all a consumer includes: #include <ampgrad/ampgrad.h>.
// It lives above the library's parts (include/, not core/include/), because it includes
// all of them, and core includes nothing from the parts built on it.
#pragma once

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/checked.h"
#include "ampgrad/convert.h"
#include "ampgrad/device.h"
#include "ampgrad/dispatch.h"
#include "ampgrad/dtype.h"
#include "ampgrad/error.h"
#include "ampgrad/factories.h"
#include "ampgrad/half.h"
#include "ampgrad/host_device.h"
#include "ampgrad/hw/cpu.h"
#include "ampgrad/hw/profile.h"
#include "ampgrad/matmul_precision.h"
#include "ampgrad/memory.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/loss.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/ops/shape.h"
#include "ampgrad/scalar.h"
#include "ampgrad/stream.h"
#include "ampgrad/tensor.h"
#include "ampgrad/version.h"

// autocast/: mixed precision
#include "ampgrad/autocast/autocast.h"

// nn/: modules, optimizers, schedulers, data
#include "ampgrad/data/dataset.h"
#include "ampgrad/data/datasets.h"
#include "ampgrad/data/idx.h"
#include "ampgrad/nn/init.h"
#include "ampgrad/nn/layers.h"
#include "ampgrad/nn/models.h"
#include "ampgrad/nn/module.h"
#include "ampgrad/nn/serialize.h"
#include "ampgrad/optim/optimizer.h"
#include "ampgrad/optim/scheduler.h"

// autocast/: mixed precision (ag::GradScaler, ag::GradScalerOptions)
#include "ampgrad/optim/grad_scaler.h"

// wrappers/: Lite, its precision plugins, checkpoint folders
#include "ampgrad/dist/distributed.h"
#include "ampgrad/wrappers/checkpoints.h"
#include "ampgrad/wrappers/lite.h"
#include "ampgrad/wrappers/nested.h"
#include "ampgrad/wrappers/precision.h"
#include "ampgrad/wrappers/precision_record.h"

namespace ag = ampgrad;
