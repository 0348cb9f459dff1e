#pragma once
#include "CoreMinimal.h"
#include "UObject/ObjectMacros.h"
class UWorld;
// UObject (UObject/Object.h). Stub: objects register as live while they exist (weak pointers and
// delegates check it, as Unreal's do against garbage collection).
class UObject {
public:
    UObject() { UEStub_LiveObjects().insert(this); }
    explicit UObject(FVTableHelper&) { UEStub_LiveObjects().insert(this); }
    explicit UObject(const FObjectInitializer&) { UEStub_LiveObjects().insert(this); }
    UObject(const UObject&) = delete;
    virtual ~UObject() { UEStub_LiveObjects().erase(this); }
    virtual UWorld* GetWorld() const { return nullptr; }
    UObject* GetOuter() const { return Outer; }
    // the top of the outer chain (Unreal: the UPackage, e.g. a map's "/Game/Maps/Docks")
    UObject* GetOutermost() const { const UObject* o = this; while (o->Outer) o = o->Outer; return const_cast<UObject*>(o); }
    FString GetName() const { return Name; }
    // stub only: NewObject's arguments
    UObject* Outer = nullptr;
    FString Name;
};

// TWeakObjectPtr (UObject/WeakObjectPtrTemplates.h)
template <class T> class TWeakObjectPtr {
public:
    TWeakObjectPtr(T* p = nullptr) : p_(p) {}
    T* Get() const { return p_ && UEStub_LiveObjects().count(static_cast<const void*>(p_)) ? p_ : nullptr; }
    bool IsValid() const { return Get() != nullptr; }
private:
    T* p_;
};

// NewObject (UObject/UObjectGlobals.h). Stub: plain new; nothing collects it.
template <class T> T* NewObject(UObject* Outer = nullptr, const FString& Name = FString()) {
    T* Obj = new T();
    Obj->Outer = Outer;
    Obj->Name = Name;
    return Obj;
}
template <class T> T* Cast(UObject* Obj) { return dynamic_cast<T*>(Obj); }
template <class T> const T* Cast(const UObject* Obj) { return dynamic_cast<const T*>(Obj); }
