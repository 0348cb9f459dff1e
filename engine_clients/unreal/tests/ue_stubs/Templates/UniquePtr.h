#pragma once
#include <type_traits>
#include <utility>
// TUniquePtr (Templates/UniquePtr.h) in the shape of Unreal's: a TDefaultDelete deleter whose
// operator() deletes the pointee, so the pointee must be a complete type wherever the
// TUniquePtr's destructor is instantiated. Unreal's own comment there (paraphrased): to keep a
// TUniquePtr<FForwardDeclared> inside a UObject, declare every constructor and the destructor
// in the .h, define them in the .cpp, and define a UMyObject(FVTableHelper& Helper) constructor
// too; otherwise UHT defines it in the .gen.cpp, where the pointee is incomplete.
// Unreal deletes with `delete Ptr` (a warning or error per compiler); the static_assert makes
// it an error here in every case.
template <class T> struct TDefaultDelete {
    void operator()(T* Ptr) const {
        static_assert(sizeof(T) > 0, "TUniquePtr of an incomplete type destroyed here: see Templates/UniquePtr.h "
                                     "(define UMyObject(FVTableHelper&) and ~UMyObject() in the .cpp)");
        delete Ptr;
    }
};
template <class T, class Deleter = TDefaultDelete<T>> class TUniquePtr : private Deleter {
public:
    TUniquePtr() : Ptr(nullptr) {}
    TUniquePtr(decltype(nullptr)) : Ptr(nullptr) {}
    explicit TUniquePtr(T* InPtr) : Ptr(InPtr) {}
    TUniquePtr(const TUniquePtr&) = delete;
    TUniquePtr& operator=(const TUniquePtr&) = delete;
    TUniquePtr(TUniquePtr&& Other) : Ptr(Other.Ptr) { Other.Ptr = nullptr; }
    TUniquePtr& operator=(TUniquePtr&& Other) {
        if (this != &Other) { T* Old = Ptr; Ptr = Other.Ptr; Other.Ptr = nullptr; GetDeleter()(Old); }
        return *this;
    }
    ~TUniquePtr() { GetDeleter()(Ptr); }
    bool IsValid() const { return Ptr != nullptr; }
    explicit operator bool() const { return IsValid(); }
    T* operator->() const { return Ptr; }
    T& operator*() const { return *Ptr; }
    T* Get() const { return Ptr; }
    void Reset(T* InPtr = nullptr) { if (Ptr != InPtr) { T* Old = Ptr; Ptr = InPtr; GetDeleter()(Old); } }
    Deleter& GetDeleter() { return static_cast<Deleter&>(*this); }
private:
    T* Ptr;
};
template <class T, class... A> TUniquePtr<T> MakeUnique(A&&... a) { return TUniquePtr<T>(new T(std::forward<A>(a)...)); }
