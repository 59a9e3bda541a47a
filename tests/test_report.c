/* The summary's numbers and text: percentiles by nearest rank (p99 never
 * below p50, the largest value at p99 of a few), and previews that cut
 * only between whole UTF-8 characters. */
#include "report.h"
#include "testutil.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    /* nearest rank: two values give p50 = the lower, p99 = the higher */
    double two[] = {0.1, 0.9}, eight[] = {1, 2, 3, 4, 5, 6, 7, 8}, hundred[100];
    for (int i = 0; i < 100; i++) hundred[i] = i + 1;
    CHECK(percentile_nearest_rank(two, 2, 50) == 0.1 && percentile_nearest_rank(two, 2, 99) == 0.9, "two values");
    CHECK(percentile_nearest_rank(eight, 8, 99) == 8 && percentile_nearest_rank(eight, 8, 50) == 4, "eight values: p99 %g p50 %g",
          percentile_nearest_rank(eight, 8, 99), percentile_nearest_rank(eight, 8, 50));
    CHECK(percentile_nearest_rank(hundred, 100, 99) == 99 && percentile_nearest_rank(hundred, 100, 50) == 50,
          "1..100: p99 %g, p50 %g", percentile_nearest_rank(hundred, 100, 99), percentile_nearest_rank(hundred, 100, 50));
    CHECK(percentile_nearest_rank(eight, 1, 99) == 1, "one value");

    /* previews: 60 characters, whole UTF-8 characters only */
    char out[8 * 60 + 8], text[256];
    memset(text, 'a', 59);
    strcpy(text + 59, "\xc3\xa9\xe2\x82\xac tail"); /* 59 x a, e-acute, euro, ... */
    text_preview(text, strlen(text), 60, out, sizeof out);
    CHECK(valid_utf8(out) && strstr(out, "a\xc3\xa9...\""), "cut after the 60th character: %s", out);
    strcpy(text, "new\nline \"quoted\" \x01 bad \xff byte, cut \xe2\x82");
    text_preview(text, strlen(text), 60, out, sizeof out);
    CHECK(valid_utf8(out) && !strcmp(out, "\"new\\nline \\\"quoted\\\" \\x01 bad \\xff byte, cut \\xe2\\x82\""),
          "escapes: %s", out);
    const char *emoji = "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d"; /* two 4-byte characters */
    text_preview(emoji, strlen(emoji), 1, out, sizeof out);
    CHECK(!strcmp(out, "\"\xf0\x9f\x98\x80...\""), "one of two emoji: %s", out);
    int status = test_finish("test_report");
    MPI_Finalize();
    return status;
}
