// The emulated cuBLASLt: the subset of NVIDIA's cublasLt.h that ampgrad calls
// (kernels/cuda/blas.cu, bench/cuda/bench_cuda.cpp), with NVIDIA's names, types and
// enumerator values, so that the same sources compile against it. The functions run plain
// reference loops on the host (src/cublaslt.cpp) and queue their work on the given stream;
// docs/cuda-emulator.md (its cuBLASLt and cuDNN section) says how each descriptor is read
// and what is refused.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "emu/stream.h"
#include "library_types.h"

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
} cublasOperation_t;

typedef enum {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73,
} cublasComputeType_t;

#if defined(__cplusplus)
extern "C" {
#endif

// ---- handle -------------------------------------------------------------------------------
typedef struct cublasLtContext* cublasLtHandle_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
/// The enumerator's name ("CUBLAS_STATUS_NOT_SUPPORTED"), and a sentence about it.
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);

// ---- semi-opaque descriptors (NVIDIA's sizes) ------------------------------------------------
typedef struct {
  uint64_t data[8];
} cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  uint64_t data[32];
} cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;

// ---- matrix layouts ----------------------------------------------------------------------
typedef enum {
  CUBLASLT_ORDER_COL = 0,  ///< column-major: ld is the stride between columns
  CUBLASLT_ORDER_ROW = 1,  ///< row-major: ld is the stride between rows
  CUBLASLT_ORDER_COL32 = 2,
  CUBLASLT_ORDER_COL4_4R2_8C = 3,
  CUBLASLT_ORDER_COL32_2R_4R4 = 4,
} cublasLtOrder_t;

typedef enum {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                  ///< uint32_t (cudaDataType)
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,                 ///< int32_t, default CUBLASLT_ORDER_COL
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                  ///< uint64_t
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,                  ///< uint64_t
  CUBLASLT_MATRIX_LAYOUT_LD = 4,                    ///< int64_t
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,           ///< int32_t, default 1
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,  ///< int64_t elements, default 0
} cublasLtMatrixLayoutAttribute_t;

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t sizeInBytes, size_t* sizeWritten);

// ---- the operation -----------------------------------------------------------------------
typedef enum {
  CUBLASLT_POINTER_MODE_HOST = 0,    ///< alpha and beta are read when the call is made
  CUBLASLT_POINTER_MODE_DEVICE = 1,  ///< alpha and beta are read when the work runs
} cublasLtPointerMode_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_RELU_AUX = (CUBLASLT_EPILOGUE_RELU | 128),
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = (CUBLASLT_EPILOGUE_RELU | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_RELU_AUX_BIAS = (CUBLASLT_EPILOGUE_RELU_AUX | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_DRELU = 8 | 128,
  CUBLASLT_EPILOGUE_DRELU_BGRAD = CUBLASLT_EPILOGUE_DRELU | 16,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = (CUBLASLT_EPILOGUE_GELU | 128),
  CUBLASLT_EPILOGUE_GELU_BIAS = (CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_DGELU = 64 | 128,
  CUBLASLT_EPILOGUE_DGELU_BGRAD = CUBLASLT_EPILOGUE_DGELU | 16,
} cublasLtEpilogue_t;

typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,                ///< int32_t (cublasComputeType_t)
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,                  ///< int32_t (cudaDataType)
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,                ///< int32_t, default HOST
  CUBLASLT_MATMUL_DESC_TRANSA = 3,                      ///< int32_t, default CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_TRANSB = 4,                      ///< int32_t, default CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_TRANSC = 5,                      ///< int32_t, only CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,                    ///< uint32_t, default DEFAULT
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,                ///< pointer, default NULL
  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,          ///< int64_t elements, default 0
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,       ///< pointer, default NULL
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,            ///< int64_t (bits for the ReLU mask)
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 13,  ///< int64_t, default 0
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,             ///< int32_t (cudaDataType), default -1: D's
} cublasLtMatmulDescAttributes_t;

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t sizeInBytes, size_t* sizeWritten);

// ---- algorithm search ----------------------------------------------------------------------
typedef enum {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    ///< uint64_t, default 0
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  ///< uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,  ///< uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,  ///< uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,  ///< uint32_t, default 256
} cublasLtMatmulPreferenceAttributes_t;

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes);
cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten);

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;  ///< the workspace the algorithm needs
  cublasStatus_t state;  ///< the other fields are valid only when this is SUCCESS
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

/// One algorithm for the problem (returnAlgoCount 1), or CUBLAS_STATUS_NOT_SUPPORTED with
/// returnAlgoCount 0 for a combination the library does not offer (or the emulator does not
/// compute), or CUBLAS_STATUS_INVALID_VALUE for a problem that is not well formed.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount);

/// D = epilogue(alpha * op(A) op(B) + beta * C), column-major unless a layout says ROW,
/// queued on `stream`. C may be D (with the same layout).
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream);

#if defined(__cplusplus)
}
#endif
