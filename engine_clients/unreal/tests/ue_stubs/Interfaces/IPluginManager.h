#pragma once
#include "CoreMinimal.h"
// IPlugin / IPluginManager (module "Projects", Interfaces/IPluginManager.h). Stub: one plugin,
// OamBridge, whose base directory is $OAM_STUB_PLUGIN_DIR.
class IPlugin {
public:
    virtual ~IPlugin() = default;
    virtual FString GetBaseDir() const = 0;
};
class IPluginManager {
public:
    virtual ~IPluginManager() = default;
    static IPluginManager& Get();
    virtual TSharedPtr<IPlugin> FindPlugin(const FString& Name) = 0;  // Unreal 5.1+: FStringView
};
class FUEStubPlugin : public IPlugin {
public:
    FString GetBaseDir() const override { const char* D = std::getenv("OAM_STUB_PLUGIN_DIR"); return FString(D ? D : ""); }
};
class FUEStubPluginManager : public IPluginManager {
public:
    TSharedPtr<IPlugin> FindPlugin(const FString& Name) override {
        if (Name == FString("OamBridge") && std::getenv("OAM_STUB_PLUGIN_DIR")) return MakeShared<FUEStubPlugin>();
        return nullptr;
    }
};
inline IPluginManager& IPluginManager::Get() { static FUEStubPluginManager M; return M; }
