#pragma once
#include "CoreMinimal.h"
struct FPaths {
    static FString ProjectDir() { return FString("./"); }
    static FString Combine(const FString& a, const FString&) { return a; }
    static FString ConvertRelativePathToFull(const FString& p) { return p; }
};
