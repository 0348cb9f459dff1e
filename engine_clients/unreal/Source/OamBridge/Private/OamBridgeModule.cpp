// OamBridgeModule.cpp
#include "Modules/ModuleManager.h"
#include "OamBridgeSubsystem.h"

DEFINE_LOG_CATEGORY(LogOamBridge);

IMPLEMENT_MODULE(FDefaultModuleImpl, OamBridge)
