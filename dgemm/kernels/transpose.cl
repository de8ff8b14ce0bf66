// Transpose with zero padding in one pass (the seed suggests fusing the two
// supporting kernels).  A TT x TT tile goes through local memory so that both
// the read of src and the write of dst are coalesced; the tile row is padded
// by one element so the column-wise read of the tile hits distinct banks.
#include "common.cl"

#ifndef TRANSPOSE_TILE
#define TRANSPOSE_TILE 16
#endif
#define TT TRANSPOSE_TILE

// dst (drows x dcols, row-major) = transpose(src (rows x cols)) with zeros
// outside it; drows >= cols and dcols >= rows.
// Global size: (roundup(drows, TT), roundup(dcols, TT)), local (TT, TT).
__kernel __attribute__((reqd_work_group_size(TT, TT, 1)))
void transpose_pad(const int rows, const int cols,
                   const __global real* restrict src,
                   const int drows, const int dcols,
                   __global real* restrict dst)
{
    __local real tile[TT][TT + 1];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    // Read: group (gx, gy) covers src rows gy*TT.., src columns gx*TT..
    const int sc = get_group_id(0) * TT + tx;
    const int sr = get_group_id(1) * TT + ty;
    tile[ty][tx] = (sr < rows && sc < cols) ? src[(size_t)sr * cols + sc] : ZERO;
    barrier(CLK_LOCAL_MEM_FENCE);
    // Write: dst row = src column, dst column = src row.
    const int dr = get_group_id(0) * TT + ty;
    const int dc = get_group_id(1) * TT + tx;
    if (dr < drows && dc < dcols) {
        dst[(size_t)dr * dcols + dc] = tile[tx][ty];
    }
}
