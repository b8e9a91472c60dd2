// Compiles tests/fuzz/pch.h into the precompiled header the harness targets reuse.
#include "tests/fuzz/pch.h"
