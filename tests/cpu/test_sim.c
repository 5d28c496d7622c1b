/* placeholder: filled in by the sim tests */
#include <criterion/criterion.h>
#include <mxshard/mxshard.h>
Test(sim, placeholder_builds) { cr_assert_eq(mxs_e4m3_from_f32(1.0f), 0x38); }
