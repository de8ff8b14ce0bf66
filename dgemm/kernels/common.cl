// Element type shared by every dgemm kernel.  PRECISION is set by the host
// (32 or 64); the vector type realV has WIDTH lanes and is what the global
// loads of the GEMM kernel use (seed kernel 10: wide vector loads).
#ifndef DGEMM_COMMON_CL
#define DGEMM_COMMON_CL

#ifndef PRECISION
#define PRECISION 32
#endif

#if PRECISION == 64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double real;
typedef double2 real2;
typedef double4 real4;
typedef double8 real8;
typedef double16 real16;
#define ZERO 0.0
#else
typedef float real;
typedef float2 real2;
typedef float4 real4;
typedef float8 real8;
typedef float16 real16;
#define ZERO 0.0f
#endif

#ifndef WIDTH
#define WIDTH 1
#endif

// vloadN/vstoreN address p + offset*N; WIDTH 1 degenerates to plain access.
#if WIDTH == 1
typedef real realV;
#define VLOAD(offset, p) ((p)[offset])
#define VSTORE(v, offset, p) ((p)[offset] = (v))
#elif WIDTH == 2
typedef real2 realV;
#define VLOAD vload2
#define VSTORE vstore2
#elif WIDTH == 4
typedef real4 realV;
#define VLOAD vload4
#define VSTORE vstore4
#elif WIDTH == 8
typedef real8 realV;
#define VLOAD vload8
#define VSTORE vstore8
#else
#error "WIDTH must be 1, 2, 4 or 8"
#endif

// Work-group -> (offsetM, offsetN), optionally in bands of GROUPM tile rows so
// that groups running together share A rows and B columns in L2.
#if GROUPM > 0
#define TILE_ORIGIN(offsetM, offsetN)                                           \
    const int nx_ = get_num_groups(0), ny_ = get_num_groups(1);                 \
    const int lin_ = get_group_id(1) * nx_ + get_group_id(0);                   \
    const int band_ = lin_ / (GROUPM * nx_);                                    \
    const int rows_ = min(ny_ - band_ * GROUPM, GROUPM);                        \
    const int within_ = lin_ - band_ * (GROUPM * nx_);                          \
    const int offsetM = TSM * (band_ * GROUPM + within_ % rows_);               \
    const int offsetN = TSN * (within_ / rows_)
#else
#define TILE_ORIGIN(offsetM, offsetN)                                           \
    const int offsetN = TSN * get_group_id(0);                                  \
    const int offsetM = TSM * get_group_id(1)
#endif

#endif  // DGEMM_COMMON_CL
