/* SPEC section 1: every oracle vector, and the NaN / inf rules. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <mxshard/mxshard.h>

static FILE *open_vectors(const char *name) {
    char path[1024];
    const char *dir = getenv("MXS_VECTORS_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : MXS_VECTORS_DIR, name);
    return fopen(path, "r");
}

Test(formats, e4m3_from_f32_matches_every_oracle_vector) {
    FILE *f = open_vectors("e4m3_from_f32.txt");
    char line[256];
    long n = 0, bad = 0;
    cr_assert_not_null(f, "tests/vectors/e4m3_from_f32.txt is missing");
    while (fgets(line, sizeof line, f)) {
        unsigned bits, want;
        if (line[0] == '#' || sscanf(line, "%x %x", &bits, &want) != 2) continue;
        n++;
        if (mxs_e4m3_from_f32(mxs_f32_from_bits(bits)) != want) bad++;
    }
    fclose(f);
    cr_assert_gt(n, 100000, "only %ld vectors read", n);
    cr_assert_eq(bad, 0, "%ld of %ld E4M3 conversions differ from the oracle", bad, n);
}

Test(formats, e8m0_up_and_down_match_every_oracle_vector) {
    FILE *f = open_vectors("e8m0_from_f32.txt");
    char line[256];
    long n = 0, bad = 0;
    cr_assert_not_null(f, "tests/vectors/e8m0_from_f32.txt is missing");
    while (fgets(line, sizeof line, f)) {
        unsigned bits, up, down;
        if (line[0] == '#' || sscanf(line, "%x %x %x", &bits, &up, &down) != 3) continue;
        n++;
        if (mxs_e8m0_up(mxs_f32_from_bits(bits)) != up || mxs_e8m0_down(mxs_f32_from_bits(bits)) != down) bad++;
    }
    fclose(f);
    cr_assert_gt(n, 50000, "only %ld vectors read", n);
    cr_assert_eq(bad, 0, "%ld of %ld E8M0 conversions differ from the oracle", bad, n);
}
