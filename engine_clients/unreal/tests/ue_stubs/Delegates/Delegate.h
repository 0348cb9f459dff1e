#pragma once
// Dynamic delegates (Delegates/DelegateCombinations.h): DECLARE_DYNAMIC_MULTICAST_DELEGATE_*Params
// (BlueprintAssignable events; bound with AddDynamic to a UFUNCTION of a UObject) and
// DECLARE_DYNAMIC_DELEGATE_*Params (single-cast, a Blueprint function's delegate pin; BindDynamic).
// As in Unreal, a bound object that was destroyed is skipped (stub: the live-object registry).
#include <unordered_set>
#include <utility>
#include <vector>

inline std::unordered_set<const void*>& UEStub_LiveObjects() { static std::unordered_set<const void*> S; return S; }

template <class... A> class TUEStubDynamicMulticast {
public:
    void Broadcast(A... Args) const {
        const auto Copy = Bound;
        for (const auto& B : Copy)
            if (UEStub_LiveObjects().count(B.first)) B.second(Args...);
    }
    template <class U> void __Internal_AddDynamic(U* Obj, void (U::*Fn)(A...), const char*) {
        Bound.push_back({static_cast<const void*>(Obj), [Obj, Fn](A... Args) { (Obj->*Fn)(Args...); }});
    }
    bool IsBound() const { return !Bound.empty(); }
    void Clear() { Bound.clear(); }
private:
    std::vector<std::pair<const void*, std::function<void(A...)>>> Bound;
};

template <class... A> class TUEStubDynamicDelegate {
public:
    template <class U> void __Internal_BindDynamic(U* Obj, void (U::*Fn)(A...), const char*) {
        Target = Obj;
        Call = [Obj, Fn](A... Args) { (Obj->*Fn)(Args...); };
    }
    bool IsBound() const { return Call && UEStub_LiveObjects().count(Target); }
    bool ExecuteIfBound(A... Args) const {
        if (!IsBound()) return false;
        Call(Args...);
        return true;
    }
    void Unbind() { Call = nullptr; Target = nullptr; }
private:
    const void* Target = nullptr;
    std::function<void(A...)> Call;
};

#define AddDynamic(UserObject, FuncName) __Internal_AddDynamic(UserObject, FuncName, #FuncName)
#define BindDynamic(UserObject, FuncName) __Internal_BindDynamic(UserObject, FuncName, #FuncName)

#define DECLARE_DYNAMIC_MULTICAST_DELEGATE(Name) struct Name : TUEStubDynamicMulticast<> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(Name, T1, N1) struct Name : TUEStubDynamicMulticast<T1> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(Name, T1, N1, T2, N2) struct Name : TUEStubDynamicMulticast<T1, T2> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_ThreeParams(Name, T1, N1, T2, N2, T3, N3) \
    struct Name : TUEStubDynamicMulticast<T1, T2, T3> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_FourParams(Name, T1, N1, T2, N2, T3, N3, T4, N4) \
    struct Name : TUEStubDynamicMulticast<T1, T2, T3, T4> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_FiveParams(Name, T1, N1, T2, N2, T3, N3, T4, N4, T5, N5) \
    struct Name : TUEStubDynamicMulticast<T1, T2, T3, T4, T5> {};
#define DECLARE_DYNAMIC_MULTICAST_DELEGATE_SixParams(Name, T1, N1, T2, N2, T3, N3, T4, N4, T5, N5, T6, N6) \
    struct Name : TUEStubDynamicMulticast<T1, T2, T3, T4, T5, T6> {};
#define DECLARE_DYNAMIC_DELEGATE_OneParam(Name, T1, N1) struct Name : TUEStubDynamicDelegate<T1> {};
#define DECLARE_DYNAMIC_DELEGATE_TwoParams(Name, T1, N1, T2, N2) struct Name : TUEStubDynamicDelegate<T1, T2> {};
#define DECLARE_DYNAMIC_DELEGATE_ThreeParams(Name, T1, N1, T2, N2, T3, N3) struct Name : TUEStubDynamicDelegate<T1, T2, T3> {};
