#include <gtest/gtest.h>
#include "harness/registry.h"
TEST(Registry, HasAttention) { EXPECT_TRUE(mixbench::Registry::get().has_op("attention")); }
