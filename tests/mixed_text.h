/* Random lines of mixed-script text from a seed, the same as
 * tests/ref/mixed_text.py makes (the reference data and the tokenizer
 * benchmark depend on the two agreeing; test_hftok checks a hash of the
 * text): splitmix64 numbers pick runs of 1-8 characters from the ranges
 * below (Latin, digits, spaces and punctuation, Greek, Cyrillic, Arabic,
 * Devanagari, Thai, Hangul, CJK, kana, emoji, combining marks, ZWJ,
 * variation selectors, tabs and newlines). */
#ifndef DCP_MIXED_TEXT_H
#define DCP_MIXED_TEXT_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t mix_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const uint32_t MIX_RANGES[][2] = {
    {0x61, 26},   {0x61, 26},   {0x41, 26},   {0x30, 10},   {0x20, 1},     {0x20, 1},    {0x21, 15},
    {0x3A, 7},    {0xC0, 64},   {0x17F, 1},   {0x391, 57},  {0x410, 64},   {0x621, 42},  {0x905, 53},
    {0xE01, 46},  {0xAC00, 11172}, {0x4E00, 20902}, {0x3041, 86}, {0x1F600, 80}, {0x1F3FB, 5}, {0x300, 112},
    {0x200D, 1},  {0xFE0F, 1},  {0x9, 1},     {0xA, 1},     {0x2019, 1},
};
#define MIX_N_RANGES (sizeof MIX_RANGES / sizeof *MIX_RANGES)
#define MIX_LINE_MAX (12 * 8 * 4 + 1)

static inline int mix_utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[2] = (char)(0x80 | (cp & 0x3F)), 3;
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The next line (NUL-terminated, at most MIX_LINE_MAX bytes); its length. */
static inline size_t mixed_line(uint64_t *s, char *buf)
{
    size_t n = 0;
    int runs = 1 + (int)(mix_next(s) % 12);
    for (int r = 0; r < runs; r++) {
        const uint32_t *range = MIX_RANGES[mix_next(s) % MIX_N_RANGES];
        int len = 1 + (int)(mix_next(s) % 8);
        for (int k = 0; k < len; k++) n += (size_t)mix_utf8(range[0] + (uint32_t)(mix_next(s) % range[1]), buf + n);
    }
    buf[n] = '\0';
    return n;
}

#endif
