#pragma once
#include "UObject/Object.h"
#include "Engine/GameInstance.h"
// UBlueprintAsyncActionBase (Kismet/BlueprintAsyncActionBase.h): a static BlueprintCallable
// factory (meta = BlueprintInternalUseOnly) makes it; the Blueprint node binds its
// BlueprintAssignable delegates to output pins and calls Activate().
class UBlueprintAsyncActionBase : public UObject {
public:
    UBlueprintAsyncActionBase() = default;
    explicit UBlueprintAsyncActionBase(FVTableHelper& H) : UObject(H) {}
    explicit UBlueprintAsyncActionBase(const FObjectInitializer& I) : UObject(I) {}
    virtual void Activate() {}
    virtual void RegisterWithGameInstance(const UObject* WorldContextObject) { (void)WorldContextObject; }
    virtual void RegisterWithGameInstance(UGameInstance* GameInstance) { (void)GameInstance; }
    virtual void SetReadyToDestroy() { bReadyToDestroy = true; }
    bool bReadyToDestroy = false;  // stub only
};
