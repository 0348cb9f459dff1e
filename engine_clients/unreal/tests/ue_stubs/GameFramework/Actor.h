#pragma once
#include "UObject/Object.h"
#include "Engine/World.h"
#include "Engine/Level.h"
// AActor (GameFramework/Actor.h). Stub: the world is set by the test.
class AActor : public UObject {
public:
    virtual UWorld* GetWorld() const override { return StubWorld; }
    UGameInstance* GetGameInstance() const { return StubWorld ? StubWorld->GetGameInstance() : nullptr; }
    // Unreal: the actor's outer is the level it was placed in
    ULevel* GetLevel() const { return Cast<ULevel>(GetOuter()); }
    UWorld* StubWorld = nullptr;
};
