// See gloo/context.h: the declarations ProcessGroupGloo.hpp needs, without Gloo itself.
#pragma once
#include "gloo/context.h"
