#pragma once
#include "UObject/Object.h"
#include "Engine/GameInstance.h"
// UWorld (Engine/World.h)
class ULevel;
class UWorld : public UObject {
public:
    ULevel* PersistentLevel = nullptr;  // a public member in Unreal too
    // Unreal: "UEDPIE_0_Docks" -> "Docks" (Play In Editor prefixes its maps' names)
    static FString RemovePIEPrefix(const FString& Name) {
        std::string s = *Name;
        if (s.rfind("UEDPIE_", 0) == 0) {
            const auto u = s.find('_', 7);
            if (u != std::string::npos) s = s.substr(u + 1);
        }
        return FString(s.c_str());
    }
    UGameInstance* GetGameInstance() const { return OwningGameInstance; }
    UGameInstance* OwningGameInstance = nullptr;  // a public member in Unreal too
};
