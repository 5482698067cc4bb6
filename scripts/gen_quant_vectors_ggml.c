// Bit-exact test vectors for hotcold's ggml quantisation formats, from ggml itself.
//
// Writes core/tests/data/quant/ggml_<kind>_<type>.bin (layout in core/tests/data/quant/README.md):
// - kind `quant`: deterministic f32 inputs (zero, tiny, tie, outlier, extreme and random blocks),
//   ggml's reference quantiser (`quantize_row_*_ref`, `ggml_fp32_to_fp16_row`,
//   `ggml_fp32_to_bf16_row_ref`) and ggml's dequantiser of those bytes (where ggml has one);
// - kind `random`: random block bytes with sane finite scale fields, and ggml's dequantiser of them.
//
// Build against a built llama.cpp (LLAMA=~/.cache/hotcold-ref/llama.cpp):
//   cc -O2 -o /tmp/gen_quant_vectors_ggml scripts/gen_quant_vectors_ggml.c
//      -I$LLAMA/ggml/include -I$LLAMA/ggml/src -L$LLAMA/build/bin -lggml-base -lm
//      -Wl,-rpath,$LLAMA/build/bin            (one command line)
//   /tmp/gen_quant_vectors_ggml core/tests/data/quant

#include "ggml-quants.h"
#include "ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HAS_INPUT = 1, HAS_QUANT = 2, HAS_DEQUANT = 4 };

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*dequant_fn)(const void *, float *, int64_t);

static void q_f16(const float * x, void * y, int64_t n) { ggml_fp32_to_fp16_row(x, y, n); }
static void q_bf16(const float * x, void * y, int64_t n) { ggml_fp32_to_bf16_row_ref(x, y, n); }
static void d_f16(const void * x, float * y, int64_t n) { ggml_fp16_to_fp32_row(x, y, n); }
static void d_bf16(const void * x, float * y, int64_t n) { ggml_bf16_to_fp32_row(x, y, n); }
static void q_f32(const float * x, void * y, int64_t n) { memcpy(y, x, (size_t) n * 4); }
static void d_f32(const void * x, float * y, int64_t n) { memcpy(y, x, (size_t) n * 4); }

#define Q(name) static void q_##name(const float * x, void * y, int64_t n) { quantize_row_##name##_ref(x, y, n); }
#define D(name) static void d_##name(const void * x, float * y, int64_t n) { dequantize_row_##name(x, y, n); }
Q(q4_0) Q(q4_1) Q(q5_0) Q(q5_1) Q(q8_0) Q(q8_1) Q(q2_K) Q(q3_K) Q(q4_K) Q(q5_K) Q(q6_K) Q(q8_K)
D(q4_0) D(q4_1) D(q5_0) D(q5_1) D(q8_0) D(q2_K) D(q3_K) D(q4_K) D(q5_K) D(q6_K) D(q8_K)

struct qtype {
    enum ggml_type type;
    const char * name;
    int block, bytes;
    quant_fn quant;
    dequant_fn dequant;
    int f16_fields[2]; // byte offsets of f16 scale fields (-1: none)
    int f32_field;     // byte offset of an f32 scale field (-1: none)
};

static const struct qtype TYPES[] = {
    { GGML_TYPE_F32,  "f32",  1,   4,   q_f32,  d_f32,  { -1, -1 }, -1 },
    { GGML_TYPE_F16,  "f16",  1,   2,   q_f16,  d_f16,  { -1, -1 }, -1 },
    { GGML_TYPE_BF16, "bf16", 1,   2,   q_bf16, d_bf16, { -1, -1 }, -1 },
    { GGML_TYPE_Q4_0, "q4_0", 32,  18,  q_q4_0, d_q4_0, { 0, -1 },  -1 },
    { GGML_TYPE_Q4_1, "q4_1", 32,  20,  q_q4_1, d_q4_1, { 0, 2 },   -1 },
    { GGML_TYPE_Q5_0, "q5_0", 32,  22,  q_q5_0, d_q5_0, { 0, -1 },  -1 },
    { GGML_TYPE_Q5_1, "q5_1", 32,  24,  q_q5_1, d_q5_1, { 0, 2 },   -1 },
    { GGML_TYPE_Q8_0, "q8_0", 32,  34,  q_q8_0, d_q8_0, { 0, -1 },  -1 },
    { GGML_TYPE_Q8_1, "q8_1", 32,  36,  q_q8_1, NULL,   { 0, 2 },   -1 },
    { GGML_TYPE_Q2_K, "q2_k", 256, 84,  q_q2_K, d_q2_K, { 80, 82 }, -1 },
    { GGML_TYPE_Q3_K, "q3_k", 256, 110, q_q3_K, d_q3_K, { 108, -1 }, -1 },
    { GGML_TYPE_Q4_K, "q4_k", 256, 144, q_q4_K, d_q4_K, { 0, 2 },   -1 },
    { GGML_TYPE_Q5_K, "q5_k", 256, 176, q_q5_K, d_q5_K, { 0, 2 },   -1 },
    { GGML_TYPE_Q6_K, "q6_k", 256, 210, q_q6_K, d_q6_K, { 208, -1 }, -1 },
    { GGML_TYPE_Q8_K, "q8_k", 256, 292, q_q8_K, d_q8_K, { -1, -1 }, 0 },
};

// splitmix64: a small, fully specified PRNG (the inputs are stored, so only determinism matters).
static uint64_t rng_state = 0x5eed2024u;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_uniform(void) { return (double) (rng_u64() >> 11) * 0x1.0p-53; }
static double rng_normal(void) {
    double u = rng_uniform(), v = rng_uniform();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

// Fills blocks of `bs` values with rounding edge cases, one block per kind (fewer kinds for the
// 256-element K-quant blocks, to keep the files small); returns the element count.
static int edge_inputs(float * x, int bs) {
    static const int all_kinds[] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14 };
    static const int k_kinds[] = { 0, 1, 3, 4, 5, 6, 9, 10, 12, 14 };
    const int * kinds = bs == 256 ? k_kinds : all_kinds;
    const int nkinds = bs == 256 ? 10 : 15;
    int n = 0;
    for (int ik = 0; ik < nkinds; ++ik) {
        const int kind = kinds[ik];
        float * b = x + n;
        for (int j = 0; j < bs; ++j) {
            double g = rng_normal();
            double v = 0;
            switch (kind) {
                case 0: v = 0; break;                                   // all zero
                case 1: v = g * 1e-30; break;                           // tiny
                case 2: v = g * 1e-6; break;                            // f16-subnormal scales
                case 3: v = j == bs / 3 ? 3000.0 : g; break;            // one large outlier
                case 4: v = j == bs - 1 ? -30000.0 : g * 10; break;     // negative extreme
                case 5: v = ((j % 32) - 16) * 0.5; break;               // exact ties (d = 1)
                case 6: v = j == 0 ? 127.0 : (-127 + 8 * (j % 32)) + 0.5; break; // Q8 ties
                case 7: v = 0.75; break;                                // constant
                case 8: v = -fabs(g); break;                            // all negative
                case 9: v = fabs(g) + 1.0; break;                       // all positive
                case 10: v = j % 7 == 0 ? 0.0 : g; break;               // sparse
                case 11: v = 2 * rng_uniform() - 1; break;
                case 12: v = g * 0.02; break;                           // weight-like
                case 13: v = g * 100; break;
                case 14: {                                              // sub-blocks of mixed scale
                    int sb = j / 16;
                    v = sb % 5 == 4 ? 0.0 : g * pow(10.0, (sb % 10) - 6);
                    break;
                }
            }
            b[j] = (float) v;
        }
        n += bs;
    }
    return n;
}

// F16/BF16 rounding edge cases, NaNs included (ggml makes them quiet, F16 to the canonical 0x7E00).
static int float_inputs(float * x) {
    const uint32_t bits[] = { 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0xff812345u };
    const double special[] = { 0.0, -0.0, INFINITY, -INFINITY, 1.0, -1.0, 65504.0, 65519.0, 65520.0,
        65536.0, -65520.0, 0x1p-24, 0x1p-25, 0x1.000002p-25, 0x3p-25, 0x1p-14, 0x1.fffffcp-15,
        1.0 + 0x1p-11, 1.0 + 0x3p-11, 1.0 + 0x1p-8, 1.0 + 0x3p-8, 1e-40, -1e-45, 3.4028235e38,
        -3.4028235e38, 1.17549435e-38 };
    int n = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; ++i) memcpy(&x[n++], &bits[i], 4);
    for (size_t i = 0; i < sizeof special / sizeof special[0]; ++i) x[n++] = (float) special[i];
    while (n < 256) x[n++] = (float) (rng_normal() * pow(10.0, (double) (rng_u64() % 14) - 8));
    return n;
}

static void write_vector(const char * dir, const char * kind, const struct qtype * t, int n,
                         const float * x, const uint8_t * q, const float * y) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ggml_%s_%s.bin", dir, kind, t->name);
    FILE * f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    uint32_t head[5] = { 1, (uint32_t) t->type, (uint32_t) n,
        (x ? HAS_INPUT : 0) | (q ? HAS_QUANT : 0) | (y ? HAS_DEQUANT : 0) };
    fwrite("HCQV", 1, 4, f);
    fwrite(head, 4, 4, f);
    if (x) fwrite(x, 4, (size_t) n, f);
    if (q) fwrite(q, 1, (size_t) (n / t->block * t->bytes), f);
    if (y) fwrite(y, 4, (size_t) n, f);
    fclose(f);
}

int main(int argc, char ** argv) {
    const char * dir = argc > 1 ? argv[1] : "core/tests/data/quant";
    static float x[15 * 256], y[15 * 256];
    static uint8_t q[15 * 292 + 4096];
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; ++i) {
        const struct qtype * t = &TYPES[i];
        int n = t->block == 1 ? float_inputs(x) : edge_inputs(x, t->block);
        // zeroed first: quantize_row_q8_K_ref leaves the bsums of an all-zero block untouched
        memset(q, 0, sizeof q);
        t->quant(x, q, n);
        if (t->dequant) t->dequant(q, y, n);
        write_vector(dir, "quant", t, n, x, q, t->dequant ? y : NULL);

        if (!t->dequant || t->type == GGML_TYPE_F32) continue;
        // random block bytes with sane scale fields
        int nb = t->block == 1 ? 256 : t->block == 32 ? 16 : 6;
        n = nb * t->block;
        for (int j = 0; j < nb * t->bytes; ++j) q[j] = (uint8_t) rng_u64();
        for (int b = 0; b < nb; ++b) {
            uint8_t * blk = q + b * t->bytes;
            for (int k = 0; k < 2; ++k) {
                if (t->f16_fields[k] < 0) continue;
                double mag = pow(10.0, 4 * rng_uniform() - 3) * (rng_u64() & 1 ? -1 : 1);
                ggml_fp16_t h = ggml_fp32_to_fp16((float) mag);
                memcpy(blk + t->f16_fields[k], &h, 2);
            }
            if (t->f32_field >= 0) {
                float d = (float) (pow(10.0, 4 * rng_uniform() - 5) * (rng_u64() & 1 ? -1 : 1));
                memcpy(blk + t->f32_field, &d, 4);
            }
        }
        if (t->block == 1) {
            // keep F16/BF16 values finite: clear an exponent bit where the exponent is all ones
            for (int j = 0; j < n; ++j) {
                uint16_t h; memcpy(&h, q + 2 * j, 2);
                if (t->type == GGML_TYPE_F16 && (h & 0x7c00) == 0x7c00) h &= ~0x0400;
                if (t->type == GGML_TYPE_BF16 && (h & 0x7f80) == 0x7f80) h &= ~0x4000;
                memcpy(q + 2 * j, &h, 2);
            }
        }
        t->dequant(q, y, n);
        write_vector(dir, "random", t, n, NULL, q, y);
    }
    return 0;
}
