#pragma once
#include "CoreMinimal.h"
// FPlatformProcess (HAL/PlatformProcess.h). BaseDir: the directory of the running executable.
struct FPlatformProcess {
    static const TCHAR* BaseDir() { const char* D = std::getenv("OAM_STUB_BASE_DIR"); return D ? D : "./"; }
};
