// OamBridge.Build.cs
using System.IO;
using UnrealBuildTool;

public class OamBridge : ModuleRules
{
	public OamBridge(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.UseExplicitOrSharedPCHs;
		// The engine-agnostic core (Core/) uses C++ exceptions (std::future, nlohmann::json).
		bEnableExceptions = true;
		// Keep the core's .cpp files (and windows.h in oam_process.cpp) out of unity blobs.
		bUseUnity = false;

		PublicIncludePaths.Add(Path.Combine(ModuleDirectory, "Core"));

		// nlohmann/json (single header, MIT): put json.hpp at
		// <Plugin>/ThirdParty/nlohmann/include/nlohmann/json.hpp (it is not vendored here).
		string NlohmannInclude = Path.Combine(PluginDirectory, "ThirdParty", "nlohmann", "include");
		if (Directory.Exists(NlohmannInclude))
		{
			PublicSystemIncludePaths.Add(NlohmannInclude);
		}

		PublicDependencyModuleNames.AddRange(new string[] { "Core", "CoreUObject", "Engine" });
	}
}
