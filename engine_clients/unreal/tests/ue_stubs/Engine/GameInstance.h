#pragma once
#include "UObject/Object.h"
#include <vector>
class UGameInstanceSubsystem;
// UGameInstance (Engine/GameInstance.h). Stub: subsystems are added by the test (UEStub_Add).
class UGameInstance : public UObject {
public:
    template <class T> T* GetSubsystem() const {
        for (UObject* S : Subsystems)
            if (T* Typed = dynamic_cast<T*>(S)) return Typed;
        return nullptr;
    }
    void UEStub_Add(UObject* Subsystem) { Subsystem->Outer = this; Subsystems.push_back(Subsystem); }
private:
    std::vector<UObject*> Subsystems;
};
