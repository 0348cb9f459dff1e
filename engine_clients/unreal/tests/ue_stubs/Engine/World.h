#pragma once
#include "UObject/Object.h"
#include "Engine/GameInstance.h"
// UWorld (Engine/World.h)
class UWorld : public UObject {
public:
    UGameInstance* GetGameInstance() const { return OwningGameInstance; }
    UGameInstance* OwningGameInstance = nullptr;  // a public member in Unreal too
};
