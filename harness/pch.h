// Precompiled header: the heavy LibTorch headers, parsed once per target.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
