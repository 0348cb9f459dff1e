#pragma once
#include "CoreMinimal.h"
class FSubsystemCollectionBase {};
class UGameInstanceSubsystem : public UObject {
public:
    virtual void Initialize(FSubsystemCollectionBase&) {}
    virtual void Deinitialize() {}
};
// UHT's GENERATED_BODY declares Super; the stub's UCLASS cannot, so the stub adds it here.
#define Super UGameInstanceSubsystem
