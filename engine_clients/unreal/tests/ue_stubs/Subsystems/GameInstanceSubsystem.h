#pragma once
#include "Subsystems/Subsystem.h"
class UGameInstance;
// UGameInstanceSubsystem (Subsystems/GameInstanceSubsystem.h); its outer is the game instance.
class UGameInstanceSubsystem : public USubsystem {
public:
    UGameInstanceSubsystem() = default;
    explicit UGameInstanceSubsystem(FVTableHelper& H) : USubsystem(H) {}
    explicit UGameInstanceSubsystem(const FObjectInitializer& I) : USubsystem(I) {}
    UGameInstance* GetGameInstance() const;
};
#include "Engine/GameInstance.h"
inline UGameInstance* UGameInstanceSubsystem::GetGameInstance() const { return Cast<UGameInstance>(GetOuter()); }
