#pragma once
#include "UObject/Object.h"
#include "Engine/World.h"
// AActor (GameFramework/Actor.h). Stub: the world is set by the test.
class AActor : public UObject {
public:
    virtual UWorld* GetWorld() const override { return StubWorld; }
    UGameInstance* GetGameInstance() const { return StubWorld ? StubWorld->GetGameInstance() : nullptr; }
    UWorld* StubWorld = nullptr;
};
