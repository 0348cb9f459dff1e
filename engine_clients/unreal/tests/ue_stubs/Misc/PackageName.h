#pragma once
#include "CoreMinimal.h"
#include <string>
// FPackageName (Misc/PackageName.h)
struct FPackageName {
    // "/Game/Maps/Docks" -> "Docks"
    static FString GetShortName(const FString& LongName) {
        std::string s = *LongName;
        const auto slash = s.rfind('/');
        return FString(slash == std::string::npos ? s.c_str() : s.substr(slash + 1).c_str());
    }
};
