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
		PrivateDependencyModuleNames.Add("Projects");  // IPluginManager: the plugin's folder at run time

		// The shipped bridge (make dist's PyInstaller folder, copied by stage_bridge.sh) lives in
		// <Plugin>/Binaries/ThirdParty/OamBridge/<Platform>/: oam-bridge[.exe] and _internal/.
		// Every file is staged as NonUFS (outside the .pak: an executable cannot run from it), at
		// the same path under the packaged game, where UOamBridgeSubsystem::FindShippedBridge looks.
		// Desktop only: consoles, mobile and the web cannot start a subprocess.
		string BridgePlatform = null;
		if (Target.Platform == UnrealTargetPlatform.Win64) BridgePlatform = "Win64";
		else if (Target.Platform == UnrealTargetPlatform.Mac) BridgePlatform = "Mac";
		else if (Target.Platform == UnrealTargetPlatform.Linux) BridgePlatform = "Linux";
		// Not LinuxArm64: OamBridge.uplugin allows Win64, Linux and Mac, the platforms make dist
		// builds for (its llama.cpp wheel is x86-64 on Linux).
		if (BridgePlatform != null)
		{
			string BridgeDir = Path.Combine(PluginDirectory, "Binaries", "ThirdParty", "OamBridge", BridgePlatform);
			if (Directory.Exists(BridgeDir))
			{
				foreach (string File in Directory.EnumerateFiles(BridgeDir, "*", SearchOption.AllDirectories))
				{
					string Relative = File.Substring(PluginDirectory.Length).TrimStart('/', '\\').Replace('\\', '/');
					RuntimeDependencies.Add("$(PluginDir)/" + Relative, StagedFileType.NonUFS);
				}
			}
			else
			{
				System.Console.WriteLine("OamBridge: no bridge in " + BridgeDir + ": a packaged game will not find one (run stage_bridge.sh, see the plugin's README)");
			}
		}
	}
}
