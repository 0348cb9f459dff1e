#pragma once
#include "UObject/Object.h"
class FSubsystemCollectionBase {};
// USubsystem (Subsystems/Subsystem.h)
class USubsystem : public UObject {
public:
    USubsystem() = default;
    explicit USubsystem(FVTableHelper& H) : UObject(H) {}
    explicit USubsystem(const FObjectInitializer& I) : UObject(I) {}
    virtual bool ShouldCreateSubsystem(UObject* Outer) const { (void)Outer; return true; }
    virtual void Initialize(FSubsystemCollectionBase& Collection) { (void)Collection; }
    virtual void Deinitialize() {}
};
