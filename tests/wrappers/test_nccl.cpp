// NCCL in one process: a 1-rank communicator on the first GPU (scripts/gpu-check runs this
// on its single GPU; the 2-rank program under mpirun runs the same cases on several).
#include "dist/nccl_cases.h"
