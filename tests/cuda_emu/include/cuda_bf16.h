// tests/cuda_emu/include/cuda_bf16.h: stands in for the CUDA header of that name when the
// cuda-emu backend compiles a plan's module as C++ (see ../emu.hpp, which provides its
// types and conversions).
#pragma once
#include "emu.hpp"
