// Zero padding and unpadding (seed kernel 10): the GEMM kernel only sees
// matrices whose sizes are multiples of its tiles, so edge blocks are copied
// into zero-filled, tile-aligned buffers on the device, and the result is cut
// back to its true size before it is read.  Offsets are size_t so a padded
// block of more than 2^31 elements cannot wrap.
#include "common.cl"

// dst (rows_xl x cols_xl, row-major) = src (rows x cols, leading dim ld_src)
// with zeros outside the source.  Global size: (cols_xl, rows_xl).
__kernel void pad_zeros(const int rows, const int cols, const int ld_src,
                        const __global real* restrict src,
                        const int rows_xl, const int cols_xl,
                        __global real* restrict dst)
{
    const int c = get_global_id(0);
    const int r = get_global_id(1);
    if (r < rows_xl && c < cols_xl) {
        real v = ZERO;
        if (r < rows && c < cols) {
            v = src[(size_t)r * ld_src + c];
        }
        dst[(size_t)r * cols_xl + c] = v;
    }
}

// dst (rows x cols, dense) = top-left corner of src (leading dim ld_src).
// Global size: (cols, rows).
__kernel void unpad(const int rows, const int cols, const int ld_src,
                    const __global real* restrict src,
                    __global real* restrict dst)
{
    const int c = get_global_id(0);
    const int r = get_global_id(1);
    if (r < rows && c < cols) {
        dst[(size_t)r * cols + c] = src[(size_t)r * ld_src + c];
    }
}
