#pragma once
#include "CoreMinimal.h"
struct FPlatformMisc { static FString GetEnvironmentVariable(const TCHAR* n) { const char* v = std::getenv(n); return FString(v ? v : ""); } };
