#pragma once
#include "CoreMinimal.h"
#include <sys/stat.h>
// FPaths (Misc/Paths.h)
struct FPaths {
    static FString ProjectDir() { const char* D = std::getenv("OAM_STUB_PROJECT_DIR"); return FString(D ? D : "./"); }
    static FString LaunchDir() { return FString("./"); }
    template <class... A> static FString Combine(const FString& First, const A&... Rest) {
        FString Out = First;
        (Append(Out, FString(Rest)), ...);
        return Out;
    }
    static FString ConvertRelativePathToFull(const FString& P) { return P; }
    static bool FileExists(const FString& P) { struct stat St; return ::stat(*P, &St) == 0 && S_ISREG(St.st_mode); }
    static bool DirectoryExists(const FString& P) { struct stat St; return ::stat(*P, &St) == 0 && S_ISDIR(St.st_mode); }
    static FString GetPath(const FString& P) { const std::string S(*P); const auto I = S.find_last_of('/'); return I == std::string::npos ? FString() : FString(S.substr(0, I).c_str()); }
    static bool IsRelative(const FString& P) { return !P.StartsWith("/"); }
private:
    static void Append(FString& Out, const FString& Part) {
        if (Part.IsEmpty()) return;
        if (!Out.IsEmpty() && !std::string(*Out).empty() && std::string(*Out).back() != '/') Out += FString("/");
        Out += Part;
    }
};
