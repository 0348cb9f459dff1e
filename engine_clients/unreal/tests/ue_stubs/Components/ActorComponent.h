#pragma once
#include "UObject/Object.h"
#include "GameFramework/Actor.h"
namespace EEndPlayReason {
enum Type { Destroyed, LevelTransition, EndPlayInEditor, RemovedFromWorld, Quit };
}
// UActorComponent (Components/ActorComponent.h). BeginPlay/EndPlay are protected virtuals in
// Unreal (EndPlay is public there; BeginPlay protected); the owner is the outer.
class UActorComponent : public UObject {
public:
    UActorComponent() = default;
    explicit UActorComponent(const FObjectInitializer& I) : UObject(I) {}
    explicit UActorComponent(FVTableHelper& H) : UObject(H) {}
    AActor* GetOwner() const { return Cast<AActor>(GetOuter()); }
    virtual UWorld* GetWorld() const override { return GetOwner() ? GetOwner()->GetWorld() : nullptr; }
    virtual void EndPlay(const EEndPlayReason::Type EndPlayReason) { (void)EndPlayReason; }
    void UEStub_BeginPlay() { BeginPlay(); }  // stub only: what the engine calls
protected:
    virtual void BeginPlay() {}
};
