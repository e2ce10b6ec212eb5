// ampgrad version.
#pragma once
#define AMPGRAD_VERSION_MAJOR 0
#define AMPGRAD_VERSION_MINOR 1
#define AMPGRAD_VERSION_PATCH 0
#define AMPGRAD_VERSION_STRING "0.1.0"
